"""Indexing, gather/scatter, sorting and searching, and the ops whose output size is data.

Advanced indexing builds a NumPy-style index tuple: jnp places the advanced-index dims exactly
as PyTorch does (at the first advanced index when they are adjacent, else in front). Ops
whose output shape depends on values (``nonzero``, ``masked_select``, ``unique``, boolean
masks in ``index``) work eagerly and raise ``DataDependentShapeError`` under tracing.

Indices are checked as PyTorch checks them (``torchlax_core.check_index``): eagerly an index out
of range raises PyTorch's error; in a program compiled with ``Config.checked`` it raises after
the call; otherwise XLA clamps reads and drops writes. The ``_unsafe`` variants, whose indices
PyTorch's own decompositions compute in range, are not checked.
"""

from __future__ import annotations

import os
import sys
import warnings

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import torch
import torchlax_core
from jax import lax
from torchlax_core import TorchlaxError, check_index, jax_dtype, torch_dtype

from .. import _aten
from .._table import lowering
from ._common import _scalar_name
from .shape import _dim  # PyTorch's dim wrapping, one definition for both families

aten = _aten.aten  # (an op this torch lacks: a Missing, skipped)


class DataDependentShapeError(TorchlaxError, RuntimeError):
    """An op whose output shape depends on tensor values was traced (jax.jit, torchlax.jit)."""


def _require_concrete(op: str, *arrays, hint: str = "") -> None:
    if any(isinstance(a, jax.core.Tracer) for a in arrays):
        raise DataDependentShapeError(
            f"{op} returns a tensor whose shape depends on the input's values, which JAX cannot "
            f"trace (jax.jit / torchlax.jit need static shapes). Run it eagerly, outside the "
            f"traced function{hint}."
        )


def _is_mask(index) -> bool:
    return index is not None and index.dtype in (jnp.bool_, jnp.uint8)


def _check_mask_shape(self, mask, start: int) -> None:
    """PyTorch's check that a boolean mask covers the dims it indexes (else jnp reads garbage)."""
    for i, size in enumerate(mask.shape):
        dim = start + i
        if dim < self.ndim and size != self.shape[dim]:
            raise IndexError(
                f"The shape of the mask {list(mask.shape)} at index {i} does not match the shape "
                f"of the indexed tensor {list(self.shape)} at index {dim}"
            )


def _key(self, indices, op: str, check: bool = True):
    """The NumPy-style index tuple for ATen's ``indices`` (None means a full slice)."""
    key = []
    for index in indices:
        if index is None:
            key.append(slice(None))
        elif _is_mask(index):
            _check_mask_shape(self, index, len(key))
            _require_concrete(
                op,
                index,
                hint=("; for `x[mask] = value` under jit use torch.where(mask, value, x) instead"),
            )
            key.extend(jnp.nonzero(index.astype(jnp.bool_)))
        else:
            if index.dtype not in (jnp.int64, jnp.int32):
                raise IndexError(
                    f"tensors used as indices must be long, int, byte or bool tensors (got "
                    f"{index.dtype}); convert the index with .long()."
                )
            if check and len(key) < self.ndim:
                _check_advanced_index(self.shape[len(key)], index, key)
            key.append(index)
    if len(key) > self.ndim:
        raise IndexError(f"too many indices for tensor of dimension {self.ndim} (got {len(key)})")
    shapes = [k.shape for k in key if not isinstance(k, slice)]
    try:
        jnp.broadcast_shapes(*shapes)
    except ValueError:
        listed = ", ".join(str(list(shape)) for shape in shapes)
        raise IndexError(
            f"shape mismatch: indexing tensors could not be broadcast together with shapes "
            f"{listed}; pass index tensors whose shapes broadcast together."
        ) from None
    return tuple(key)


def _check_advanced_index(size: int, index, key: list) -> None:
    """ATen's range check of one index tensor: it numbers the dimension among the indexed
    ones (ATen moves them to the front first), and a zero-size dimension has no valid index."""
    if size == 0 and index.size:
        raise IndexError("index is out of bounds for dimension with size 0")
    indexed = sum(not isinstance(k, slice) for k in key)
    check_index(
        index,
        -size,
        size,
        IndexError,
        f"index {{index}} is out of bounds for dimension {indexed} with size {size}",
    )


