"""Factories: arange, full/zeros/ones (+ ``_like``, ``new_*``), eye, linspace, logspace, ...

Factories receive ``dtype``/``layout``/``device``/``pin_memory``; the core places the result on
the requested device, so a lowering only builds an array of PyTorch's dtype. ``empty`` and
``empty_strided`` belong to the core (``torchlax.transfer``).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torchlax_core import check_sizes, jax_dtype

from .. import _aten
from .._promotion import opmath_dtype
from .._table import lowering

aten = _aten.aten  # (an op this torch lacks: a Missing, skipped)


def _default_float():
    return jax_dtype(torch.get_default_dtype())


def _default_complex():
    return jax_dtype(
        torch.complex128 if torch.get_default_dtype() == torch.float64 else torch.complex64
    )


def scalar_dtype(value, dtype=None):
    """PyTorch's dtype for a tensor built from a Python scalar (``torch.full``'s inference)."""
    if dtype is not None:
        return jax_dtype(dtype)
    if isinstance(value, bool):
        return jnp.dtype(jnp.bool_)
    if isinstance(value, int):
        return jnp.dtype(jnp.int64)
    if isinstance(value, complex):
        return _default_complex()
    return _default_float()


def _like_dtype(self, dtype):
    return self.dtype if dtype is None else jax_dtype(dtype)


def _fill(shape, value, dtype):
    dtype = jnp.dtype(dtype)
    check_sizes(shape, dtype.itemsize)  # before XLA, which aborts on an overflowing shape
    if isinstance(value, int | float) and not isinstance(value, bool):
        _check_fits(value, dtype)
    return jnp.full(tuple(shape), value, dtype=dtype)


# The C++ type names PyTorch's overflow message uses.
_C_TYPES = {
    "int8": "int8_t",
    "int16": "int16_t",
    "int32": "int",
    "int64": "int64_t",
    "uint8": "uint8_t",
    "uint16": "uint16_t",
    "uint32": "uint32_t",
    "uint64": "uint64_t",
    "float32": "float",
}


def _check_fits(value, dtype) -> None:
    """PyTorch's check of a Python fill value against the tensor's dtype (c10's ``overflows``):
    NaN, infinity or a value out of range does not fit an integer type (negative integers wrap
    into unsigned types, as in two's complement); a finite value past float32's range does not
    fit float32. Half types and float64 take anything (infinity)."""
    if dtype.name not in _C_TYPES:
        return
    if jnp.issubdtype(dtype, jnp.integer):
        info = jnp.iinfo(dtype)
        if isinstance(value, float):
            fits = math.isfinite(value) and info.min <= value <= info.max
        elif info.min == 0:
            fits = value <= info.max and -value <= info.max
        else:
            fits = info.min <= value <= info.max
    else:
        fits = not math.isfinite(value) or abs(value) <= float(jnp.finfo(dtype).max)
    if not fits:
        raise RuntimeError(
            f"value cannot be converted to type {_C_TYPES[dtype.name]} without overflow"
        )


# -- arange ---------------------------------------------------------------------------------


def _arange_length(start, end, step, integral: bool) -> int:
    if step == 0:
        raise RuntimeError("aten.arange: step must be nonzero.")
    if integral:
        # Integer arithmetic with C's truncating division, as PyTorch's int64 path.
        sign = (step > 0) - (step < 0)
        numerator = end - start + step - sign
        length = abs(numerator) // abs(step) * (1 if (numerator >= 0) == (step > 0) else -1)
    else:
        length = math.ceil((float(end) - float(start)) / float(step))
    if length < 0:
        raise RuntimeError(
            f"aten.arange: upper bound and lower bound inconsistent with step sign "
            f"(start={start}, end={end}, step={step})."
        )
    return int(length)


@lowering(aten.arange.default)
def arange(end, *, dtype=None, layout=None, device=None, pin_memory=None):
    return arange_start_step(0, end, 1, dtype=dtype)


@lowering(aten.arange.start)
def arange_start(start, end, *, dtype=None, layout=None, device=None, pin_memory=None):
    return arange_start_step(start, end, 1, dtype=dtype)


@lowering(aten.arange.start_step)
def arange_start_step(start, end, step=1, *, dtype=None, layout=None, device=None, pin_memory=None):
    values = (start, end, step)
    if dtype is None:
        floating = any(isinstance(v, float) for v in values)
        out_dtype = _default_float() if floating else jnp.dtype(jnp.int64)
    else:
        out_dtype = jax_dtype(dtype)
    integral = jnp.issubdtype(out_dtype, jnp.integer)
    if (
        integral
        and any(not isinstance(v, int | float | np.generic) for v in values)
        and isinstance(step, int)
        and step > 0
    ):
        # A symbolic bound (a dim of jax.export's shape polymorphism): the length stays an
        # expression of dims, so no int() and no sign checks on it.
        length = (end - start + step - 1) // step
        return (start + step * jax.lax.iota(jnp.int64, length)).astype(out_dtype)
    if integral:
        # PyTorch converts the bounds to the integer type first (truncating).
        start, end, step = (int(v) for v in values)
    length = _arange_length(start, end, step, integral)
    if integral:
        return (start + step * jnp.arange(length, dtype=jnp.int64)).astype(out_dtype)
    # Values are start + i * step in double precision (CPU's accumulate type), then rounded.
    iota = jnp.arange(length, dtype=jnp.float64)
    return (float(start) + float(step) * iota).astype(out_dtype)


# The out= overloads (arange.out, range.out, zeros.out, ...) are derived by the core, which takes
# the dtype from ``out`` and resizes it.


@lowering(aten.range.step, aten.range.default)
def range_step(start, end, step=1, *, dtype=None, layout=None, device=None, pin_memory=None):
    """The deprecated ``torch.range``: ``end`` included, in the default dtype unless given."""
    out_dtype = _default_float() if dtype is None else jax_dtype(dtype)
    if jnp.issubdtype(out_dtype, jnp.integer):
        start, end, step = int(start), int(end), int(step)
    if step == 0:
        raise RuntimeError("aten.range: step must be nonzero.")
    if (step > 0 and end < start) or (step < 0 and end > start):
        raise RuntimeError(
            f"aten.range: upper bound and lower bound inconsistent with step sign "
            f"(start={start}, end={end}, step={step})."
        )
    length = math.floor((float(end) - float(start)) / float(step)) + 1
    iota = jnp.arange(length, dtype=jnp.float64)
    return (float(start) + float(step) * iota).astype(out_dtype)


# -- full, zeros, ones and their _like / new_ forms -----------------------------------------


@lowering(aten.full.default)
def full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _fill(size, fill_value, scalar_dtype(fill_value, dtype))


@lowering(aten.zeros.default)
def zeros(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _fill(size, 0, jax_dtype(dtype) if dtype is not None else _default_float())


@lowering(aten.ones.default)
def ones(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _fill(size, 1, jax_dtype(dtype) if dtype is not None else _default_float())


@lowering(aten.scalar_tensor.default)
def scalar_tensor(s, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _fill((), s, jax_dtype(dtype) if dtype is not None else _default_float())


@lowering(aten.full_like.default)
def full_like(
    self, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None
):
    return _fill(self.shape, fill_value, _like_dtype(self, dtype))


@lowering(aten.zeros_like.default, aten.empty_like.default)
def zeros_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    # XLA has no uninitialised memory: empty_like is zeros_like.
    return _fill(self.shape, 0, _like_dtype(self, dtype))


@lowering(aten.ones_like.default)
def ones_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _fill(self.shape, 1, _like_dtype(self, dtype))


@lowering(aten.new_full.default)
def new_full(self, size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _fill(size, fill_value, _like_dtype(self, dtype))


@lowering(aten.new_zeros.default, aten.new_empty.default)
def new_zeros(self, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _fill(size, 0, _like_dtype(self, dtype))


@lowering(aten.new_empty_strided.default)
def new_empty_strided(self, size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _fill(size, 0, _like_dtype(self, dtype))


@lowering(aten.new_ones.default)
def new_ones(self, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _fill(size, 1, _like_dtype(self, dtype))


# -- structured factories ---------------------------------------------------------------------


@lowering(aten.eye.default)
def eye(n, *, dtype=None, layout=None, device=None, pin_memory=None):
    return eye_m(n, n, dtype=dtype)


@lowering(aten.eye.m)
def eye_m(n, m, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.eye(n, m, dtype=jax_dtype(dtype) if dtype is not None else _default_float())


def _linspace_dtype(values, dtype):
    if dtype is not None:
        return jax_dtype(dtype)
    if any(isinstance(v, complex) or jnp.iscomplexobj(v) for v in values):
        return _default_complex()
    return _default_float()


def _scalar(x):
    """A bound as PyTorch reads it: linspace.Tensor_* overloads pass 0-d arrays, whose value
    counts as a double (or complex double); they stay arrays, so they may be traced."""
    if not hasattr(x, "dtype"):
        return x
    if x.ndim != 0:
        raise RuntimeError(
            f"linspace only supports 0-dimensional start and end tensors, but "
            f"got a tensor with {x.ndim} dimensions."
        )
    return x.astype(jnp.complex128 if jnp.iscomplexobj(x) else jnp.float64)


@lowering(
    aten.linspace.default,
    aten.linspace.Tensor_Tensor,
    aten.linspace.Tensor_Scalar,
    aten.linspace.Scalar_Tensor,
)
def linspace(start, end, steps, *, dtype=None, layout=None, device=None, pin_memory=None):
    start, end = _scalar(start), _scalar(end)
    out_dtype = _linspace_dtype((start, end), dtype)
    if steps < 0:
        raise RuntimeError("aten.linspace: number of steps must be non-negative.")
    if steps == 0:
        return jnp.zeros((0,), out_dtype)
    if steps == 1:
        return jnp.full((1,), start, out_dtype)
    # As PyTorch: the first half counts up from start, the second down from end, so both
    # endpoints are exact. Integer outputs are computed in float64, then truncated.
    # (A factory has no half-precision argument to declare opmath on: the dtype= decides.)
    inexact = out_dtype if jnp.issubdtype(out_dtype, jnp.inexact) else jnp.dtype(jnp.float64)
    compute = opmath_dtype(inexact)
    if compute != out_dtype and not jnp.issubdtype(out_dtype, jnp.inexact):
        # ATen casts the bounds to the integer output type before stepping between them.
        start, end = (jnp.trunc(jnp.asarray(b, compute)) for b in (start, end))
    start, end = jnp.asarray(start, compute), jnp.asarray(end, compute)
    step = (end - start) / (steps - 1)
    i = jnp.arange(steps, dtype=jnp.int64)
    up = start + step * i.astype(compute)
    down = end - step * (steps - 1 - i).astype(compute)
    return jnp.where(i < steps / 2, up, down).astype(out_dtype)


@lowering(
    aten.logspace.default,
    aten.logspace.Tensor_Tensor,
    aten.logspace.Tensor_Scalar,
    aten.logspace.Scalar_Tensor,
)
def logspace(
    start, end, steps, base=10.0, *, dtype=None, layout=None, device=None, pin_memory=None
):
    start, end = _scalar(start), _scalar(end)
    out_dtype = _linspace_dtype((start, end), dtype)
    exponents = linspace(start, end, steps, dtype=torch.float64)
    return jnp.power(jnp.float64(base), exponents).astype(out_dtype)


def _triangle_indices(row, col, offset, dtype, lower: bool):
    # Shapes depend only on Python ints, so numpy builds them at trace time.
    rows, cols = (np.tril_indices if lower else np.triu_indices)(row, offset, col)
    return jnp.asarray(np.stack([rows, cols]), dtype=jax_dtype(dtype) if dtype else jnp.int64)


@lowering(aten.tril_indices.default)
def tril_indices(
    row, col, offset=0, *, dtype=torch.long, layout=None, device=None, pin_memory=None
):
    return _triangle_indices(row, col, offset, dtype, lower=True)


@lowering(aten.triu_indices.default)
def triu_indices(
    row, col, offset=0, *, dtype=torch.long, layout=None, device=None, pin_memory=None
):
    return _triangle_indices(row, col, offset, dtype, lower=False)
