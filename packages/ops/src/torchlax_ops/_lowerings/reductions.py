"""Reductions and scans: sum, mean, prod, max/min, var/std, norms, cumulative ops, median, mode.

PyTorch's rules kept here: ``dim=None`` or ``[]`` reduces every dimension; integer and bool sums
and products are int64; ``mean``/``var`` need a floating input; a max/min over an empty
dimension raises; low-precision floats accumulate in float32 and round once at the end.
"""

from __future__ import annotations

import functools

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from .. import _aten
from .._promotion import opmath_dtype, to_jax_dtype
from .._table import decomposition, lowering

aten = _aten.aten  # (an op this torch lacks: a Missing, skipped)


def _dims(x, dim) -> tuple[int, ...]:
    """Normalised reduction axes; ``None`` and ``[]`` mean all (a 0-d tensor has none)."""
    if dim is None or (isinstance(dim, list | tuple) and len(dim) == 0):
        return tuple(range(x.ndim))
    if isinstance(dim, int):
        dim = (dim,)
    rank = max(x.ndim, 1)
    axes = []
    for d in dim:
        if not -rank <= d < rank:
            raise IndexError(
                f"Dimension out of range (expected to be in range of [{-rank}, {rank - 1}], "
                f"but got {d})"
            )
        axes.append(d % rank)
    return tuple(a for a in axes if a < x.ndim)


def _is_int(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_


def _accumulate_dtype(x, dtype):
    """The dtype a sum/prod accumulates in and returns: int64 for integers and bools."""
    if dtype is not None:
        return to_jax_dtype(dtype)
    return jnp.dtype(jnp.int64) if _is_int(x) else x.dtype


def _require_float(x, op: str, dtype=None):
    target = to_jax_dtype(dtype) if dtype is not None else x.dtype
    if not jnp.issubdtype(target, jnp.inexact):  # pyright: ignore[reportArgumentType]  (dtype is not None here, so neither is its jax dtype)
        name = str(torch_dtype_of(target)).removeprefix("torch.").capitalize()
        raise RuntimeError(
            f"{op}(): could not infer output dtype. Input dtype must be either a floating point "
            f"or complex dtype. Got: {name}"
        )
    return target


def torch_dtype_of(jax_dtype):
    from torchlax_core import torch_dtype

    return torch_dtype(jax_dtype)


def _require_nonempty(x, axes, op: str):
    for a in axes:
        if x.shape[a] == 0:
            raise IndexError(f"{op}(): Expected reduction dim {a} to have non-zero size.")
    if not axes and x.size == 0:
        raise RuntimeError(
            f"{op}(): Expected reduction dim to be specified for input.numel() == 0. Specify "
            "the reduction dim with the 'dim' argument."
        )


# -- sums and products --------------------------------------------------------------------------


def _sum(x, dim, keepdim, dtype):
    out = _accumulate_dtype(x, dtype)
    acc = opmath_dtype(out)
    return jnp.sum(x.astype(acc), axis=_dims(x, dim), keepdims=keepdim).astype(out)


@lowering(aten.sum.default)
def sum_(self, *, dtype=None):
    return _sum(self, None, False, dtype)


@lowering(aten.sum.dim_IntList)
def sum_dim(self, dim, keepdim=False, *, dtype=None):
    return _sum(self, dim, keepdim, dtype)


@lowering(aten.nansum.default)
def nansum(self, dim=None, keepdim=False, *, dtype=None):
    x = self if _is_int(self) else jnp.where(jnp.isnan(self), jnp.zeros_like(self), self)
    return _sum(x, dim, keepdim, dtype)


def _mean(x, dim, keepdim, dtype):
    out = _require_float(x, "mean", dtype)
    acc = opmath_dtype(out)
    return jnp.mean(x.astype(acc), axis=_dims(x, dim), keepdims=keepdim).astype(out)


@lowering(aten.mean.default)
def mean(self, *, dtype=None):
    return _mean(self, None, False, dtype)


@lowering(aten.mean.dim)
def mean_dim(self, dim, keepdim=False, *, dtype=None):
    return _mean(self, dim, keepdim, dtype)


def _prod(x, dim, keepdim, dtype):
    out = _accumulate_dtype(x, dtype)
    acc = opmath_dtype(out)
    return jnp.prod(x.astype(acc), axis=_dims(x, dim), keepdims=keepdim).astype(out)


@lowering(aten.prod.default)
def prod(self, *, dtype=None):
    return _prod(self, None, False, dtype)


@lowering(aten.prod.dim_int)
def prod_dim(self, dim, keepdim=False, *, dtype=None):
    return _prod(self, dim, keepdim, dtype)


@lowering(aten.count_nonzero.dim_IntList)
def count_nonzero(self, dim):
    return jnp.sum(self != 0, axis=_dims(self, dim), dtype=jnp.int64)


@lowering(aten.count_nonzero.default)
def count_nonzero_default(self, dim=None):
    return jnp.sum(self != 0, axis=_dims(self, dim), dtype=jnp.int64)


# -- max, min and friends -----------------------------------------------------------------------


@lowering(aten.amax.default)
def amax(self, dim=(), keepdim=False):
    axes = _dims(self, dim)
    _require_nonempty(self, axes, "amax")
    return jnp.max(self, axis=axes, keepdims=keepdim)


@lowering(aten.amin.default)
def amin(self, dim=(), keepdim=False):
    axes = _dims(self, dim)
    _require_nonempty(self, axes, "amin")
    return jnp.min(self, axis=axes, keepdims=keepdim)


def _full_reduce_nonempty(x, op):
    if x.size == 0:
        raise RuntimeError(
            f"{op}(): Expected reduction dim to be specified for input.numel() == 0. Specify "
            "the reduction dim with the 'dim' argument."
        )


@lowering(aten.max.default)
def max_(self):
    _full_reduce_nonempty(self, "max")
    return jnp.max(self)


@lowering(aten.min.default)
def min_(self):
    _full_reduce_nonempty(self, "min")
    return jnp.min(self)


def _arg_extreme(x, axis, keepdims, largest: bool):
    """Index of the first max (min); a NaN counts as the extreme, as in PyTorch."""
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.int8)
    fn = jnp.argmax if largest else jnp.argmin
    if x.ndim == 0:
        return jnp.zeros((), jnp.int64)
    if x.size == 0:  # an empty batch (the reduced dim itself is checked non-empty): jnp refuses
        shape = list(x.shape)
        shape[axis] = 1
        return jnp.zeros(shape if keepdims else shape[:axis] + shape[axis + 1 :], jnp.int64)
    return fn(x, axis=axis, keepdims=keepdims).astype(jnp.int64)