def _check_indices(indices, op: str, exc_type: type[Exception]) -> None:
    """PyTorch's checks of ``indices`` before indexing: one index at least, uint8 deprecated."""
    if all(index is None for index in indices):
        raise exc_type(
            f"{op}: at least one index must be provided (indices is empty or all None); "
            "pass an index tensor, or use the tensor itself (copy_/fill_ to write all of it)."
        )
    for index in indices:
        if index is not None and index.dtype == jnp.uint8:
            warnings.warn(  # as ATen, once per uint8 index, at the user's line
                "indexing with dtype torch.uint8 is now deprecated, please use a dtype torch.bool "
                "instead.",
                UserWarning,
                stacklevel=_user_stacklevel(),
            )


# Frames of these packages are skipped when a warning names the line that caused it.
_LIBRARY_DIRS = tuple(
    os.path.dirname(module.__file__ or "") + os.sep for module in (jax, torch, torchlax_core)
) + (os.path.dirname(os.path.dirname(__file__)) + os.sep,)


def _user_stacklevel() -> int:
    """``stacklevel`` (for the caller of this function) of the first frame outside torch, JAX
    and torchlax: PyTorch's warnings name the user's line, and Python shows a warning once
    per line."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_LIBRARY_DIRS):
        frame, level = frame.f_back, level + 1
    return level


def _check_along(
    self, dim, index, low_is_negative_size, exc_type: type[Exception] = RuntimeError, prefix=""
):
    """PyTorch's range check of an index along ``dim`` ([0, size), or [-size, size))."""
    size = self.shape[dim] if self.ndim else 1
    check_index(
        index,
        -size if low_is_negative_size else 0,
        size,
        exc_type,
        f"{prefix}index {{index}} is out of bounds for dimension {dim} with size {size}",
    )


def _check_in_self(self, dim, index):
    """index_select's and embedding's check: [0, size), message "index out of range in self"."""
    size = self.shape[dim] if self.ndim else 1
    check_index(index, 0, size, IndexError, "index out of range in self")


def _check_flat(self, index):
    """take's and put's check on the flattened tensor: [-numel, numel)."""
    n = self.size
    check_index(
        index,
        -n,
        n,
        IndexError,
        f"out of range: tried to access index {{index}} on a tensor of {n} elements.",
    )


def _add(at, values):
    # On bool tensors PyTorch's add is logical or, its multiply logical and.
    return at.max(values) if values.dtype == jnp.bool_ else at.add(values)


def _multiply(at, values):
    return at.min(values) if values.dtype == jnp.bool_ else at.multiply(values)


@lowering(aten.index.Tensor)
def index(self, indices):
    _check_indices(indices, "aten.index.Tensor", IndexError)
    return self[_key(self, indices, "aten.index.Tensor (indexing with a boolean mask)")]


@lowering(aten._unsafe_index.Tensor)
def unsafe_index(self, indices):
    return self[_key(self, indices, "aten._unsafe_index.Tensor", check=False)]


def _mask_update(self, indices, values):
    """``x[..., mask] = v`` as a select when v is the same for every selected position.

    Returns None when the values differ per selected element (then it needs nonzero).
    """
    masks = [i for i, index in enumerate(indices) if index is not None]
    if len(masks) != 1 or not _is_mask(indices[masks[0]]):
        return None
    position = masks[0]
    mask = indices[position].astype(jnp.bool_)
    lead, trail = self.shape[:position], self.shape[position + mask.ndim :]
    rank = len(lead) + 1 + len(trail)
    if values.ndim > rank:
        return None
    values = jnp.reshape(values, (1,) * (rank - values.ndim) + values.shape)
    if values.shape[len(lead)] != 1:
        return None
    values = jnp.reshape(
        values, values.shape[: len(lead)] + (1,) * mask.ndim + values.shape[len(lead) + 1 :]
    )
    mask = jnp.reshape(mask, (1,) * len(lead) + mask.shape + (1,) * len(trail))
    return mask, jnp.broadcast_to(values, self.shape)


@lowering(aten.index_put.default, aten._index_put_impl.default)
def index_put(self, indices, values, accumulate=False, unsafe=False):
    return _index_put(self, indices, values, accumulate, check=True)


@lowering(aten._unsafe_index_put.default)
def unsafe_index_put(self, indices, values, accumulate=False):
    return _index_put(self, indices, values, accumulate, check=False)


