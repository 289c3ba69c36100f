"""Embedding lookups: ``embedding`` (with renorm and dense backward) and ``embedding_bag``."""

from __future__ import annotations

import jax
import jax.core
import jax.numpy as jnp
from torchlax_core import check_index

from .. import _aten
from .._table import lowering

aten = _aten.aten  # (an op this torch lacks: a Missing, skipped)


@lowering(aten.embedding.default)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    check_index(indices, 0, weight.shape[0], IndexError, "index out of range in self")
    return jnp.take(weight, indices, axis=0)


@lowering(aten.embedding_renorm.default, opmath=True, args=("self",))
def embedding_renorm(self, indices, max_norm, norm_type):
    # Each row that ``indices`` names and whose p-norm exceeds max_norm is scaled down to it.
    rows = self
    named = jnp.zeros((self.shape[0],), jnp.bool_).at[indices.reshape(-1)].set(True)
    if norm_type == float("inf"):
        norms = jnp.max(jnp.abs(rows), axis=1)
    else:
        norms = jnp.sum(jnp.abs(rows) ** norm_type, axis=1) ** (1.0 / norm_type)
    scale = jnp.where(named & (norms > max_norm), max_norm / (norms + 1e-7), 1)
    return rows * scale[:, None]


@lowering(aten.embedding_dense_backward.default, opmath=True, args=("grad_output",))
def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    flat = indices.reshape(-1)
    grad = grad_output.reshape(flat.shape[0], -1)
    if padding_idx >= 0:
        grad = jnp.where((flat == padding_idx)[:, None], 0, grad)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), grad.dtype).at[flat].add(1)
        grad = grad / counts[flat][:, None]
    return jnp.zeros((num_weights, grad.shape[1]), grad.dtype).at[flat].add(grad)


def _embedding_bag(
    weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx
):
    """(output, offset2bag, bag_size, max_indices) as PyTorch's CPU kernel returns them.

    Bag b holds the indices from offsets[b] on; indices equal to ``padding_idx`` count for
    nothing, and an empty bag gives zeros. With ``include_last_offset`` the last bag runs to
    the end of ``indices``, except on PyTorch's fast path (sum/mean of float32/half weights, no
    padding_idx), which stops it at offsets[-1] (while mean still divides by the longer count).
    """
    index_dtype = indices.dtype
    count = indices.shape[0]
    bags = offsets.shape[0] - (1 if include_last_offset else 0)
    position = jnp.arange(count, dtype=offsets.dtype)
    bag = jnp.searchsorted(offsets[:bags], position, side="right").astype(index_dtype) - 1
    valid = indices != padding_idx if padding_idx >= 0 else jnp.ones((count,), jnp.bool_)
    sizes = jax.ops.segment_sum(valid.astype(index_dtype), bag, num_segments=bags)
    # Half-precision weights arrive in float32 (opmath): they take the fast path too.
    fast = mode != 2 and weight.dtype == jnp.float32 and padding_idx < 0
    rows = jnp.take(weight, indices, axis=0)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights[:, None]
    if mode == 2:  # max: PyTorch keeps the first index reaching the maximum
        candidates = jnp.where(valid[:, None], rows, -jnp.inf)
        best = jax.ops.segment_max(candidates, bag, num_segments=bags)
        hit = valid[:, None] & (candidates == best[bag])
        first = jax.ops.segment_min(
            jnp.where(hit, jnp.arange(count)[:, None], count), bag, num_segments=bags
        )
        max_indices = jnp.where(first < count, jnp.take(indices, jnp.minimum(first, count - 1)), 0)
        return (
            jnp.where(sizes[:, None] > 0, best, 0).astype(weight.dtype),
            bag,
            sizes,
            max_indices.astype(index_dtype),
        )
    summed = valid & (position < offsets[-1]) if fast and include_last_offset else valid
    out = jax.ops.segment_sum(jnp.where(summed[:, None], rows, 0), bag, num_segments=bags)
    if mode == 1:
        out = out / jnp.maximum(sizes, 1)[:, None].astype(out.dtype)
        return out.astype(weight.dtype), bag, sizes, sizes
    # Sum mode leaves bag_size and max_indices unset (zeros, one per offset); its fast path
    # does not compute offset2bag either.
    unset = jnp.zeros(offsets.shape, index_dtype)
    offset2bag = jnp.zeros((0,), index_dtype) if fast else bag
    return out.astype(weight.dtype), offset2bag, unset, unset


@lowering(
    aten._embedding_bag.default,
    aten._embedding_bag_forward_only.default,
    opmath=True,
    args=("weight", "per_sample_weights"),
)
def _embedding_bag_forward(
    weight,
    indices,
    offsets,
    scale_grad_by_freq=False,
    mode=0,
    sparse=False,
    per_sample_weights=None,
    include_last_offset=False,
    padding_idx=-1,
):
    return _embedding_bag(
        weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx
    )


def _bag_of_each_index(indices, offsets, bags):
    position = jnp.arange(indices.shape[0], dtype=offsets.dtype)
    return jnp.searchsorted(offsets[:bags], position, side="right") - 1


@lowering(aten._embedding_bag_backward.default, opmath=True, args=("grad", "per_sample_weights"))
def _embedding_bag_backward(
    grad,
    indices,
    offsets,
    offset2bag,
    bag_size,
    maximum_indices,
    num_weights,
    scale_grad_by_freq,
    mode,
    sparse,
    per_sample_weights,
    padding_idx=-1,
):
    # Dense gradient of the weight. Bags come from the offsets (sum mode's fast path leaves
    # offset2bag empty); each index adds its bag's gradient (scaled as the forward scaled it).
    g = grad
    bags = grad.shape[0]
    if mode == 2:  # max: each feature's gradient goes to the row that won it
        filled = (bag_size > 0)[:, None]
        columns = jnp.broadcast_to(jnp.arange(g.shape[1]), g.shape)
        rows = jnp.where(filled, maximum_indices, 0)
        out = (
            jnp.zeros((num_weights, g.shape[1]), g.dtype)
            .at[rows, columns]
            .add(jnp.where(filled, g, 0))
        )
        return out.astype(grad.dtype)
    bag = _bag_of_each_index(indices, offsets, bags)
    rows = g[bag]
    if mode == 1:
        rows = rows / jnp.maximum(bag_size[bag], 1)[:, None].astype(g.dtype)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights[:, None]
    keep = indices != padding_idx if padding_idx >= 0 else jnp.ones(indices.shape, jnp.bool_)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), g.dtype).at[indices].add(1)
        rows = rows / counts[indices][:, None]
    out = (
        jnp.zeros((num_weights, g.shape[1]), g.dtype)
        .at[indices]
        .add(jnp.where(keep[:, None], rows, 0))
    )
    return out.astype(grad.dtype)


@lowering(
    aten._embedding_bag_per_sample_weights_backward.default, opmath=True, args=("grad", "weight")
)
def _embedding_bag_per_sample_weights_backward(
    grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1
):
    # d loss / d per_sample_weights[i] = <grad of i's bag, weight row of index i> (sum mode).
    bag = _bag_of_each_index(indices, offsets, grad.shape[0])
    dots = jnp.sum(grad[bag] * jnp.take(weight, indices, axis=0), axis=1)
    if padding_idx >= 0:
        dots = jnp.where(indices == padding_idx, 0, dots)
    return dots.astype(grad.dtype)
