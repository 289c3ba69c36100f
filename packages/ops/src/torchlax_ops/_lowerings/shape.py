"""Shape and view ops, concatenation, padding, fills and selection by mask.

View ops here are plain functional jnp functions: the core tracks aliasing (a view keeps its
root and recomputes from it; writes through a view scatter into the root). The ``*_copy``
variants functionalization produces share the same function.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torchlax_core import jax_dtype, torch_dtype

from .. import _aten
from .._promotion import Promotion
from .._table import lowering

aten = _aten.aten  # (an op this torch lacks: a Missing, skipped)


def _dim(dim: int, ndim: int) -> int:
    """A dim wrapped as PyTorch does (a 0-d tensor accepts dims 0 and -1)."""
    rank = max(ndim, 1)
    if not -rank <= dim < rank:
        raise IndexError(
            f"Dimension out of range (expected to be in range of [{-rank}, {rank - 1}], but got {dim})"
        )
    return dim % rank


def _promoted(arrays) -> np.dtype:
    """PyTorch's result dtype of tensors that all take part equally (cat, stack, block_diag)."""
    dtypes = [torch_dtype(a.dtype) for a in arrays]
    return jax_dtype(functools.reduce(torch.promote_types, dtypes))


def _scalar_as(value, dtype):
    # Cast like PyTorch's fill: float -> int truncates, anything -> bool tests non-zero.
    if jnp.issubdtype(dtype, jnp.bool_):
        return jnp.asarray(value != 0)
    if isinstance(value, complex) and not jnp.issubdtype(dtype, jnp.complexfloating):
        value = value.real
    return jnp.asarray(value).astype(dtype)


# -- views of the same elements -------------------------------------------------------------


@lowering(
    aten.view.default,
    aten._unsafe_view.default,
    aten.view_copy.default,
    aten.reshape.default,
    aten._reshape_copy.default,
)
def view(self, size):
    return jnp.reshape(self, tuple(size))


@lowering(aten._reshape_alias.default, aten._reshape_alias_copy.default)
def _reshape_alias(self, size, stride):
    return jnp.reshape(self, tuple(size))


@lowering(aten.expand.default, aten.expand_copy.default)
def expand(self, size, *, implicit=False):
    lead = len(size) - self.ndim
    if lead < 0:
        raise RuntimeError(
            f"aten.expand: the number of sizes provided ({len(size)}) must be greater or equal "
            f"to the number of dimensions in the tensor ({self.ndim})."
        )
    shape = tuple(self.shape[i - lead] if s == -1 and i >= lead else s for i, s in enumerate(size))
    return jnp.broadcast_to(self, shape)


@lowering(aten.permute.default, aten.permute_copy.default)
def permute(self, dims):
    return jnp.transpose(self, tuple(_dim(d, self.ndim) for d in dims))


@lowering(aten.transpose.int, aten.transpose_copy.int)
def transpose(self, dim0, dim1):
    if self.ndim == 0:
        return self
    return jnp.swapaxes(self, _dim(dim0, self.ndim), _dim(dim1, self.ndim))


@lowering(aten.t.default, aten.t_copy.default)
def t(self):
    if self.ndim > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {self.ndim}D")
    return self.T


@lowering(aten.squeeze.default, aten.squeeze_copy.default)
def squeeze(self):
    return jnp.reshape(self, tuple(s for s in self.shape if s != 1))


@lowering(aten.squeeze.dim, aten.squeeze_copy.dim, aten.squeeze.dims, aten.squeeze_copy.dims)
def squeeze_dims(self, dim):
    dims = dim if isinstance(dim, list | tuple) else [dim]
    if self.ndim == 0:
        for d in dims:
            _dim(d, 0)
        return self
    drop = {_dim(d, self.ndim) for d in dims}
    return jnp.reshape(
        self, tuple(s for i, s in enumerate(self.shape) if not (i in drop and s == 1))
    )


@lowering(aten.unsqueeze.default, aten.unsqueeze_copy.default)
def unsqueeze(self, dim):
    return jnp.expand_dims(self, _dim(dim, self.ndim + 1))


def _slice_key(ndim, dim, start, end, step):
    if step <= 0:
        raise RuntimeError("slice step must be positive")
    # Python's slice clamps out-of-range and negative bounds exactly as PyTorch's slice does.
    return (slice(None),) * dim + (slice(start, end, step),)


@lowering(aten.slice.Tensor, aten.slice_copy.Tensor)
def slice_(self, dim=0, start=None, end=None, step=1):
    dim = _dim(dim, self.ndim)
    return self[_slice_key(self.ndim, dim, start, end, step)]