def _index_put(self, indices, values, accumulate, check):
    if check:
        _check_indices(indices, "aten.index_put", RuntimeError)
    source_dtype = values.dtype  # checked after the shapes, as PyTorch orders its errors
    values = values.astype(self.dtype)
    update = _mask_update(self, indices, values)
    if update is not None:  # jit-friendly: no nonzero needed
        mask, values = update
        return jnp.where(mask, self + values if accumulate else values, self)
    key = _key(self, indices, "aten.index_put (assigning to a boolean-masked selection)", check)
    if values.ndim:
        selected = jax.eval_shape(lambda array: array[key], self).shape
        values = _broadcast_for_put(values, selected)
    # (one value into a mask is PyTorch's masked_fill_, which casts)
    _check_put_dtype(self, source_dtype, check and values.size > 1)
    return _add(self.at[key], values) if accumulate else self.at[key].set(values)


def _check_put_dtype(self, source_dtype, check: bool) -> None:
    if check and source_dtype != self.dtype:
        raise RuntimeError(
            f"Index put requires the source and destination dtypes match, got "
            f"{_scalar_name(self.dtype)} for the destination and {_scalar_name(source_dtype)} "
            f"for the source (aten.index_put); convert the values with .to(x.dtype) first."
        )


def _broadcast_for_put(values, selected: tuple):
    """``values`` shaped for the selection ``x[key]``, as PyTorch's index_put checks it."""
    ones = 0
    while values.ndim - ones > len(selected) and values.shape[ones] == 1:
        ones += 1  # PyTorch drops leading 1-dims of the values first
    values = jnp.reshape(values, values.shape[ones:])
    try:
        return jnp.broadcast_to(values, selected)
    except ValueError:
        raise RuntimeError(
            f"aten.index_put: shape mismatch: value tensor of shape {list(values.shape)} cannot "
            f"be broadcast to indexing result of shape {list(selected)}; pass values of a shape "
            "that broadcasts to the indexed selection."
        ) from None


def _clamped(shape, indices):
    """Indices clamped into ``[-size, size)``: the masked-off positions of the unsafe masked ops
    may hold anything, and reading or writing them must stay in bounds."""
    return [
        None if index is None else jnp.clip(index, -size, size - 1)
        for size, index in zip(shape, indices, strict=False)
    ]


@lowering(aten._unsafe_masked_index.default)
def unsafe_masked_index(self, mask, indices, fill):
    fill = jnp.asarray(fill).astype(self.dtype)
    if self.size == 0:
        # As ATen: index a stand-in filled with ``fill`` whose indexed empty dims have size 1;
        # dims past the last index get size 0 (ATen's sizes vector is only filled that far).
        stand_in = [
            1 if index is not None and size == 0 else size
            for size, index in zip(self.shape, indices, strict=False)
        ]
        stand_in += [0] * (self.ndim - len(stand_in))
        full = jnp.full(stand_in, fill, self.dtype)
        return full[_key(full, _clamped(full.shape, indices), "aten._unsafe_masked_index", False)]
    picked = self[_key(self, _clamped(self.shape, indices), "aten._unsafe_masked_index", False)]
    return jnp.where(mask, picked, fill)


@lowering(aten._unsafe_masked_index_put_accumulate.default)
def unsafe_masked_index_put_accumulate(self, mask, indices, values):
    if self.size == 0:
        return self
    values = jnp.where(mask, values, jnp.zeros((), values.dtype)).astype(self.dtype)
    key = _key(
        self, _clamped(self.shape, indices), "aten._unsafe_masked_index_put_accumulate", False
    )
    return _add(self.at[key], values)


def _along(dim, ndim, index):
    return (slice(None),) * dim + (index,)


@lowering(aten.index_select.default)
def index_select(self, dim, index):
    _check_in_self(self, _dim(dim, max(self.ndim, 1)), index)
    if self.ndim == 0:
        return self
    return jnp.take(self, jnp.ravel(index), axis=_dim(dim, self.ndim), mode="clip")


@lowering(aten.index_add.default)
def index_add(self, dim, index, source, *, alpha=1):
    _check_along(self, _dim(dim, max(self.ndim, 1)), index, False)
    if self.ndim == 0:
        return self + source * alpha
    source = source * alpha if alpha != 1 else source
    return _add(
        self.at[_along(_dim(dim, self.ndim), self.ndim, jnp.ravel(index))],
        source.astype(self.dtype),
    )


