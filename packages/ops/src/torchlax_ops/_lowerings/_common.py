"""Helpers shared by the lowering families: ``jax.vjp`` backward, tuples, dtypes.

Half precision computed in float32 is declared in a lowering's stanza (``opmath=True``), not
written here: ``_promotion`` holds its one definition.
"""

from __future__ import annotations

import jax
from torchlax_core.internal import scalar_type_name

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


# How PyTorch's error messages name dtypes (``'ComplexFloat'``), ``x`` an array or a dtype: the
# core's one map.
_scalar_name = scalar_type_name
