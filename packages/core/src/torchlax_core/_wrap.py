"""Between ``jax.Array`` and ``torchlax.Tensor``: no copies, the array is shared."""

from __future__ import annotations

import jax
import torch

from ._tensor import Tensor


def wrap(array: jax.Array, *, requires_grad: bool = False) -> Tensor:
    """A torchlax Tensor holding ``array`` (not copied; JAX arrays are immutable)."""
    if isinstance(array, Tensor):
        return array
    if not isinstance(array, jax.Array):
        raise TypeError(
            f"torchlax.wrap expects a jax.Array, got {type(array).__name__}. For a torch.Tensor "
            "use torchlax.from_torch(tensor); for a NumPy array, jax.numpy.asarray(array) first."
        )
    return Tensor(array, requires_grad=requires_grad)


def unwrap(tensor: torch.Tensor) -> jax.Array:
    """The ``jax.Array`` a torchlax Tensor holds (same as ``tensor.jax()``)."""
    if not isinstance(tensor, Tensor):
        raise TypeError(f"torchlax.unwrap expects a torchlax.Tensor, got {type(tensor).__name__}.")
    return tensor._value()
