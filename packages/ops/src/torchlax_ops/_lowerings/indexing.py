"""Advanced indexing (``index``, ``index_put``, the masked and ``_unsafe`` variants) and the
``index_select``/``index_add``/``index_copy``/``index_fill`` family; the index checks and
``DataDependentShapeError`` the other indexing families share.

Advanced indexing builds a NumPy-style index tuple: jnp places the advanced-index dims exactly
as PyTorch does (at the first advanced index when they are adjacent, else in front). Boolean
masks in ``index`` give a shape that depends on values: they work eagerly and raise
``DataDependentShapeError`` under tracing (as the ops of ``data_dependent`` do).

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
import torch
import torchlax_core
from torchlax_core import TorchlaxError, check_index

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
