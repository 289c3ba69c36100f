"""PyTorch's type promotion for lowerings, declared with a decorator.

jnp promotes differently (weak types, int64 + float32 -> float64 under x64, ...). A lowering
declares which arguments take part and which of PyTorch's promotion kinds applies; the
decorator casts those arguments to the computation dtype and the result to PyTorch's result
dtype. Results are cached per (kind, argument dtypes/ranks, default dtype), so the hot path is
a dict lookup.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as Promotion
from torch._prims_common import elementwise_dtypes
from torchlax_core import jax_dtype, torch_dtype

__all__ = ["Promotion", "elementwise", "result_dtypes", "to_jax_dtype"]

_cache: dict[tuple, tuple[np.dtype, np.dtype]] = {}
_ArrayImpl = type(jnp.zeros(()))
_placeholders: dict[tuple, torch.Tensor] = {}
_default_dtype = torch.get_default_dtype


def _signature(x):
    if isinstance(x, jax.Array | np.ndarray):
        return (x.dtype, x.ndim > 0)
    if isinstance(x, bool | int | float | complex):
        return type(x)
    if isinstance(x, np.generic):
        return (x.dtype, False)
    return None


def _placeholder(sig):
    if isinstance(sig, type):
        return sig(1)
    dtype, has_dims = sig
    key = (dtype, has_dims)
    t = _placeholders.get(key)
    if t is None:
        t = torch.empty((1,) if has_dims else (), dtype=torch_dtype(dtype), device="meta")
        _placeholders[key] = t
    return t


def result_dtypes(values: Sequence, kind: Promotion) -> tuple[np.dtype, np.dtype]:
    """(computation dtype, result dtype) as PyTorch computes them, as JAX dtypes."""
    sigs = tuple(s for s in map(_signature, values) if s is not None)
    # The default dtype takes part (int tensor * 1.5, int / int): torch.set_default_dtype must
    # not be answered from a cache filled under the previous default.
    key = (kind, sigs, _default_dtype())
    hit = _cache.get(key)
    if hit is None:
        compute, result = elementwise_dtypes(*map(_placeholder, sigs), type_promotion_kind=kind)
        hit = (jax_dtype(compute), jax_dtype(result))
        _cache[key] = hit
    return hit


def to_jax_dtype(dtype: torch.dtype | None):
    return None if dtype is None else jax_dtype(dtype)


def _cast(x, dtype):
    if isinstance(x, jax.Array | np.ndarray | np.generic):
        return x if x.dtype == dtype else x.astype(dtype)
    if isinstance(x, int) and not isinstance(x, bool) and jnp.issubdtype(dtype, jnp.integer):
        # Wrapped into the integer type as C casts it (uint8 + 1000 adds 232), as PyTorch does.
        return jnp.asarray(np.asarray(x, dtype=np.int64).astype(dtype))
    if isinstance(x, bool | int | float | complex):
        # A Python scalar joins the computation dtype exactly (no weak-type surprises).
        return jnp.asarray(x, dtype=dtype)
    return x


def elementwise(
    args: Sequence[str], kind: Promotion = Promotion.DEFAULT, *, cast_result: bool = True
) -> Callable[[Callable], Callable]:
    """Promote the named arguments as PyTorch does for ``kind``.

    The wrapped lowering sees them cast to the computation dtype (PyTorch's "opmath" dtype:
    float32 for half-precision inputs) and its result is cast to the result dtype.
    """

    def decorate(fn: Callable) -> Callable:
        params = list(inspect.signature(fn).parameters)
        positions = [params.index(a) for a in args]
        names = tuple(args)

        pairs = tuple(zip(positions, names, strict=True))
        # Per lowering: (dtype, has-dims) of each promoted array -> (compute, result). The hot
        # path is then one tuple and one dict lookup for the common all-arrays call.
        fast_cache: dict[tuple, tuple[np.dtype, np.dtype]] = {}

        @functools.wraps(fn)
        def promoted(*call_args, **call_kwargs):
            n_args = len(call_args)
            values = [call_args[p] if p < n_args else call_kwargs.get(n) for p, n in pairs]
            if all(type(v) is _ArrayImpl for v in values):
                key = (_default_dtype(), *((v.dtype, v.ndim != 0) for v in values))  # pyright: ignore[reportOptionalMemberAccess]  (all arrays: checked on the line above)
                hit = fast_cache.get(key)
                if hit is None:
                    hit = fast_cache[key] = result_dtypes(values, kind)
                compute, result = hit
            else:
                compute, result = result_dtypes(values, kind)
            call_args = list(call_args)
            for (p, n), v in zip(pairs, values, strict=True):
                # (not getattr(v, "dtype", None) == compute: numpy reads None as float64)
                if isinstance(v, jax.Array) and v.dtype == compute:
                    continue
                if p < n_args:
                    call_args[p] = _cast(v, compute)
                elif n in call_kwargs:
                    call_kwargs[n] = _cast(v, compute)
            out = fn(*call_args, **call_kwargs)
            if cast_result and isinstance(out, jax.Array) and out.dtype != result:
                out = out.astype(result)
            return out

        promoted.promotion = (names, kind)  # pyright: ignore[reportAttributeAccessIssue]  (a marker attribute on the wrapper)
        return promoted

    return decorate