@lowering(aten.index_copy.default)
def index_copy(self, dim, index, source):
    _check_along(self, _dim(dim, max(self.ndim, 1)), index, False, IndexError, "index_copy_(): ")
    if self.ndim == 0:
        return jnp.reshape(source, ()).astype(self.dtype)
    return self.at[_along(_dim(dim, self.ndim), self.ndim, jnp.ravel(index))].set(
        source.astype(self.dtype)
    )


@lowering(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def index_fill(self, dim, index, value):
    value = jnp.asarray(value).astype(self.dtype)
    _check_along(self, _dim(dim, max(self.ndim, 1)), index, True, IndexError)
    if self.ndim == 0:
        return jnp.broadcast_to(value, ())
    return self.at[_along(_dim(dim, self.ndim), self.ndim, jnp.ravel(index))].set(value)


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


# -- outputs whose size is data ---------------------------------------------------------------


@lowering(aten.nonzero.default)
def nonzero(self):
    _require_concrete(
        "aten.nonzero",
        self,
        hint=(", or use torch.nonzero_static(x, size=N) to get a fixed number of rows"),
    )
    return jnp.stack(jnp.nonzero(jnp.atleast_1d(self) if self.ndim == 0 else self), axis=-1)[
        :, : self.ndim
    ].astype(jnp.int64)


@lowering(aten.nonzero_static.default)
def nonzero_static(self, *, size, fill_value=-1):
    if self.ndim == 0:
        return jnp.zeros((size, 0), jnp.int64)
    rows = jnp.nonzero(self, size=size, fill_value=fill_value)
    return jnp.stack(rows, axis=-1).astype(jnp.int64)


@lowering(aten.masked_select.default)
def masked_select(self, mask):
    _require_concrete(
        "aten.masked_select",
        self,
        mask,
        hint=(", or use torch.where(mask, x, fill) to keep the shape static"),
    )
    shape = jnp.broadcast_shapes(self.shape, mask.shape)
    return jnp.broadcast_to(self, shape)[jnp.broadcast_to(mask, shape)]


def _sorted_groups(rows):
    """Sort ``rows`` (n, k) lexicographically and mark where each group of equal rows starts.

    Equality is elementwise ``==``, as PyTorch's CPU kernels test it, so a row holding NaN equals
    no other row and stays a group of its own (``jnp.unique`` would merge NaNs). The sort is
    stable and puts NaN last. Returns the sorting permutation, the group starts and each sorted
    row's group, as NumPy arrays (these ops run eagerly: the sizes are data).
    """
    length = rows.shape[0]
    columns = [rows[:, j] for j in reversed(range(rows.shape[1]))]
    order = jnp.lexsort(columns) if columns else jnp.arange(length)
    ordered = rows[order]
    starts = np.ones(length, dtype=bool)
    if length:
        starts[1:] = np.asarray(jnp.any(ordered[1:] != ordered[:-1], axis=1))
    return np.asarray(order), starts, np.cumsum(starts) - 1


def _group_results(order, starts, group, length, return_inverse, return_counts):
    """The first sorted index of each group, the inverse in input order, and the counts."""
    first = np.flatnonzero(starts)
    inverse = np.empty(length, np.int64)
    inverse[order] = group
    inverse = jnp.asarray(inverse) if return_inverse else _none()
    counts = jnp.asarray(np.diff(np.append(first, length)), jnp.int64) if return_counts else _none()
    return first, inverse, counts


def _unique_flat(self, sorted, return_inverse, return_counts, op):
    _require_concrete(op, self)
    flat = jnp.ravel(self)
    order, starts, group = _sorted_groups(flat[:, None])
    first, inverse, counts = _group_results(
        order, starts, group, flat.shape[0], return_inverse, return_counts
    )
    inverse = jnp.reshape(inverse, self.shape) if return_inverse else inverse
    return flat[order[first]], inverse, counts


def _none():
    return jnp.zeros((0,), jnp.int64)


@lowering(aten._unique2.default)
def unique2(self, sorted=True, return_inverse=False, return_counts=False):
    return _unique_flat(self, sorted, return_inverse, return_counts, "torch.unique")


@lowering(aten._unique.default)
def unique(self, sorted=True, return_inverse=False):
    values, inverse, _ = _unique_flat(self, sorted, return_inverse, False, "torch.unique")
    return values, inverse


def _check_unique_dim_of_empty(self, dim: int) -> None:
    """PyTorch's checks of ``unique(dim=)`` on an empty tensor: only ``dim`` may be 0-sized."""
    if self.size:
        return
    if self.shape[dim] != 0:
        raise RuntimeError(
            "There are 0 sized dimensions, and they aren't selected, so unique cannot be applied"
        )
    if sum(n == 0 for n in self.shape) > 1:
        raise RuntimeError(
            "Number of zero sized dimensions is more than one, so unique cannot be applied "
        )


@lowering(aten.unique_dim.default)
def unique_dim(self, dim, sorted=True, return_inverse=False, return_counts=False):
    _require_concrete("torch.unique(dim=...)", self)
    dim = _dim(dim, self.ndim)
    _check_unique_dim_of_empty(self, dim)
    if not self.size:
        return self, _none(), _none()
    moved = jnp.moveaxis(self, dim, 0)
    length = moved.shape[0]
    order, starts, group = _sorted_groups(moved.reshape(length, -1))
    first, inverse, counts = _group_results(
        order, starts, group, length, return_inverse, return_counts
    )
    return jnp.moveaxis(moved[order[first]], 0, dim), inverse, counts


@lowering(aten.unique_consecutive.default)
def unique_consecutive(self, return_inverse=False, return_counts=False, dim=None):
    _require_concrete("torch.unique_consecutive", self)
    if dim is not None:
        _check_unique_dim_of_empty(self, _dim(dim, self.ndim))
    moved = jnp.ravel(self)[:, None] if dim is None else jnp.moveaxis(self, _dim(dim, self.ndim), 0)
    length = moved.shape[0]
    rows = moved.reshape(length, int(np.prod(moved.shape[1:], dtype=np.int64)))
    starts = np.ones(length, dtype=bool)
    if length:
        starts[1:] = np.asarray(jnp.any(rows[1:] != rows[:-1], axis=1))
    first = np.flatnonzero(starts)
    values = moved[first] if dim is not None else jnp.ravel(self)[first]
    if dim is not None:
        values = jnp.moveaxis(values, 0, _dim(dim, self.ndim))
    group = np.cumsum(starts) - 1
    if return_inverse:
        inverse = jnp.asarray(group, jnp.int64)
        inverse = inverse.reshape(self.shape) if dim is None else inverse
    else:
        inverse = _none()
    counts = jnp.asarray(np.diff(np.append(first, length)), jnp.int64) if return_counts else _none()
    return values, inverse, counts


@lowering(aten.bincount.default)
def bincount(self, weights=None, minlength=0):
    _require_concrete(
        "aten.bincount",
        self,
        hint=(", or use torch.zeros(n).scatter_add_(0, x, weights) with a fixed n"),
    )
    if self.ndim != 1:
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    check_index(
        self, 0, 2**63 - 1, RuntimeError, "bincount only supports 1-d non-negative integral inputs."
    )
    length = max(int(jnp.max(self)) + 1 if self.size else 0, minlength)
    if weights is None:
        return jnp.zeros(length, jnp.int64).at[self].add(1)
    dtype = jnp.float32 if weights.dtype == jnp.float32 else jnp.float64
    return jnp.zeros(length, dtype).at[self].add(weights.astype(dtype))


@lowering(aten.histc.default)
def histc(self, bins=100, min=0, max=0):
    data = jnp.ravel(self)
    low, high = jnp.asarray(min, self.dtype), jnp.asarray(max, self.dtype)
    if min == max and data.size:
        low, high = jnp.min(data), jnp.max(data)
    same = low == high
    low, high = jnp.where(same, low - 1, low), jnp.where(same, high + 1, high)
    position = jnp.floor((data - low) / (high - low) * bins).astype(jnp.int64)
    position = jnp.where(data == high, bins - 1, position)
    keep = (data >= low) & (data <= high)
    return jnp.zeros(bins, self.dtype).at[jnp.where(keep, position, bins)].add(1, mode="drop")


def _even_edges(left, right, count, dtype):
    """``count`` evenly spaced edges from ``left`` to ``right`` as ATen's linspace computes them
    (in the output dtype; the first half counts up from ``left``, the rest down from ``right``)."""
    left, right = left.astype(dtype), right.astype(dtype)
    step = (right - left) / max(count - 1, 1)
    i = jnp.arange(count)
    # The barrier keeps XLA from fusing multiply and add into an FMA, which rounds differently.
    up = left + lax.optimization_barrier(step * i.astype(dtype))
    down = right - lax.optimization_barrier(step * (count - 1 - i).astype(dtype))
    return jnp.where(i < count // 2, up, down)


def _outer_edges(points, bins, range):
    """Per dimension, the histogram's outermost edges: ``range``, else the data's extremes
    (0 and 1 for no data); equal edges are moved half a unit apart, as in PyTorch."""
    dims = points.shape[1]
    if range is not None:
        if len(range) != 2 * dims:
            raise RuntimeError(
                f"histogramdd: for a {dims}-dimensional histogram, range should "
                f"have {2 * dims} elements, but got {len(range)}"
            )
        left = jnp.asarray(range[0::2], jnp.float64)
        right = jnp.asarray(range[1::2], jnp.float64)
        if not isinstance(left, jax.core.Tracer) and bool(jnp.any(left > right)):
            raise ValueError(
                "histogramdd: expected the lower edge of each range to be at most its upper edge"
            )
    elif points.shape[0]:
        left = jnp.min(points, axis=0).astype(jnp.float64)
        right = jnp.max(points, axis=0).astype(jnp.float64)
    else:
        left, right = jnp.zeros(dims, jnp.float64), jnp.ones(dims, jnp.float64)
    same = left == right
    return jnp.where(same, left - 0.5, left), jnp.where(same, right + 0.5, right)


def _bin_edges(points, bins, range):
    for b in bins:
        if b <= 0:
            raise RuntimeError("histogramdd(): bins must be > 0, but got " + str(b))
    left, right = _outer_edges(points, bins, range)
    return [_even_edges(left[d], right[d], b + 1, points.dtype) for d, b in enumerate(bins)]


def _points(self, dims):
    """The input as an (N, D) array of points (a plain histogram has D = 1)."""
    return self.reshape(-1, dims)


def _histogram_counts(points, edges, weight, density):
    """Counts (or summed weights) per bin; a value on an inner edge goes to the bin on its
    right, one on the last edge to the last bin, values outside the edges nowhere."""
    bins = [e.shape[0] - 1 for e in edges]
    flat = jnp.zeros(points.shape[0], jnp.int64)
    inside = jnp.ones(points.shape[0], jnp.bool_)
    for d, e in enumerate(edges):
        x = points[:, d]
        position = jnp.searchsorted(e, x, side="right") - 1
        position = jnp.minimum(position, bins[d] - 1)
        inside &= (x >= e[0]) & (x <= e[-1])
        flat = flat * bins[d] + position
    total = int(np.prod(bins, dtype=np.int64))
    flat = jnp.where(inside, flat, total)
    amount = jnp.ones(points.shape[0], points.dtype) if weight is None else weight.reshape(-1)
    hist = jnp.zeros(total, points.dtype).at[flat].add(amount.astype(points.dtype), mode="drop")
    hist = hist.reshape(bins)
    if density:
        hist = hist / jnp.sum(hist)
        for d, e in enumerate(edges):
            shape = [1] * len(bins)
            shape[d] = bins[d]
            hist = hist / jnp.diff(e).reshape(shape)
    return hist


def _dims_of(self):
    return self.shape[-1] if self.ndim else 1


@lowering(aten.histogram.bin_ct)
def histogram(self, bins=100, *, range=None, weight=None, density=False):
    points = _points(self, 1)
    edges = _bin_edges(points, [bins], range)
    return _histogram_counts(points, edges, weight, density), edges[0]


@lowering(aten.histogram.bins_tensor)
def histogram_bins_tensor(self, bins, *, weight=None, density=False):
    points = _points(self, 1)
    return _histogram_counts(points, [bins], weight, density), bins


@lowering(aten._histogramdd_bin_edges.default)
def histogramdd_bin_edges(self, bins, *, range=None, weight=None, density=False):
    return _bin_edges(_points(self, _dims_of(self)), bins, range)


@lowering(aten._histogramdd_from_bin_cts.default)
def histogramdd_from_bin_cts(self, bins, *, range=None, weight=None, density=False):
    points = _points(self, _dims_of(self))
    return _histogram_counts(points, _bin_edges(points, bins, range), weight, density)


@lowering(aten._histogramdd_from_bin_tensors.default)
def histogramdd_from_bin_tensors(self, bins, *, weight=None, density=False):
    return _histogram_counts(_points(self, _dims_of(self)), bins, weight, density)


# -- sorting and searching ---------------------------------------------------------------------


def _sort_indices(self, dim, descending, stable=True):
    return jnp.argsort(self, axis=dim, stable=True, descending=descending)


@lowering(aten.sort.default)
def sort(self, dim=-1, descending=False):
    return sort_stable(self, stable=True, dim=dim, descending=descending)


@lowering(aten.sort.stable)
def sort_stable(self, *, stable=None, dim=-1, descending=False):
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int64)
    dim = _dim(dim, self.ndim)
    order = _sort_indices(self, dim, descending)
    return jnp.take_along_axis(self, order, axis=dim), order.astype(jnp.int64)


@lowering(aten.argsort.default, aten.argsort.stable)
def argsort(self, *args, stable=False, dim=-1, descending=False):
    if args:  # argsort.default(self, dim, descending)
        dim, descending = (list(args) + [descending])[:2]
    if self.ndim == 0:
        return jnp.zeros((), jnp.int64)
    return _sort_indices(self, _dim(dim, self.ndim), descending).astype(jnp.int64)


@lowering(aten.topk.default)
def topk(self, k, dim=-1, largest=True, sorted=True):
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int64)
    dim = _dim(dim, self.ndim)
    if not 0 <= k <= self.shape[dim]:
        raise RuntimeError(
            f"topk: k ({k}) is out of range for dimension {dim} of size {self.shape[dim]}"
        )
    order = jax.lax.slice_in_dim(_sort_indices(self, dim, largest), 0, k, axis=dim)
    return jnp.take_along_axis(self, order, axis=dim), order.astype(jnp.int64)