def _max_min_dim(x, dim, keepdim, largest: bool, op: str):
    axis = _dims(x, dim)
    _require_nonempty(x, axis, op)
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    (axis,) = axis
    values = (jnp.max if largest else jnp.min)(x, axis=axis, keepdims=keepdim)
    return values, _arg_extreme(x, axis, keepdim, largest)


@lowering(aten.max.dim)
def max_dim(self, dim, keepdim=False):
    return _max_min_dim(self, dim, keepdim, True, "max")


@lowering(aten.min.dim)
def min_dim(self, dim, keepdim=False):
    return _max_min_dim(self, dim, keepdim, False, "min")


def _argmax_argmin(x, dim, keepdim, largest: bool, op: str):
    if dim is None:
        _full_reduce_nonempty(x, op)
        index = _arg_extreme(x.reshape(-1), 0, False, largest)
        return index.reshape((1,) * x.ndim) if keepdim else index
    axes = _dims(x, dim)
    _require_nonempty(x, axes, op)
    if x.ndim == 0:
        return jnp.zeros((), jnp.int64)
    return _arg_extreme(x, axes[0], keepdim, largest)


@lowering(aten.argmax.default)
def argmax(self, dim=None, keepdim=False):
    return _argmax_argmin(self, dim, keepdim, True, "argmax")


@lowering(aten.argmin.default)
def argmin(self, dim=None, keepdim=False):
    return _argmax_argmin(self, dim, keepdim, False, "argmin")


@lowering(aten.aminmax.default)
def aminmax(self, *, dim=None, keepdim=False):
    axes = _dims(self, dim)
    _require_nonempty(self, axes, "aminmax")
    if dim is None and keepdim:
        axes = tuple(range(self.ndim))
    return (jnp.min(self, axis=axes, keepdims=keepdim), jnp.max(self, axis=axes, keepdims=keepdim))


