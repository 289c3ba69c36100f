"""Helpers shared by the lowering families: opmath up-casting, ``jax.vjp`` backward, tuples."""

from __future__ import annotations

import jax

from .._promotion import HALF as _HALF
from .._promotion import opmath_dtype
from .._promotion import up as _up

__all__ = ["HIGHEST", "_HALF", "_dtype_of", "_ntuple", "_up", "_vjp", "opmath_dtype"]

HIGHEST = jax.lax.Precision.HIGHEST


def _vjp(forward, x, grad_output):
    """The gradient of ``forward`` at ``x`` for ``grad_output``, in x's dtype."""
    out, pull = jax.vjp(forward, _up(x))
    return pull(_up(grad_output).astype(out.dtype))[0].astype(x.dtype)


def _ntuple(value, n):
    if isinstance(value, int):
        return (value,) * n
    value = tuple(value)
    return value * n if len(value) == 1 else value


def _dtype_of(torch_dtype):
    from torchlax_core import jax_dtype

    return jax_dtype(torch_dtype)
