"""Helpers shared by the lowering families: ``jax.vjp`` backward, tuples, dtypes.

Half precision computed in float32 is declared in a lowering's stanza (``opmath=True``), not
written here: ``_promotion`` holds its one definition.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["HIGHEST", "_dtype_of", "_ntuple", "_scalar_name", "_vjp"]

HIGHEST = jax.lax.Precision.HIGHEST


def _vjp(forward, x, grad_output):
    """The gradient of ``forward`` at ``x`` for ``grad_output``, in x's dtype (a lowering using
    it declares ``opmath=True`` to compute half precision in float32)."""
    out, pull = jax.vjp(forward, x)
    return pull(grad_output.astype(out.dtype))[0].astype(x.dtype)


def _ntuple(value, n):
    if isinstance(value, int):
        return (value,) * n
    value = tuple(value)
    return value * n if len(value) == 1 else value


def _dtype_of(torch_dtype):
    from torchlax_core import jax_dtype

    return jax_dtype(torch_dtype)


# How PyTorch's error messages name dtypes (c10's ScalarType names).
_SCALAR_NAMES = {
    "bool": "Bool",
    "uint8": "Byte",
    "int8": "Char",
    "int16": "Short",
    "int32": "Int",
    "int64": "Long",
    "float16": "Half",
    "bfloat16": "BFloat16",
    "float32": "Float",
    "float64": "Double",
    "complex64": "ComplexFloat",
    "complex128": "ComplexDouble",
}


def _scalar_name(x) -> str:
    """PyTorch's name of ``x``'s dtype (``'ComplexFloat'``), ``x`` an array or a dtype."""
    name = jnp.dtype(getattr(x, "dtype", x)).name
    return _SCALAR_NAMES.get(name, name)