# -- logical reductions -------------------------------------------------------------------------


def _logical(x, dim, keepdim, fn):
    out = fn(x != 0, axis=_dims(x, dim), keepdims=keepdim)
    return out.astype(jnp.uint8) if x.dtype == jnp.uint8 else out


@lowering(aten.all.default)
def all_(self):
    return _logical(self, None, False, jnp.all)


@lowering(aten.all.dim, aten.all.dims)
def all_dim(self, dim=None, keepdim=False):
    return _logical(self, dim, keepdim, jnp.all)


@lowering(aten.any.default)
def any_(self):
    return _logical(self, None, False, jnp.any)


@lowering(aten.any.dim, aten.any.dims)
def any_dim(self, dim=None, keepdim=False):
    return _logical(self, dim, keepdim, jnp.any)


# -- variance and standard deviation ------------------------------------------------------------


def _var(x, dim, correction, keepdim, op="var"):
    _require_float(x, op)
    out = x.dtype
    axes = _dims(x, dim)
    n = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    correction = 1 if correction is None else correction
    mean = jnp.mean(x, axis=axes, keepdims=True)
    squares = jnp.sum(jnp.square(jnp.abs(x - mean)), axis=axes, keepdims=keepdim)
    var = squares / max(n - correction, 0)
    return var, jnp.mean(x, axis=axes, keepdims=keepdim), out


def _correction(unbiased):
    return 1 if unbiased else 0


@lowering(aten.var.correction, opmath=True)
def var(self, dim=None, *, correction=None, keepdim=False):
    v, _, out = _var(self, dim, correction, keepdim)
    return v.astype(out)


@lowering(aten.var.dim)
def var_dim(self, dim, unbiased=True, keepdim=False):
    return var(self, dim, correction=_correction(unbiased), keepdim=keepdim)


@lowering(aten.var.default)
def var_default(self, unbiased=True):
    return var(self, None, correction=_correction(unbiased))


@lowering(aten.std.correction, opmath=True)
def std(self, dim=None, *, correction=None, keepdim=False):
    v, _, out = _var(self, dim, correction, keepdim, "std")
    return jnp.sqrt(v).astype(out)


@lowering(aten.std.dim)
def std_dim(self, dim, unbiased=True, keepdim=False):
    return std(self, dim, correction=_correction(unbiased), keepdim=keepdim)


@lowering(aten.std.default)
def std_default(self, unbiased=True):
    return std(self, None, correction=_correction(unbiased))


@lowering(aten.var_mean.correction, opmath=True)
def var_mean(self, dim=None, *, correction=None, keepdim=False):
    v, m, out = _var(self, dim, correction, keepdim, "var_mean")
    return v.astype(out), m.astype(out)


@lowering(aten.var_mean.dim)
def var_mean_dim(self, dim, unbiased=True, keepdim=False):
    return var_mean(self, dim, correction=_correction(unbiased), keepdim=keepdim)


@lowering(aten.var_mean.default)
def var_mean_default(self, unbiased=True):
    return var_mean(self, None, correction=_correction(unbiased))


@lowering(aten.std_mean.correction, opmath=True)
def std_mean(self, dim=None, *, correction=None, keepdim=False):
    v, m, out = _var(self, dim, correction, keepdim, "std_mean")
    return jnp.sqrt(v).astype(out), m.astype(out)


@lowering(aten.std_mean.dim)
def std_mean_dim(self, dim, unbiased=True, keepdim=False):
    return std_mean(self, dim, correction=_correction(unbiased), keepdim=keepdim)


@lowering(aten.std_mean.default)
def std_mean_default(self, unbiased=True):
    return std_mean(self, None, correction=_correction(unbiased))


# -- logsumexp and norms ------------------------------------------------------------------------


@lowering(aten.logsumexp.default, opmath=True)
def logsumexp(self, dim, keepdim=False):
    out = jnp.dtype(jnp.float32) if _is_int(self) else self.dtype
    x = self.astype(out)
    axes = _dims(self, dim)
    if x.size == 0 or not axes:
        return jnp.log(jnp.sum(jnp.exp(x), axis=axes, keepdims=keepdim)).astype(out)
    peak = jnp.max(x, axis=axes, keepdims=True)
    peak = jnp.where(jnp.isfinite(peak), peak, 0)
    total = jnp.sum(jnp.exp(x - peak), axis=axes, keepdims=True)
    result = jnp.log(total) + peak
    if not keepdim:
        result = jnp.squeeze(result, axis=axes)
    return result.astype(out)