def _greater_or_nan(x, y):
    """ATen's selection order: NaN above everything, else ``>``."""
    if jnp.issubdtype(x.dtype, jnp.inexact):
        return (jnp.isnan(x) & ~jnp.isnan(y)) | (x > y)
    return x > y


def _quickselect_row(values, k):
    """ATen's CPU quickselect (median-of-three Hoare partitioning) on one row, step for step,
    so that among equal values the same index is selected. Returns the permuted row and the
    permutation (``k``-th smallest at position ``k``)."""
    n = values.shape[0]
    gt = _greater_or_nan

    # Positions are always in bounds: lax's element access skips jnp's negative-index and
    # clamping arithmetic, which made this program slow to compile (seconds per k).
    def at(row, i):
        return lax.dynamic_index_in_dim(row, i, keepdims=False)

    def swap(state, a, b):
        def swap_row(row):
            row_a, row_b = at(row, a), at(row, b)
            row = lax.dynamic_update_index_in_dim(row, row_b, a, 0)
            return lax.dynamic_update_index_in_dim(row, row_a, b, 0)

        arr, idx = state
        return swap_row(arr), swap_row(idx)

    def swap_if(state, cond, a, b):
        return swap(state, a, jnp.where(cond, b, a))  # swapping a with itself changes nothing

    def partition_step(carry):
        arr, idx, low, high, _ = carry
        state = (arr, idx)
        two = high == low + 1
        # Two elements: order them and stop.
        ordered = swap_if(state, gt(at(arr, low), at(arr, high)), low, high)
        # Median of three into low, low + 1 and high, then partition around arr[low].
        mid = low + (high - low) // 2
        state = swap(state, mid, low + 1)
        state = swap_if(state, gt(at(state[0], low + 1), at(state[0], high)), low + 1, high)
        state = swap_if(state, gt(at(state[0], low), at(state[0], high)), low, high)
        state = swap_if(state, gt(at(state[0], low + 1), at(state[0], low)), low + 1, low)
        pivot = at(state[0], low)

        def scan(carry):
            # The median of three leaves sentinels at both ends; the bounds only matter for the
            # rows a batch carries along after they finished (their state is discarded).
            arr, idx, i, j, _ = carry
            i = lax.while_loop(lambda i: (i < high) & gt(pivot, at(arr, i)), lambda i: i + 1, i + 1)
            j = lax.while_loop(lambda j: (j > low) & gt(at(arr, j), pivot), lambda j: j - 1, j - 1)
            crossed = j < i
            arr2, idx2 = swap_if((arr, idx), ~crossed, i, j)
            return arr2, idx2, i, j, crossed

        arr, idx, i, j, _ = lax.while_loop(
            lambda c: ~c[4], scan, (*state, low + 1, high, jnp.bool_(False))
        )
        arr, idx = swap((arr, idx), low, j)
        new_low = jnp.where(j <= k, i, low)
        new_high = jnp.where(j >= k, j - 1, high)
        arr = jnp.where(two, ordered[0], arr)
        idx = jnp.where(two, ordered[1], idx)
        done = two | (new_high <= new_low)
        return arr, idx, new_low, new_high, done

    start = (
        values,
        jnp.arange(n, dtype=jnp.int64),
        jnp.int64(0),
        jnp.int64(n - 1),
        jnp.bool_(n <= 1),
    )
    arr, idx, *_ = lax.while_loop(lambda c: ~c[4], partition_step, start)
    return arr, idx


