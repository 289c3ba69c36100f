"""Helpers of the eager-semantics tests: the same code runs on CPU tensors and on torchlax Tensors."""

from __future__ import annotations

import torch
import torchlax_core


def to_jax(t: torch.Tensor) -> torchlax_core.Tensor:
    """A torchlax copy of CPU tensor ``t`` (same dtype, shape, values, requires_grad)."""
    with torchlax_core.enable():
        out = t.detach().to("jax")
    return out.requires_grad_(t.requires_grad) if t.is_floating_point() else out


def assert_same(actual: torch.Tensor, expected: torch.Tensor, *, atol=1e-6, rtol=1e-5) -> None:
    """``actual`` (a torchlax Tensor) equals ``expected`` (a CPU tensor): values, dtype, shape."""
    assert isinstance(actual, torchlax_core.Tensor), (
        f"expected a torchlax Tensor, got {type(actual)}"
    )
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    torch.testing.assert_close(actual.detach().cpu(), expected.detach(), atol=atol, rtol=rtol)