def _vector_norm(x, ord, dim, keepdim):
    """The ``ord``-norm of ``x`` over ``dim``, for lowerings that declare ``opmath=True`` (a
    half-precision ``x`` arrives in float32 and the result rounds back)."""
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        raise RuntimeError(
            f"linalg.vector_norm: Expected a floating point or complex tensor as input. Got "
            f"{str(torch_dtype_of(x.dtype)).removeprefix('torch.').capitalize()}"
        )
    out = jnp.abs(x[..., :0]).dtype if jnp.iscomplexobj(x) else x.dtype
    a = jnp.abs(x)
    axes = _dims(x, dim)
    ord = float(ord)
    if ord == float("inf"):
        if a.size == 0:
            _require_nonempty(x, axes, "linalg.vector_norm")
        r = jnp.max(a, axis=axes, keepdims=keepdim)
    elif ord == float("-inf"):
        _require_nonempty(x, axes, "linalg.vector_norm")
        r = jnp.min(a, axis=axes, keepdims=keepdim)
    elif ord == 0:
        r = jnp.sum(a != 0, axis=axes, keepdims=keepdim).astype(a.dtype)
    elif ord == 1:
        r = jnp.sum(a, axis=axes, keepdims=keepdim)
    elif ord == 2:
        r = jnp.sqrt(jnp.sum(a * a, axis=axes, keepdims=keepdim))
    else:
        r = jnp.power(jnp.sum(jnp.power(a, ord), axis=axes, keepdims=keepdim), 1.0 / ord)
    return r.astype(out)


@lowering(aten.linalg_vector_norm.default, opmath=True, args=("self",), results=("dtype",))
def linalg_vector_norm(self, ord=2, dim=None, keepdim=False, *, dtype=None):
    return _vector_norm(self, ord, dim, keepdim)


@lowering(aten.norm.Scalar, aten.norm.ScalarOpt_dim, opmath=True, args=("self",))
def norm(self, p=2, dim=None, keepdim=False):
    return _vector_norm(self, 2 if p is None else p, dim, keepdim)


@lowering(
    aten.norm.ScalarOpt_dtype,
    aten.norm.ScalarOpt_dim_dtype,
    opmath=True,
    args=("self",),
    results=("dtype",),
)
def norm_dtype(self, p, dim=None, keepdim=False, *, dtype):
    return _vector_norm(self, 2 if p is None else p, dim, keepdim)


# -- scans --------------------------------------------------------------------------------------


def _scan_axis(x, dim) -> int:
    return _dims(x, dim)[0] if x.ndim else 0


@lowering(aten.cumsum.default)
def cumsum(self, dim, *, dtype=None):
    out = _accumulate_dtype(self, dtype)
    if self.ndim == 0:
        return self.astype(out)
    acc = opmath_dtype(out)
    return jnp.cumsum(self.astype(acc), axis=_scan_axis(self, dim)).astype(out)


@lowering(aten.cumprod.default)
def cumprod(self, dim, *, dtype=None):
    out = _accumulate_dtype(self, dtype)
    if self.ndim == 0:
        return self.astype(out)
    acc = opmath_dtype(out)
    return jnp.cumprod(self.astype(acc), axis=_scan_axis(self, dim)).astype(out)


@lowering(aten.logcumsumexp.default, opmath=True)
def logcumsumexp(self, dim):
    if self.ndim == 0:
        return self
    return lax.cumlogsumexp(self, axis=_scan_axis(self, dim))


