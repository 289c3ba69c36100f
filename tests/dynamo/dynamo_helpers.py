"""Helpers shared by the torch.compile backend tests."""

import copy

import torch
import torchlax_core


def to_jax(value):
    """A torchlax copy of a tensor or module (inputs for the torchlax-Tensor variant)."""
    with torchlax_core.enable():
        if isinstance(value, torch.nn.Module):
            return copy.deepcopy(value).to("jax")
        return value.detach().to("jax").requires_grad_(value.requires_grad)


def to_cpu(value):
    if isinstance(value, torchlax_core.Tensor):
        return value.detach().cpu()
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, tuple | list):
        return type(value)(to_cpu(v) for v in value)
    return value


def assert_same(actual, expected, *, rtol=1.3e-6, atol=1e-5):
    """Values, dtype and shape as eager PyTorch gives them."""
    torch.testing.assert_close(to_cpu(actual), to_cpu(expected), rtol=rtol, atol=atol)
