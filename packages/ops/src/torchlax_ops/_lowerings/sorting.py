"""Sorting and searching: ``sort``, ``argsort``, ``topk``, ``kthvalue``, ``searchsorted``,
``bucketize``.
"""

from __future__ import annotations

import jax
import jax.core
import jax.numpy as jnp
import torch
from jax import lax
from torchlax_core import jax_dtype, torch_dtype

from .. import _aten
from .._table import lowering
from ._common import _scalar_name
from .shape import _dim

aten = _aten.aten  # (an op this torch lacks: a Missing, skipped)


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