def _cumulative_extreme(x, dim, largest: bool):
    """cummax/cummin: ties take the later index; the first NaN wins from there on."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    return _cumulative_extreme_scan(x, _scan_axis(x, dim), largest)


# One XLA program per shape and dtype, eagerly too: run op by op, the associative scan's
# log-depth slices, pads and combines compiled ~50 programs on a call's first run.
@functools.partial(jax.jit, static_argnums=(1, 2))
def _cumulative_extreme_scan(x, axis: int, largest: bool):
    index = lax.broadcasted_iota(jnp.int64, x.shape, axis)
    is_float = jnp.issubdtype(x.dtype, jnp.inexact)

    def combine(earlier, later):
        a, ia = earlier
        b, ib = later
        better = b >= a if largest else b <= a
        if is_float:
            take = ~jnp.isnan(a) & (jnp.isnan(b) | better)
        else:
            take = better
        return jnp.where(take, b, a), jnp.where(take, ib, ia)

    values, indices = lax.associative_scan(combine, (x, index), axis=axis)
    return values, indices


@lowering(aten.cummax.default)
def cummax(self, dim):
    return _cumulative_extreme(self, dim, True)


@lowering(aten.cummin.default)
def cummin(self, dim):
    return _cumulative_extreme(self, dim, False)


# -- order statistics ---------------------------------------------------------------------------


def _median_along(x, axis, keepdim, ignore_nan: bool):
    """Lower median and its index along ``axis``; NaN propagates unless ``ignore_nan``."""
    n = x.shape[axis]
    order = jnp.argsort(x, axis=axis, stable=True)  # NaN sorts last
    ordered = jnp.take_along_axis(x, order, axis=axis)
    if jnp.issubdtype(x.dtype, jnp.inexact):
        nans = jnp.sum(jnp.isnan(x), axis=axis, keepdims=True)
        if ignore_nan:
            k = jnp.maximum((n - nans - 1) // 2, 0)
        else:
            k = jnp.where(nans > 0, n - nans, (n - 1) // 2)  # the first NaN
        k = jnp.minimum(k, n - 1)
    else:
        k = jnp.full(x.shape[:axis] + (1,) + x.shape[axis + 1 :], (n - 1) // 2)
    values = jnp.take_along_axis(ordered, k, axis=axis)
    indices = jnp.take_along_axis(order, k, axis=axis).astype(jnp.int64)
    if not keepdim:
        values, indices = jnp.squeeze(values, axis), jnp.squeeze(indices, axis)
    return values, indices


def _median_all(x, op, ignore_nan):
    if x.size == 0:
        return (
            jnp.full((), jnp.nan, x.dtype)
            if jnp.issubdtype(x.dtype, jnp.inexact)
            else (_raise_empty(op))
        )
    values, _ = _median_along(x.reshape(-1), 0, False, ignore_nan)
    return values


def _raise_empty(op):
    raise IndexError(f"{op}(): Expected reduction dim 0 to have non-zero size.")


def _median_dim(x, dim, keepdim, op, ignore_nan):
    axes = _dims(x, dim)
    _require_nonempty(x, axes, op)
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    return _median_along(x, axes[0], keepdim, ignore_nan)


@lowering(aten.median.default)
def median(self):
    return _median_all(self, "median", False)


@lowering(aten.nanmedian.default)
def nanmedian(self):
    return _median_all(self, "nanmedian", True)


@lowering(aten.median.dim)
def median_dim(self, dim, keepdim=False):
    return _median_dim(self, dim, keepdim, "median", False)


@lowering(aten.nanmedian.dim)
def nanmedian_dim(self, dim, keepdim=False):
    return _median_dim(self, dim, keepdim, "nanmedian", True)


@lowering(aten.mode.default)
def mode(self, dim=-1, keepdim=False):
    """Most frequent value (the smallest among ties) and the index of its last occurrence."""
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int64)
    axis = _dims(self, dim)[0]
    x = jnp.moveaxis(self, axis, -1)
    n = x.shape[-1]
    if n == 0:
        _raise_empty("mode")
    same = x[..., :, None] == x[..., None, :]
    if jnp.issubdtype(x.dtype, jnp.inexact):
        same = same | (jnp.isnan(x)[..., :, None] & jnp.isnan(x)[..., None, :])
    counts = jnp.sum(same, axis=-1)
    best = jnp.max(counts, axis=-1, keepdims=True)
    candidates = jnp.where(counts == best, x, _largest(x.dtype))
    value = jnp.min(candidates, axis=-1, keepdims=True)
    matches = (
        (x == value) | (jnp.isnan(x) & jnp.isnan(value))
        if jnp.issubdtype(x.dtype, jnp.inexact)
        else (x == value)
    )
    index = jnp.max(jnp.where(matches, jnp.arange(n), -1), axis=-1, keepdims=True)
    value, index = jnp.moveaxis(value, -1, axis), jnp.moveaxis(index, -1, axis)
    if not keepdim:
        value, index = jnp.squeeze(value, axis), jnp.squeeze(index, axis)
    return value, index.astype(jnp.int64)


def _largest(dtype):
    if dtype == jnp.bool_:
        return True
    if jnp.issubdtype(dtype, jnp.integer):
        return jnp.iinfo(dtype).max
    return jnp.inf


# -- traces, distances and norms of slices ------------------------------------------------------


@lowering(aten.trace.default)
def trace(self):
    if self.ndim != 2:
        raise RuntimeError(f"trace: expected a matrix, but got tensor with dim {self.ndim}")
    return _sum(jnp.diagonal(self), None, False, None)


@lowering(aten.dist.default)
def dist(self, other, p=2):
    common = to_jax_dtype(
        torch.promote_types(torch_dtype_of(self.dtype), torch_dtype_of(other.dtype))
    )
    # The difference rounds to the common dtype, as PyTorch's self - other; then the norm.
    difference = self.astype(common) - other.astype(common)
    return linalg_vector_norm(difference, p)


def _pairwise_norm(difference, p: float):
    """The p-norm over the last axis, as ATen's cdist/pdist kernels take it."""
    a = jnp.abs(difference)
    if p == 0:
        return jnp.sum(a != 0, axis=-1).astype(a.dtype)
    if p == 1:
        return jnp.sum(a, axis=-1)
    if p == 2:
        return jnp.sqrt(jnp.sum(a * a, axis=-1))
    if p == float("inf"):
        return jnp.max(a, axis=-1, initial=0)
    return jnp.power(jnp.sum(jnp.power(a, p), axis=-1), 1.0 / p)


