"""A new op, defined the PyTorch way; it runs on CPU/CUDA tensors without torchlax."""

from __future__ import annotations

import torch


@torch.library.custom_op("example::scaled_swish", mutates_args=())
def scaled_swish(x: torch.Tensor, beta: float) -> torch.Tensor:
    """``x * sigmoid(beta * x)``."""
    return x * torch.sigmoid(beta * x)


@scaled_swish.register_fake
def _(x, beta):
    return torch.empty_like(x)


def _backward(ctx, grad):
    (x,) = ctx.saved_tensors
    s = torch.sigmoid(ctx.beta * x)
    return grad * (s + ctx.beta * x * s * (1 - s)), None


def _setup_context(ctx, inputs, output):
    x, beta = inputs
    ctx.save_for_backward(x)
    ctx.beta = beta


scaled_swish.register_autograd(_backward, setup_context=_setup_context)
