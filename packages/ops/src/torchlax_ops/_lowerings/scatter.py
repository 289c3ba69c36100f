"""Gather and scatter along a dim (``gather``, ``scatter``, ``scatter_add``, ``scatter_reduce``,
``index_reduce``) and on the flattened tensor (``take``, ``put``).

Indices are checked as ``indexing`` describes (``torchlax_core.check_index``).
"""

from __future__ import annotations

import jax
import jax.core
import jax.numpy as jnp

from .. import _aten
from .._table import lowering
from .indexing import _add, _along, _check_along, _check_flat, _check_in_self, _multiply
from .shape import _dim

aten = _aten.aten  # (an op this torch lacks: a Missing, skipped)


# -- gather / scatter ----------------------------------------------------------------------------


def _grid(index, dim):
    """Full coordinates for each element of ``index``: ``index`` itself along ``dim``."""
    coords = []
    for d in range(index.ndim):
        if d == dim:
            coords.append(index)
        else:
            shape = [1] * index.ndim
            shape[d] = index.shape[d]
            coords.append(jnp.arange(index.shape[d]).reshape(shape))
    return tuple(coords)


def _as_rank(self, index, src=None):
    if self.ndim == 0:
        return (
            jnp.reshape(self, (1,)),
            jnp.reshape(index, (-1,)),
            None if src is None else jnp.reshape(src, (-1,)),
        )
    return self, index, src


def _cropped(src, shape):
    return src[tuple(slice(0, n) for n in shape)]


@lowering(aten.gather.default)
def gather(self, dim, index, *, sparse_grad=False):
    squeeze = self.ndim == 0
    self, index, _ = _as_rank(self, index)
    _check_along(self, _dim(dim, self.ndim), index, False)
    out = self[_grid(index, _dim(dim, self.ndim))]
    return jnp.reshape(out, ()) if squeeze and index.size == 1 else out


def _scatter_with(self, dim, index, src, combine):
    shape = self.shape
    self, index, src = _as_rank(self, index, src)
    dim = _dim(dim, self.ndim)
    _check_along(self, dim, index, False)
    if not isinstance(src, jax.Array) or src.ndim == 0:
        src = jnp.broadcast_to(jnp.asarray(src).astype(self.dtype), index.shape)
    else:
        src = _cropped(src, index.shape).astype(self.dtype)
    out = combine(self.at[_grid(index, dim)], src)
    return jnp.reshape(out, shape)


def _scatter_reducer(reduce: str):
    if reduce == "add":
        return _add
    if reduce == "multiply":
        return _multiply
    raise RuntimeError(
        f"scatter: reduce argument must be either 'add' or 'multiply', got '{reduce}'."
    )


@lowering(aten.scatter.src, aten.scatter.value)
def scatter(self, dim, index, src):
    return _scatter_with(self, dim, index, src, lambda at, s: at.set(s))


@lowering(aten.scatter.reduce, aten.scatter.value_reduce)
def scatter_reduce_legacy(self, dim, index, src, *, reduce):
    return _scatter_with(self, dim, index, src, _scatter_reducer(reduce))


@lowering(aten.scatter_add.default)
def scatter_add(self, dim, index, src):
    return _scatter_with(self, dim, index, src, _add)


def _identity(reduce: str, dtype):
    if reduce in ("sum", "mean"):
        return jnp.zeros((), dtype)
    if reduce == "prod":
        return jnp.ones((), dtype)
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.asarray(-jnp.inf if reduce == "amax" else jnp.inf, dtype)
    info = jnp.iinfo(dtype) if dtype != jnp.bool_ else None
    if info is None:
        return jnp.asarray(reduce == "amin")
    return jnp.asarray(info.min if reduce == "amax" else info.max, dtype)


_REDUCERS = {
    "sum": _add,
    "mean": _add,
    "prod": _multiply,
    "amax": lambda at, s: at.max(s),
    "amin": lambda at, s: at.min(s),
}


def _reduce_into(self, dim, index, src, reduce, include_self, place):
    """The scatter_reduce/index_reduce core; ``place(array)`` is the ``.at`` view of targets."""
    if reduce not in _REDUCERS:
        raise RuntimeError(
            f"reduce argument must be one of sum, prod, mean, amax, amin, got {reduce}"
        )
    src = src.astype(self.dtype)
    base = self if include_self else place(self).set(_identity(reduce, self.dtype))
    out = _REDUCERS[reduce](place(base), src)
    if reduce in ("amax", "amin") and jnp.issubdtype(self.dtype, jnp.inexact):
        # XLA's scatter max/min may drop NaN; PyTorch propagates it.
        nan = place(jnp.zeros(self.shape, jnp.bool_)).max(jnp.isnan(src))
        if include_self:
            nan = nan | jnp.isnan(self)
        out = jnp.where(nan, jnp.nan, out)
    if reduce == "mean":
        count = place(jnp.full(self.shape, 1 if include_self else 0, jnp.int64)).add(1)
        count = jnp.maximum(count, 1).astype(self.dtype)
        if jnp.issubdtype(self.dtype, jnp.integer):
            out = jnp.floor_divide(out, count)
        else:
            out = out / count
    return out


@lowering(aten.scatter_reduce.two)
def scatter_reduce(self, dim, index, src, reduce, *, include_self=True):
    shape = self.shape
    self, index, src = _as_rank(self, index, src)
    dim = _dim(dim, self.ndim)
    _check_along(self, dim, index, False)
    coords = _grid(index, dim)
    src = _cropped(src, index.shape)
    out = _reduce_into(self, dim, index, src, reduce, include_self, lambda a: a.at[coords])
    return jnp.reshape(out, shape)


@lowering(aten.index_reduce.default)
def index_reduce(self, dim, index, source, reduce, *, include_self=True):
    shape = self.shape
    self, index, source = _as_rank(self, index, source)
    dim = _dim(dim, self.ndim)
    _check_in_self(self, dim, index)
    key = _along(dim, self.ndim, jnp.ravel(index))
    out = _reduce_into(self, dim, index, source, reduce, include_self, lambda a: a.at[key])
    return jnp.reshape(out, shape)


@lowering(aten.take.default)
def take(self, index):
    _check_flat(self, index)
    return jnp.ravel(self)[index]


@lowering(aten.put.default)
def put(self, index, source, accumulate=False):
    _check_flat(self, index)
    flat = jnp.ravel(self).at[jnp.ravel(index)]
    source = jnp.ravel(source).astype(self.dtype)
    flat = _add(flat, source) if accumulate else flat.set(source)
    return flat.reshape(self.shape)