@jax.jit  # k traced: one compile per rows shape and dtype, not per k, dim or input shape
def _kth_smallest_of_rows(rows, position):
    def select(row):
        arr, idx = _quickselect_row(row, position)
        return arr[position], idx[position]

    # In batches that bound the work.
    return lax.map(select, rows, batch_size=max(1, 4096 // max(rows.shape[-1], 1)))


@lowering(aten.kthvalue.default)
def kthvalue(self, k, dim=-1, keepdim=False):
    if self.ndim == 0:
        if k != 1:
            raise IndexError("kthvalue(): selected number k out of range for dimension 0")
        return self, jnp.zeros((), jnp.int64)
    dim = _dim(dim, self.ndim)
    if not 1 <= k <= self.shape[dim]:
        raise IndexError(f"kthvalue(): selected number k out of range for dimension {dim}")
    if self.size == 0:
        shape = self.shape[:dim] + ((1,) if keepdim else ()) + self.shape[dim + 1 :]
        return jnp.zeros(shape, self.dtype), jnp.zeros(shape, jnp.int64)

    moved = jnp.moveaxis(self, dim, -1)
    rows = moved.reshape(-1, moved.shape[-1])
    values, indices = _kth_smallest_of_rows(rows, jnp.asarray(k - 1, jnp.int64))
    values, indices = values.reshape(moved.shape[:-1]), indices.reshape(moved.shape[:-1])
    if keepdim:
        values, indices = jnp.expand_dims(values, dim), jnp.expand_dims(indices, dim)
    return values, indices


def _searchsorted(sorted_sequence, values, right, side, sorter, out_int32):
    side = side or ("right" if right else "left")
    common = jax_dtype(
        torch.promote_types(torch_dtype(sorted_sequence.dtype), torch_dtype(values.dtype))
    )
    if common == jnp.bool_ or jnp.issubdtype(common, jnp.complexfloating):
        # PyTorch's CPU kernel runs in the promoted dtype and has none for bools or complex
        # numbers (which have no order); JAX would order them.
        raise NotImplementedError(
            f"\"searchsorted_out_cpu\" not implemented for '{_scalar_name(common)}'"
        )
    sorted_sequence, values = sorted_sequence.astype(common), values.astype(common)
    if sorter is not None:
        sorted_sequence = jnp.take_along_axis(sorted_sequence, sorter, axis=-1)
    dtype = jnp.int32 if out_int32 else jnp.int64
    if sorted_sequence.ndim <= 1:
        return jnp.searchsorted(sorted_sequence, values, side=side).astype(dtype)
    rows = sorted_sequence.reshape(-1, sorted_sequence.shape[-1])
    found = jax.vmap(lambda s, v: jnp.searchsorted(s, v, side=side))(
        rows, values.reshape(rows.shape[0], -1)
    )
    return found.reshape(values.shape).astype(dtype)


@lowering(aten.searchsorted.Tensor)
def searchsorted(sorted_sequence, self, *, out_int32=False, right=False, side=None, sorter=None):
    return _searchsorted(sorted_sequence, self, right, side, sorter, out_int32)


@lowering(aten.searchsorted.Scalar)
def searchsorted_scalar(
    sorted_sequence, self, *, out_int32=False, right=False, side=None, sorter=None
):
    # The number is promoted with the sequence as a 0-d tensor would be (``1j`` makes it complex).
    common = torch.result_type(torch.empty(0, dtype=torch_dtype(sorted_sequence.dtype)), self)
    value = jnp.asarray(self, jax_dtype(common))
    return _searchsorted(sorted_sequence, value, right, side, sorter, out_int32)


@lowering(aten.bucketize.Tensor)
def bucketize(self, boundaries, *, out_int32=False, right=False):
    return _searchsorted(boundaries, self, right, None, None, out_int32)


@lowering(aten.bucketize.Scalar)
def bucketize_scalar(self, boundaries, *, out_int32=False, right=False):
    return _searchsorted(
        boundaries, jnp.asarray(self, boundaries.dtype), right, None, None, out_int32
    )