def _euclidean_by_matmul(x1, x2):
    """ATen's matrix-multiply Euclidean distance: |a|^2 - 2ab + |b|^2, clamped at 0."""
    x1_norm = jnp.sum(x1 * x1, axis=-1, keepdims=True)
    x2_norm = jnp.sum(x2 * x2, axis=-1, keepdims=True)
    left = jnp.concatenate([-2 * x1, x1_norm, jnp.ones_like(x1_norm)], axis=-1)
    right = jnp.concatenate([x2, jnp.ones_like(x2_norm), x2_norm], axis=-1)
    product = jnp.matmul(left, jnp.swapaxes(right, -1, -2), precision="highest")
    return jnp.sqrt(jnp.maximum(product, 0))


@lowering(aten._euclidean_dist.default)
def euclidean_dist(x1, x2):
    return _euclidean_by_matmul(x1, x2)


@lowering(aten._cdist_forward.default)
def cdist_forward(x1, x2, p, compute_mode=None):
    if x1.ndim < 2 or x2.ndim < 2:
        raise RuntimeError(
            f"cdist only supports at least 2D tensors, X1 got: {x1.ndim}D, X2 got: {x2.ndim}D"
        )
    if x1.shape[-1] != x2.shape[-1]:
        raise RuntimeError(
            f"X1 and X2 must have the same number of columns. X1: {x1.shape[-1]} X2: {x2.shape[-1]}"
        )
    if p < 0:
        raise RuntimeError("cdist only supports non-negative p values")
    batch = jnp.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    x1 = jnp.broadcast_to(x1, batch + x1.shape[-2:])
    x2 = jnp.broadcast_to(x2, batch + x2.shape[-2:])
    rows1, rows2 = x1.shape[-2], x2.shape[-2]
    mode = 0 if compute_mode is None else compute_mode
    if p == 2 and (mode == 1 or (mode == 0 and (rows1 > 25 or rows2 > 25))):
        return _euclidean_by_matmul(x1, x2)
    return _pairwise_norm(x1[..., :, None, :] - x2[..., None, :, :], p)


@lowering(aten._pdist_forward.default)
def pdist_forward(self, p=2.0):
    if self.ndim != 2:
        raise RuntimeError(f"pdist only supports 2D tensors, got: {self.ndim}D")
    if p < 0:
        raise RuntimeError("pdist only supports non-negative p values")
    first, second = np.triu_indices(self.shape[0], 1)
    return _pairwise_norm(self[first] - self[second], p)