def _index_in(index, size, dim):
    if not -size <= index < size:
        raise IndexError(
            f"select(): index {index} out of range for tensor of size {size} at dimension {dim}"
        )
    return index % size


@lowering(aten.select.int, aten.select_copy.int)
def select(self, dim, index):
    dim = _dim(dim, self.ndim)
    index = _index_in(index, self.shape[dim], dim)
    # The index is an operand, not a constant of the program: eagerly, ``x[:, k]`` for each k
    # reuses one compiled slice per shape instead of compiling one per k (~0.1 s each).
    position = jnp.asarray(index, jnp.int32 if self.shape[dim] <= 2**31 - 1 else jnp.int64)
    return jax.lax.dynamic_index_in_dim(self, position, dim, keepdims=False)


@lowering(aten.narrow_copy.default)
def narrow_copy(self, dim, start, length):
    dim = _dim(dim, self.ndim)
    start = start % self.shape[dim] if start < 0 else start
    return jax.lax.slice_in_dim(self, start, start + length, axis=dim)


@lowering(aten.diagonal.default, aten.diagonal_copy.default)
def diagonal(self, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(self, offset, _dim(dim1, self.ndim), _dim(dim2, self.ndim))


def _unfold_indices(size, window, step):
    count = (size - window) // step + 1
    return jnp.arange(count)[:, None] * step + jnp.arange(window)[None, :]


@lowering(aten.unfold.default, aten.unfold_copy.default)
def unfold(self, dimension, size, step):
    if self.ndim == 0:
        return jnp.reshape(self, (1,))
    dim = _dim(dimension, self.ndim)
    windows = jnp.take(self, _unfold_indices(self.shape[dim], size, step), axis=dim)
    return jnp.moveaxis(windows, dim + 1, -1)


def _strided_indices(size, stride, storage_offset):
    index = jnp.asarray(storage_offset or 0, jnp.int64)
    for i, (n, s) in enumerate(zip(size, stride, strict=True)):
        shape = [1] * len(size)
        shape[i] = n
        index = index + (jnp.arange(n, dtype=jnp.int64) * s).reshape(shape)
    return jnp.broadcast_to(index, tuple(size))


@lowering(aten.as_strided.default, aten.as_strided_copy.default)
def as_strided(self, size, stride, storage_offset=None):
    # torchlax arrays are contiguous: strides index the row-major flattening of ``self``.
    return jnp.ravel(self)[_strided_indices(size, stride, storage_offset)]


def _split_bounds(sizes):
    start = 0
    for n in sizes:
        yield start, start + n
        start += n


def _split_at(self, sizes, dim):
    dim = _dim(dim, self.ndim)
    if sum(sizes) != self.shape[dim]:
        raise RuntimeError(
            f"split_with_sizes expects split_sizes to sum exactly to {self.shape[dim]} (input "
            f"tensor's size at dimension {dim}), but got split_sizes={list(sizes)}"
        )
    return [jax.lax.slice_in_dim(self, a, b, axis=dim) for a, b in _split_bounds(sizes)]


@lowering(aten.split.Tensor, aten.split_copy.Tensor, aten.unsafe_split.Tensor)
def split(self, split_size, dim=0):
    length = self.shape[_dim(dim, self.ndim)]
    if split_size == 0:
        sizes = [0] if length == 0 else None
        if sizes is None:
            raise RuntimeError(
                f"split_size can only be 0 if dimension size is 0, but got dimension size of {length}"
            )
    else:
        sizes = [split_size] * (length // split_size)
        if length % split_size or length == 0:
            sizes.append(length % split_size)
    return _split_at(self, sizes, dim)


@lowering(
    aten.split_with_sizes.default,
    aten.split_with_sizes_copy.default,
    aten.unsafe_split_with_sizes.default,
)
def split_with_sizes(self, split_sizes, dim=0):
    return _split_at(self, list(split_sizes), dim)


@lowering(aten.unbind.int, aten.unbind_copy.int)
def unbind(self, dim=0):
    dim = _dim(dim, self.ndim)
    return [jax.lax.index_in_dim(self, i, dim, keepdims=False) for i in range(self.shape[dim])]


@lowering(
    aten.alias_copy.default,
    aten.clone.default,
    aten.detach_copy.default,
    aten.lift_fresh_copy.default,
)
def clone(self, *, memory_format=None):
    # jax.Arrays are immutable and torchlax writes replace the array: sharing is a copy.
    return self


@lowering(aten.copy.default)
def copy(self, src, non_blocking=False):
    # Functionalized copy_ (AOT autograd writes `x.copy_(y)` as this): src in self's shape and
    # dtype, its own values unread.
    return jnp.broadcast_to(src.astype(self.dtype), self.shape)


# -- views that reinterpret the element type --------------------------------------------------


def _as_units(self):
    """``self`` as unsigned integers of its element size (complex: of its component size)."""
    if self.dtype == jnp.bool_:
        return self.astype(jnp.uint8)
    if jnp.issubdtype(self.dtype, jnp.complexfloating):
        self = jnp.stack([jnp.real(self), jnp.imag(self)], axis=-1)
        self = self.reshape(*self.shape[:-2], -1)
    return jax.lax.bitcast_convert_type(self, jnp.dtype(f"uint{self.dtype.itemsize * 8}"))


def _from_units(units, dtype):
    if dtype == jnp.bool_:
        return units != 0
    if jnp.issubdtype(dtype, jnp.complexfloating):
        part = jnp.float32 if dtype == jnp.complex64 else jnp.float64
        pairs = jax.lax.bitcast_convert_type(units, part).reshape(*units.shape[:-1], -1, 2)
        return jax.lax.complex(pairs[..., 0], pairs[..., 1])
    return jax.lax.bitcast_convert_type(units, dtype)


@lowering(aten.view.dtype, aten.view_copy.dtype)
def view_dtype(self, dtype):
    target = jax_dtype(dtype)
    if target == self.dtype:
        return self
    same_size = self.dtype.itemsize == target.itemsize
    if same_size and target.kind != "c" and self.dtype.kind != "c":
        return _from_units(_as_units(self), target)
    if self.ndim == 0 and not same_size:
        raise RuntimeError(
            f"self.dim() cannot be 0 to view {torch_dtype(self.dtype)} as {dtype} "
            "(different element sizes)"
        )
    if self.size == 0:  # (no bytes to regroup: the reshape below needs some)
        last = self.shape[-1] * self.dtype.itemsize // target.itemsize
        return jnp.zeros((*self.shape[:-1], last), target)
    # Through bytes: split every element, then regroup the last dim for the target.
    source = self[..., None] if same_size else self
    data = jax.lax.bitcast_convert_type(_as_units(source), jnp.uint8).reshape(
        *source.shape[:-1], -1
    )
    if data.shape[-1] % target.itemsize:
        raise RuntimeError(
            f"self.size(-1) must be divisible by {target.itemsize // self.dtype.itemsize} to view "
            f"{torch_dtype(self.dtype)} as {dtype} (different element sizes), but got {self.shape[-1]}"
        )
    unit = target.itemsize // 2 if target.kind == "c" else target.itemsize
    if unit > 1:
        data = jax.lax.bitcast_convert_type(
            data.reshape(*data.shape[:-1], -1, unit), f"uint{unit * 8}"
        )
    out = _from_units(data, target)
    return out.reshape(self.shape) if same_size else out


@lowering(aten.view_as_real.default, aten.view_as_real_copy.default)
def view_as_real(self):
    return jnp.stack([jnp.real(self), jnp.imag(self)], axis=-1)


@lowering(aten.view_as_complex.default, aten.view_as_complex_copy.default)
def view_as_complex(self):
    if self.ndim == 0 or self.shape[-1] != 2:
        raise RuntimeError("view_as_complex: Tensor must have a last dimension of size 2")
    if self.dtype not in (jnp.float32, jnp.float64):
        raise RuntimeError(
            "view_as_complex is only supported for float and double tensors, but got a tensor of "
            f"scalar type: {torch_dtype(self.dtype)}"
        )
    return jax.lax.complex(self[..., 0], self[..., 1])


@lowering(aten.real.default)
def real(self):
    return jnp.real(self)


@lowering(aten.imag.default)
def imag(self):
    if not jnp.issubdtype(self.dtype, jnp.complexfloating):
        raise RuntimeError("imag is not implemented for tensors with non-complex dtypes.")
    return jnp.imag(self)


# -- new arrays from old ones ------------------------------------------------------------------


def _is_legacy_empty(a):
    # PyTorch's cat skips 1-D empty tensors whatever the other inputs' shapes.
    return a.ndim == 1 and a.shape[0] == 0


@lowering(aten.cat.default)
def cat(tensors, dim=0):
    dtype = _promoted(tensors)
    kept = [a for a in tensors if not _is_legacy_empty(a)]
    if not kept:
        return jnp.zeros((0,), dtype)
    dim = _dim(dim, kept[0].ndim)
    return jnp.concatenate([a.astype(dtype) for a in kept], axis=dim)


@lowering(aten.stack.default)
def stack(tensors, dim=0):
    dtype = _promoted(tensors)
    dim = _dim(dim, tensors[0].ndim + 1)
    return jnp.stack([a.astype(dtype) for a in tensors], axis=dim)


@lowering(aten._chunk_cat.default)
def chunk_cat(tensors, dim, num_chunks):
    """Each tensor split into ``num_chunks`` along ``dim`` (zero-padded to divide evenly); chunk i
    of every tensor, flattened past ``dim``, concatenated into row i."""
    if not tensors:
        raise RuntimeError("_chunk_cat expects a non-empty input tensor list")
    if num_chunks < 1:
        raise RuntimeError("_chunk_cat expects positive num_chunks")
    dtype = tensors[0].dtype
    if any(a.dtype != dtype for a in tensors):
        raise RuntimeError("_chunk_cat expects all input tensors with the same dtype")
    dim = _dim(dim, tensors[0].ndim)
    rows = []
    for a in tensors:
        chunk = -(-a.shape[dim] // num_chunks)
        padding = [(0, 0)] * a.ndim
        padding[dim] = (0, chunk * num_chunks - a.shape[dim])
        padded = jnp.pad(a.astype(dtype), padding)
        width = chunk * int(np.prod(a.shape[dim + 1 :], dtype=np.int64))
        rows.append(padded.reshape(a.shape[:dim] + (num_chunks, width)))
    return jnp.concatenate(rows, axis=dim + 1)


@lowering(aten.flip.default)
def flip(self, dims):
    wrapped = tuple(_dim(d, self.ndim) for d in dims)
    for i, d in enumerate(wrapped):
        if d in wrapped[:i]:
            raise RuntimeError(f"dim {d} appears multiple times in the list of dims")
    if self.ndim == 0:
        return self
    return jnp.flip(self, wrapped)


@lowering(aten.roll.default)
def roll(self, shifts, dims=()):
    if not dims:
        return jnp.roll(jnp.ravel(self), tuple(shifts)).reshape(self.shape)
    return jnp.roll(self, tuple(shifts), tuple(_dim(d, self.ndim) for d in dims))


@lowering(aten.rot90.default)
def rot90(self, k=1, dims=(0, 1)):
    # PyTorch's checks, in its order and words
    if len(dims) != 2:
        raise RuntimeError(f"expected total rotation dims == 2, but got dims = {len(dims)}")
    if self.ndim < 2:
        raise RuntimeError(f"expected total dims >= 2, but got total dims = {self.ndim}")
    first, second = _dim(dims[0], self.ndim), _dim(dims[1], self.ndim)
    if first == second:
        raise RuntimeError(
            f"expected rotation dims to be different, but got dim0 = {dims[0]} and dim1 = {dims[1]}"
        )
    return jnp.rot90(self, k, (first, second))


@lowering(aten.repeat.default)
def repeat(self, repeats):
    if len(repeats) < self.ndim:
        raise RuntimeError(
            "Number of dimensions of repeat dims can not be smaller than number of dimensions of tensor"
        )
    self = jnp.reshape(self, (1,) * (len(repeats) - self.ndim) + self.shape)
    return jnp.tile(self, tuple(repeats))


@lowering(aten.tril.default)
def tril(self, diagonal=0):
    return jnp.tril(self, diagonal)


@lowering(aten.triu.default)
def triu(self, diagonal=0):
    return jnp.triu(self, diagonal)


@lowering(aten.constant_pad_nd.default)
def constant_pad_nd(self, pad, value=0):
    if len(pad) % 2 or len(pad) // 2 > self.ndim:
        raise RuntimeError(
            f"constant_pad_nd: padding length ({len(pad)}) must be even and at most twice the "
            f"number of dimensions of the input ({self.ndim})."
        )
    config = [(0, 0, 0)] * self.ndim
    for i in range(len(pad) // 2):
        config[self.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1], 0)
    # lax.pad crops for negative widths, as PyTorch does.
    return jax.lax.pad(self, _scalar_as(value, self.dtype), config)


@lowering(aten.diag_embed.default)
def diag_embed(self, offset=0, dim1=-2, dim2=-1):
    ndim = self.ndim + 1
    dim1, dim2 = _dim(dim1, ndim), _dim(dim2, ndim)
    n = self.shape[-1] + abs(offset)
    rows = jnp.arange(self.shape[-1]) + max(-offset, 0)
    cols = jnp.arange(self.shape[-1]) + max(offset, 0)
    out = jnp.zeros((*self.shape[:-1], n, n), self.dtype).at[..., rows, cols].set(self)
    # The two new dims go to dim1 and dim2; the batch dims keep their order elsewhere.
    order = [d for d in range(ndim) if d not in (dim1, dim2)]
    positions = [0] * ndim
    for src, d in enumerate(order):
        positions[d] = src
    positions[dim1], positions[dim2] = ndim - 2, ndim - 1
    return jnp.transpose(out, positions)


@lowering(aten.block_diag.default)
def block_diag(tensors):
    dtype = _promoted(tensors)
    blocks = [jnp.reshape(a, (1, a.size)) if a.ndim < 2 else a for a in tensors]
    blocks = [b.astype(dtype) for b in blocks]
    out = jnp.zeros((sum(b.shape[0] for b in blocks), sum(b.shape[1] for b in blocks)), dtype)
    row = col = 0
    for b in blocks:
        out = jax.lax.dynamic_update_slice(out, b, (row, col))
        row, col = row + b.shape[0], col + b.shape[1]
    return out


# -- writing values ---------------------------------------------------------------------------


@lowering(aten.fill.Scalar)
def fill(self, value):
    return jnp.full(self.shape, _scalar_as(value, self.dtype), self.dtype)


@lowering(aten.fill.Tensor)
def fill_tensor(self, value):
    if value.ndim != 0:
        raise RuntimeError(
            f"fill_ only supports 0-dimension value tensor but got tensor with {value.ndim} dimensions."
        )
    return jnp.broadcast_to(_scalar_as(value, self.dtype), self.shape)


@lowering(aten.zero.default)
def zero(self):
    return jnp.zeros_like(self)


def _masked_value(value, dtype):
    if isinstance(value, jax.Array) and value.ndim != 0:
        raise RuntimeError(
            "masked_fill_ only supports a 0-dimensional value tensor, but got tensor with "
            f"{value.ndim} dimension(s)."
        )
    return _scalar_as(value, dtype)


@lowering(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(self, mask, value):
    if mask.dtype != jnp.bool_:
        raise RuntimeError(
            f"masked_fill_ only supports boolean masks, but got mask with dtype {torch_dtype(mask.dtype)}"
        )
    return jnp.where(mask, _masked_value(value, self.dtype), self)


@lowering(aten.where.self, promote=Promotion.NO_OPMATH, args=("self", "other"))
def where(condition, self, other):
    return jnp.where(condition.astype(jnp.bool_), self, other)


@lowering(aten.masked_scatter.default)
def masked_scatter(self, mask, source):
    # The k-th selected position takes source's k-th element: a running count, no nonzero.
    shape = jnp.broadcast_shapes(self.shape, mask.shape)
    self, mask = jnp.broadcast_to(self, shape), jnp.broadcast_to(mask, shape)
    flat_mask = jnp.ravel(mask)
    position = jnp.cumsum(flat_mask, dtype=jnp.int64) - 1
    source = jnp.ravel(source).astype(self.dtype)
    if source.size == 0:
        return self
    picked = source[jnp.clip(position, 0, source.size - 1)]
    return jnp.where(flat_mask, picked, jnp.ravel(self)).reshape(shape)


# -- the *_scatter ops functionalization writes views back with --------------------------------


def _scatter_into(self, src, view_fn):
    index = view_fn(jnp.arange(self.size, dtype=jnp.int64).reshape(self.shape))
    flat = (
        jnp.ravel(self)
        .at[jnp.ravel(index)]
        .set(jnp.ravel(jnp.broadcast_to(src, index.shape)).astype(self.dtype))
    )
    return flat.reshape(self.shape)


@lowering(aten.slice_scatter.default)
def slice_scatter(self, src, dim=0, start=None, end=None, step=1):
    dim = _dim(dim, self.ndim)
    return self.at[_slice_key(self.ndim, dim, start, end, step)].set(src.astype(self.dtype))


@lowering(aten.select_scatter.default)
def select_scatter(self, src, dim, index):
    dim = _dim(dim, self.ndim)
    index = _index_in(index, self.shape[dim], dim)
    return self.at[(slice(None),) * dim + (index,)].set(src.astype(self.dtype))


@lowering(aten.diagonal_scatter.default)
def diagonal_scatter(self, src, offset=0, dim1=0, dim2=1):
    return _scatter_into(self, src, lambda a: diagonal(a, offset, dim1, dim2))


@lowering(aten.as_strided_scatter.default)
def as_strided_scatter(self, src, size, stride, storage_offset=None):
    return _scatter_into(self, src, lambda a: as_strided(a, size, stride, storage_offset))
