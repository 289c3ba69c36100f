"""Helpers shared by the lowering families: opmath up-casting, ``jax.vjp`` backward, tuples."""

from __future__ import annotations

import jax
import jax.numpy as jnp

HIGHEST = jax.lax.Precision.HIGHEST
_HALF = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))


def _up(x):
    """x in PyTorch's opmath dtype: float32 for half precision, else unchanged."""
    return x.astype(jnp.float32) if x.dtype in _HALF else x


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