@lowering(aten.renorm.default)
def renorm(self, p, dim, maxnorm):
    if p < 0:
        raise RuntimeError(f"renorm: non-positive-norm not supported (got p={p})")
    if maxnorm < 0:
        raise RuntimeError(f"renorm: expected maxnorm to be >= 0 but got {maxnorm}")
    axis = _dims(self, dim)
    others = tuple(a for a in range(self.ndim) if a not in axis)
    # The norm in the opmath dtype (float32 for half precision), the scaling in self's dtype.
    norm = linalg_vector_norm(self, p, others, True, dtype=torch_dtype_of(opmath_dtype(self.dtype)))
    factor = jnp.where(norm > maxnorm, maxnorm / (norm + 1e-7), 1.0).astype(norm.dtype)
    return self * factor.astype(self.dtype)


@lowering(aten.hash_tensor.default)
def hash_tensor(self, dim=(), *, keepdim=False, mode=0):
    """XOR of every element's 64 bits: floats widened to float64, integers to int64."""
    if mode != 0:
        raise RuntimeError(f"hash_tensor: mode {mode} is not supported; only mode 0 (xor_sum).")
    wide = jnp.float64 if jnp.issubdtype(self.dtype, jnp.inexact) else jnp.int64
    bits = lax.bitcast_convert_type(self.astype(wide), jnp.uint64)
    axes = _dims(self, dim)
    out = lax.reduce(bits, np.uint64(0), lax.bitwise_xor, axes)
    if keepdim:
        out = jnp.expand_dims(out, axes)
    return out


# -- segment reductions -------------------------------------------------------------------------


def _segment_offsets(lengths, offsets, axis, data):
    if offsets is not None:
        return offsets.astype(jnp.int64)
    if lengths is None:
        raise RuntimeError(
            "segment_reduce: either lengths or offsets must be given (indices "
            "are not supported, as in PyTorch)."
        )
    lengths = lengths.astype(jnp.int64)
    start = jnp.zeros(lengths.shape[:-1] + (1,), jnp.int64)
    return jnp.concatenate([start, jnp.cumsum(lengths, axis=-1)], axis=-1)


@lowering(aten.segment_reduce.default, opmath=True, args=("data",))
def segment_reduce(
    data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None
):
    if indices is not None:
        raise RuntimeError(
            "segment_reduce: indices based reduction is not supported yet; pass lengths or offsets."
        )
    axis = _dims(data, axis)[0]
    bounds = _segment_offsets(lengths, offsets, axis, data)
    if not unsafe and not isinstance(bounds, jax.core.Tracer):
        if lengths is not None and bool(jnp.any(lengths < 0)):
            raise RuntimeError("segment_reduce: lengths contains negative value!")
        if bool(jnp.any(bounds[..., -1] != data.shape[axis])):
            raise RuntimeError(
                f"segment_reduce: Expected all rows of lengths along axis to sum "
                f"to data.size(lengths.dim()-1) = {data.shape[axis]}."
            )
    lead, n, trail = data.shape[:axis], data.shape[axis], data.shape[axis + 1 :]
    rows = int(np.prod(lead, dtype=np.int64))
    segments = bounds.shape[-1] - 1
    bounds = bounds.reshape(rows, segments + 1)
    position = jnp.arange(n, dtype=jnp.int64)
    segment = jax.vmap(lambda ends: jnp.searchsorted(ends, position, side="right"))(bounds[:, 1:])
    inside = (position >= bounds[:, :1]) & (position < bounds[:, -1:])
    ids = jnp.where(inside, jnp.arange(rows)[:, None] * segments + segment, rows * segments)
    x = data.reshape(rows * n, -1)
    ids, total = ids.reshape(-1), rows * segments
    counts = jax.ops.segment_sum(jnp.ones_like(ids), ids, total)[:, None]
    nans = jax.ops.segment_max(jnp.isnan(x).astype(jnp.int8), ids, total) > 0
    if reduce in ("sum", "mean"):
        out = jax.ops.segment_sum(x, ids, total) + (0 if initial is None else initial)
        if reduce == "mean":
            empty = jnp.nan if initial is None else initial
            out = jnp.where(counts > 0, out / jnp.maximum(counts, 1), empty)
    elif reduce == "prod":
        out = jax.ops.segment_prod(x, ids, total) * (1 if initial is None else initial)
    elif reduce in ("max", "min"):
        fn, pick = (
            (jax.ops.segment_max, jnp.maximum)
            if reduce == "max"
            else (jax.ops.segment_min, jnp.minimum)
        )
        out = fn(x, ids, total)
        out = jnp.where(counts > 0, out, -jnp.inf if reduce == "max" else jnp.inf)
        if initial is not None:
            out = pick(out, initial)
    else:
        raise RuntimeError(
            f"segment_reduce: reduce argument must be one of sum, mean, max, min "
            f"or prod, got {reduce!r}."
        )
    out = jnp.where(nans, jnp.nan, out) if reduce != "sum" and reduce != "mean" else out
    return out.reshape(lead + (segments,) + trail).astype(data.dtype)


# -- covariance ---------------------------------------------------------------------------------


def _traced(t) -> bool:
    """Whether ``t``'s values are unknown now (traced by JAX, or a fake tensor of export)."""
    read = getattr(t, "jax", None)
    return read is None or isinstance(read(), jax.core.Tracer)


def _check_weights(w, name, num_observations, integral: bool):
    if w.dim() > 1:
        raise RuntimeError(
            f"cov(): expected {name} to have one or fewer dimensions but got {name} "
            f"with {w.dim()} dimensions"
        )
    if integral and (w.is_floating_point() or w.is_complex()):
        raise RuntimeError(
            f"cov(): expected {name} to have integral dtype but got {name} with {w.dtype} dtype"
        )
    if not integral and not w.is_floating_point():
        raise RuntimeError(
            f"cov(): expected {name} to have floating point dtype but got {name} "
            f"with {w.dtype} dtype"
        )
    if w.numel() != num_observations:
        raise RuntimeError(
            f"cov(): expected {name} to have the same numel as there are "
            f"observations in the input but got {w.numel()} != {num_observations}"
        )
    if not _traced(w) and bool((w < 0).any()):
        raise RuntimeError(f"cov(): {name} cannot be negative")


@decomposition(aten.cov.default)
def cov(self, *, correction=1, fweights=None, aweights=None):
    """PyTorch's composite, minus its host reads: under jit a non-positive degrees-of-freedom
    count becomes 0 with torch.where (eagerly PyTorch also warns), weights go unchecked."""
    if self.dim() > 2:
        raise RuntimeError(
            f"cov(): expected input to have two or fewer dimensions but got an "
            f"input with {self.dim()} dimensions"
        )
    if self.dtype == torch.bool:
        raise RuntimeError("cov(): bool dtype is not supported for input")
    x = self if self.dim() == 2 else self.view(1, -1)
    num_observations = x.size(1)
    w = None
    if fweights is not None:
        _check_weights(fweights, "fweights", num_observations, integral=True)
        w = fweights
    if aweights is not None:
        _check_weights(aweights, "aweights", num_observations, integral=False)
        w = aweights if w is None else w * aweights
    if w is None:
        w_sum = torch.scalar_tensor(num_observations, dtype=torch.long, device=x.device)
    else:
        w_sum = w.sum()
        # The comparison's result is what is read: under a trace an op on a concrete input can
        # still be staged (JAX stages every op inside jit unless the op cache answers it).
        zero_sum = w_sum == 0
        if not _traced(zero_sum) and bool(zero_sum):
            raise RuntimeError("cov(): weights sum to zero, can't be normalized")
    avg = (x if w is None else x * w).sum(1) / w_sum
    if w is not None and correction != 0 and aweights is not None:
        norm_factor = w_sum - correction * (w * aweights).sum() / w_sum
    else:
        norm_factor = w_sum - correction
    no_freedom = norm_factor <= 0
    if not _traced(no_freedom) and bool(no_freedom):
        import warnings

        warnings.warn(
            "cov(): degrees of freedom is <= 0. Correction should be strictly less "
            "than the number of observations.",
            stacklevel=2,
        )
    norm_factor = torch.where(norm_factor <= 0, torch.zeros_like(norm_factor), norm_factor)
    x = x - avg.unsqueeze(1)
    c = torch.mm(x, (x if w is None else x * w).t().conj())
    return torch.true_divide(c, norm_factor).squeeze()
