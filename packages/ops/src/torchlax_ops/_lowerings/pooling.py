"""Pooling: max, average, adaptive (average and max) and fractional max pooling, with backward.

Backward ops are the ``jax.vjp`` of the forward in opmath, or a scatter to the saved indices
(adaptive and fractional max pooling); max pooling's own, forward and backward, gather and
scatter nothing (over every window, both serialize on a TPU).
``adaptive_avg_pool3d`` computes in the input dtype step by step, as its scalar CPU kernel does;
the larger kernels are ``jax.jit``-compiled per configuration, so an eager call is one XLA
computation.
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.core
import jax.numpy as jnp
import numpy as np

from .. import _aten
from .._promotion import HALF
from .._table import lowering
from ._common import HIGHEST, _ntuple, _vjp

aten = _aten.aten  # (an op this torch lacks: a Missing, skipped)


# -- pooling --------------------------------------------------------------------------------------


def _pool_geometry(in_size, kernel, stride, padding, dilation, ceil_mode):
    """Output length of one pooled dimension, as PyTorch's pooling_output_shape computes it."""
    numerator = in_size + 2 * padding - dilation * (kernel - 1) - 1
    out = (numerator + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= in_size + padding:
        out -= 1
    return out


def _window_shape(spatial, kernel, stride, padding, dilation, ceil_mode):
    """The output lengths, and the input padding (low, high) each dimension needs."""
    outs = [
        _pool_geometry(s, k, st, p, d, ceil_mode)
        for s, k, st, p, d in zip(spatial, kernel, stride, padding, dilation, strict=True)
    ]
    pads = [
        (p, max((o - 1) * st + d * (k - 1) + 1 - (s + p), 0))
        for s, k, st, p, d, o in zip(spatial, kernel, stride, padding, dilation, outs, strict=True)
    ]
    return outs, pads


def _window_grid(spatial, kernel, stride, padding, dilation, ceil_mode):
    """``_window_shape``, and every window element's input position, (*out, K, n), K in the
    order PyTorch scans a window."""
    outs, pads = _window_shape(spatial, kernel, stride, padding, dilation, ceil_mode)
    positions = []
    for offset in itertools.product(*(range(k) for k in kernel)):
        grids = np.meshgrid(
            *[
                np.arange(o) * st - p + off * d
                for o, st, p, off, d in zip(outs, stride, padding, offset, dilation, strict=True)
            ],
            indexing="ij",
        )
        positions.append(np.stack(grids, axis=-1))
    return outs, pads, np.stack(positions, axis=-2)


def _windows(x, kernel, stride, padding, dilation, ceil_mode, fill):
    """Every window element's values: one strided slice of the padded input (..., *out) per
    element, in scan order, with the static grid (``_window_grid``)."""
    n = len(kernel)
    lead = x.ndim - n
    outs, pads, positions = _window_grid(x.shape[-n:], kernel, stride, padding, dilation, ceil_mode)
    config = [(0, 0, 0)] * lead + [(low, high, 0) for low, high in pads]
    padded = jax.lax.pad(x, jnp.asarray(fill, x.dtype), config)
    slices = []
    for offset in itertools.product(*(range(k) for k in kernel)):
        starts = [0] * lead + [o * d for o, d in zip(offset, dilation, strict=True)]
        limits = list(x.shape[:lead]) + [
            start + (o - 1) * st + 1
            for start, o, st in zip(starts[lead:], outs, stride, strict=True)
        ]
        slices.append(jax.lax.slice(padded, starts, limits, [1] * lead + list(stride)))
    return slices, positions, outs


def _lowest(dtype):
    if jnp.issubdtype(dtype, jnp.floating):
        return -jnp.inf
    return jnp.iinfo(dtype).min


def _flat_positions(positions, spatial):
    """Each position's flat index in its plane, (*out, K), and whether it is inside the input."""
    spatial = np.array(spatial)
    valid = np.all((positions >= 0) & (positions < spatial), axis=-1)
    row = np.concatenate([np.cumprod(spatial[::-1])[::-1][1:], [1]])
    return np.sum(positions * row, axis=-1), valid


def _index_dtype(plane):
    # Narrow while the plane allows (a TPU emulates int64); returned as int64.
    return np.int32 if plane < 2**31 else np.int64


def _window_max(elements, valid, flat, dtype, plane):
    """Each window's maximum and its flat input index (int64), as PyTorch's CPU kernels scan
    a window: an element replaces the best so far when larger or NaN (the last NaN wins); a
    window holding only its dtype's lowest value answers its first valid position.
    ``elements``: one array (..., *out) per window element in scan order; ``valid`` and
    ``flat``: static (*out, K). Selects only: no stacked windows, no gather (slow on a TPU)."""
    index_dtype = _index_dtype(plane)
    first = np.take_along_axis(flat, np.argmax(valid, axis=-1)[..., None], -1)[..., 0]
    best = jnp.full(elements[0].shape, _lowest(dtype), dtype)
    index = jnp.broadcast_to(jnp.asarray(first, index_dtype), best.shape)
    floating = jnp.issubdtype(dtype, jnp.floating)
    for k, value in enumerate(elements):
        take = value > best
        if floating:
            take = take | jnp.isnan(value)
        if not valid[..., k].all():
            take = take & valid[..., k]
        best = jnp.where(take, value, best)
        index = jnp.where(take, jnp.asarray(flat[..., k], index_dtype), index)
    return best, index.astype(jnp.int64)


def _pool_arguments(kernel_size, stride, padding, dilation, n):
    kernel = _ntuple(kernel_size, n)
    stride = _ntuple(stride, n) if stride else kernel
    return kernel, stride, _ntuple(padding, n), _ntuple(dilation, n)


def _max_pool(self, kernel_size, stride, padding, dilation, ceil_mode, n):
    geometry = (
        *_pool_arguments(kernel_size, stride, padding, dilation, n),
        ceil_mode,
        tuple(self.shape[-n:]),
    )
    return _max_pool_windows(self, geometry)


def _better(a, b):
    """Of two (value, flat index) candidates, the one PyTorch's CPU kernel keeps scanning a
    window: a NaN (of two, the later), else the larger value, else the earlier. A total
    order, so the reduction's grouping cannot change the answer; (lowest, past the plane) is
    its identity: a window of only its dtype's lowest value answers its first position."""
    (a_value, a_index), (b_value, b_index) = a, b
    a_nan, b_nan = jnp.isnan(a_value), jnp.isnan(b_value)
    keep_a = jnp.where(
        a_nan | b_nan,
        a_nan & (~b_nan | (a_index > b_index)),
        (a_value > b_value) | ((a_value == b_value) & (a_index < b_index)),
    )
    return jnp.where(keep_a, a_value, b_value), jnp.where(keep_a, a_index, b_index)


def _max_pool_pairs(x, geometry) -> tuple:
    """Max pooling's values and int64 flat indices as one reduction over (value, position)
    pairs: no stacked windows, no gather, and a producer XLA materializes once (a chain of
    selects would be fused, and recomputed, into each of the backward's comparisons).
    ``geometry``: (kernel, stride, padding, dilation, ceil_mode, spatial shape)."""
    kernel, stride, padding, dilation, ceil_mode, spatial = geometry
    lead = x.ndim - len(spatial)
    outs, pads = _window_shape(spatial, kernel, stride, padding, dilation, ceil_mode)
    plane = int(np.prod(spatial, dtype=np.int64))
    index_dtype = _index_dtype(plane)
    flat = jnp.broadcast_to(jnp.arange(plane, dtype=index_dtype).reshape(spatial), x.shape)
    values, index = jax.lax.reduce_window(
        (x, flat),
        (jnp.asarray(_lowest(x.dtype), x.dtype), jnp.asarray(plane, index_dtype)),
        _better,
        (1,) * lead + tuple(kernel),
        (1,) * lead + tuple(stride),
        [(0, 0)] * lead + pads,
        window_dilation=(1,) * lead + tuple(dilation),
    )
    window = tuple(slice(0, o) for o in outs)
    return values[(..., *window)], index[(..., *window)].astype(jnp.int64)


def _max_pool_windows_forward(x, geometry):
    pooled = _max_pool_pairs(x, geometry)
    return pooled, pooled[1]  # (the indices: all the backward needs)


def _max_pool_windows_backward(geometry, index, cotangents):
    return (_spread(cotangents[0], index, geometry),)


#: ``_max_pool_pairs`` with its backward as ``max_pool2d_with_indices_backward``'s: under
#: ``jax.grad`` (``torchlax.functional``) too, no scatter.
_max_pool_windows = jax.custom_vjp(_max_pool_pairs, nondiff_argnums=(1,))
_max_pool_windows.defvjp(_max_pool_windows_forward, _max_pool_windows_backward)


@lowering(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(self, kernel_size, stride, padding, dilation, ceil_mode, 2)


@lowering(aten.max_pool3d_with_indices.default)
def max_pool3d_with_indices(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(self, kernel_size, stride, padding, dilation, ceil_mode, 3)


def _scatter_to_indices(grad_output, self, indices, n):
    """Add each output gradient into the input position its index names (max/adaptive pools)."""
    lead = self.shape[:-n]
    rows = int(np.prod(lead, dtype=np.int64))
    plane = int(np.prod(self.shape[-n:], dtype=np.int64))
    grad = grad_output.reshape(rows, -1)
    where = indices.reshape(rows, -1)
    out = jnp.zeros((rows, plane), grad.dtype).at[jnp.arange(rows)[:, None], where].add(grad)
    return out.reshape(self.shape).astype(self.dtype)


def _spread(grad, indices, geometry):
    """Each window's gradient added into the input position its index names, for indices as
    max pooling returns them (one of the window's own positions): per window element, the
    gradients whose index is that element's position, spread back onto the input by a padding
    (the strided slice's inverse), summed. Dense selects and pads: a scatter to the indices
    serializes on a TPU."""
    kernel, stride, padding, dilation, ceil_mode, spatial = geometry
    shape = tuple(indices.shape[: indices.ndim - len(spatial)]) + tuple(spatial)
    outs, _, positions = _window_grid(spatial, kernel, stride, padding, dilation, ceil_mode)
    total = jnp.zeros(shape, grad.dtype)
    if 0 in outs:
        return total
    flat, valid = _flat_positions(positions, spatial)
    index_dtype = _index_dtype(int(np.prod(spatial, dtype=np.int64)))
    indices = indices.astype(index_dtype)
    zero = jnp.zeros((), grad.dtype)
    lead = [(0, 0, 0)] * (len(shape) - len(spatial))
    for k, offset in enumerate(itertools.product(*(range(kk) for kk in kernel))):
        hit = indices == jnp.asarray(flat[..., k], index_dtype)
        if not valid[..., k].all():
            hit = hit & valid[..., k]
        config = [
            (off * d - p, s - (off * d - p + (o - 1) * st + 1), st - 1)
            for s, o, st, p, off, d in zip(
                spatial, outs, stride, padding, offset, dilation, strict=True
            )
        ]
        total = total + jax.lax.pad(jnp.where(hit, grad, zero), zero, lead + config)
    return total


def _max_pool_backward(
    grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices, n
):
    geometry = (
        *_pool_arguments(kernel_size, stride, padding, dilation, n),
        ceil_mode,
        tuple(self.shape[-n:]),
    )
    return _spread(grad_output, indices, geometry).astype(self.dtype)


@lowering(aten.max_pool2d_with_indices_backward.default, opmath=True, args=("grad_output", "self"))
def max_pool2d_with_indices_backward(
    grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices
):
    return _max_pool_backward(
        grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices, 2
    )


@lowering(aten.max_pool3d_with_indices_backward.default, opmath=True, args=("grad_output", "self"))
def max_pool3d_with_indices_backward(
    grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices
):
    return _max_pool_backward(
        grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices, 3
    )


def _avg_pool(
    self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, n
):
    kernel = _ntuple(kernel_size, n)
    stride = _ntuple(stride, n) if stride else kernel
    padding = _ntuple(padding, n)
    values, positions, outs = _windows(self, kernel, stride, padding, (1,) * n, ceil_mode, 0)
    total = jnp.sum(jnp.stack(values, axis=-1), axis=-1)
    if divisor_override:
        divisor = np.full(outs, divisor_override)
    else:
        spatial = np.array(self.shape[-n:])
        if count_include_pad:
            # The window clipped to the padded extent (ceil_mode's overhang does not count).
            inside = np.all(positions < spatial + np.array(padding), axis=-1)
        else:
            inside = np.all((positions >= 0) & (positions < spatial), axis=-1)
        divisor = inside.sum(axis=-1)
    # Integer inputs average in integers, as PyTorch's CPU kernel (opmath only widens half).
    return (total / jnp.asarray(divisor, total.dtype)).astype(self.dtype)


@lowering(aten.avg_pool2d.default, opmath=True)
def avg_pool2d(
    self,
    kernel_size,
    stride=(),
    padding=0,
    ceil_mode=False,
    count_include_pad=True,
    divisor_override=None,
):
    return _avg_pool(
        self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 2
    )


@lowering(aten.avg_pool3d.default, opmath=True)
def avg_pool3d(
    self,
    kernel_size,
    stride=(),
    padding=0,
    ceil_mode=False,
    count_include_pad=True,
    divisor_override=None,
):
    return _avg_pool(
        self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 3
    )


@lowering(aten.avg_pool2d_backward.default, opmath=True)
def avg_pool2d_backward(
    grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
):
    return _vjp(
        lambda x: _avg_pool(
            x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 2
        ),
        self,
        grad_output,
    )


@lowering(aten.avg_pool3d_backward.default, opmath=True)
def avg_pool3d_backward(
    grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
):
    return _vjp(
        lambda x: _avg_pool(
            x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 3
        ),
        self,
        grad_output,
    )


def _adaptive_bounds(in_size, out_size):
    starts = [(i * in_size) // out_size for i in range(out_size)]
    ends = [-(-((i + 1) * in_size) // out_size) for i in range(out_size)]
    return starts, ends


def _adaptive_avg(self, output_size):
    n = len(output_size)
    x = self
    for axis, out_size in zip(range(self.ndim - n, self.ndim), output_size, strict=True):
        in_size = self.shape[axis]
        starts, ends = _adaptive_bounds(in_size, out_size)
        weights = np.zeros((out_size, in_size))
        for o, (s, e) in enumerate(zip(starts, ends, strict=True)):
            weights[o, s:e] = 1.0 / (e - s)
        x = jnp.moveaxis(
            jnp.tensordot(x, jnp.asarray(weights, x.dtype), axes=[[axis], [1]], precision=HIGHEST),
            -1,
            axis,
        )
    return x.astype(self.dtype)  # integers stay integers (opmath only widens half)


@lowering(aten._adaptive_avg_pool2d.default, opmath=True)
def _adaptive_avg_pool(self, output_size):
    return _adaptive_avg(self, output_size)


@lowering(aten._adaptive_avg_pool2d_backward.default, opmath=True)
def _adaptive_avg_pool2d_backward(grad_output, self):
    return _vjp(lambda x: _adaptive_avg(x, grad_output.shape[-2:]), self, grad_output)


@lowering(aten._adaptive_avg_pool3d_backward.default, opmath=True)
def _adaptive_avg_pool3d_backward(grad_output, self):
    return _vjp(lambda x: _adaptive_avg(x, grad_output.shape[-3:]), self, grad_output)


def _adaptive_max(self, output_size):
    n = len(output_size)
    lead = self.ndim - n
    gathered = self
    picks, valids = [], []
    for d, out_size in enumerate(output_size):
        in_size = self.shape[lead + d]
        starts, ends = _adaptive_bounds(in_size, out_size)
        width = max(e - s for s, e in zip(starts, ends, strict=True))
        offsets = np.arange(width)
        index = np.minimum(np.array(starts)[:, None] + offsets, in_size - 1)  # (out, width)
        picks.append(index)
        valids.append(offsets < (np.array(ends) - np.array(starts))[:, None])
    # Gather every candidate: (..., o1, w1, o2, w2, ...), then move the windows last.
    for d, index in enumerate(picks):
        axis = lead + 2 * d
        gathered = jnp.take(gathered, jnp.asarray(index.reshape(-1)), axis=axis)
        gathered = gathered.reshape(
            gathered.shape[:axis] + index.shape + gathered.shape[axis + 1 :]
        )
    order = (
        list(range(lead)) + [lead + 2 * d for d in range(n)] + [lead + 2 * d + 1 for d in range(n)]
    )
    gathered = jnp.transpose(gathered, order)
    out_shape = gathered.shape[: lead + n]
    widths = gathered.shape[lead + n :]
    values = gathered.reshape(*out_shape, -1)
    valid = np.ones(tuple(output_size) + tuple(widths), bool)
    flat = np.zeros(tuple(output_size) + tuple(widths), np.int64)
    strides = np.concatenate([np.cumprod(np.array(self.shape[lead:])[::-1])[::-1][1:], [1]])
    for d in range(n):
        shape = [1] * (2 * n)
        shape[d], shape[n + d] = picks[d].shape
        valid &= valids[d].reshape(shape)
        flat += picks[d].reshape(shape) * strides[d]
    valid = valid.reshape(*output_size, -1)
    flat = flat.reshape(*output_size, -1)
    plane = int(np.prod(self.shape[lead:], dtype=np.int64))
    return _window_max(
        [values[..., k] for k in range(values.shape[-1])], valid, flat, self.dtype, plane
    )


@lowering(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default)
def adaptive_max_pool(self, output_size):
    return _adaptive_max(self, output_size)


@lowering(aten.adaptive_max_pool2d_backward.default, opmath=True, args=("grad_output", "self"))
def adaptive_max_pool2d_backward(grad_output, self, indices):
    return _scatter_to_indices(grad_output, self, indices, 2)


@lowering(aten.adaptive_max_pool3d_backward.default, opmath=True, args=("grad_output", "self"))
def adaptive_max_pool3d_backward(grad_output, self, indices):
    return _scatter_to_indices(grad_output, self, indices, 3)


# -- adaptive average pooling, 3-d ----------------------------------------------------------------


def _adaptive_windows(in_size, out_size):
    """Per output index: the window's first input index and length (PyTorch's start/end_index)."""
    starts, ends = map(np.array, _adaptive_bounds(in_size, out_size))
    return starts, ends - starts


@lowering(aten._adaptive_avg_pool3d.default)
def _adaptive_avg_pool3d(self, output_size):
    return _adaptive_avg_pool3d_kernel(self, tuple(output_size))


@functools.partial(jax.jit, static_argnums=1)
def _adaptive_avg_pool3d_kernel(self, output_size):
    # PyTorch's CPU kernel sums each window in the input dtype, element by element in (t, h, w)
    # order, then divides by kT, kH and kW in turn; a bfloat16 sum is rounded at every step.
    lead = self.ndim - 3
    gathered, lengths, widths = self, [], []
    for d, out_size in enumerate(output_size):
        starts, length = _adaptive_windows(self.shape[lead + d], out_size)
        width = int(length.max())
        index = np.minimum(starts[:, None] + np.arange(width), self.shape[lead + d] - 1)
        valid = np.arange(width) < length[:, None]
        axis = lead + 2 * d
        taken = jnp.take(gathered, jnp.asarray(index.reshape(-1)), axis=axis)
        gathered = taken.reshape(taken.shape[:axis] + index.shape + taken.shape[axis + 1 :])
        mask_shape = [1] * gathered.ndim
        mask_shape[axis], mask_shape[axis + 1] = valid.shape
        gathered = jnp.where(valid.reshape(mask_shape), gathered, jnp.zeros((), self.dtype))
        lengths.append(length)
        widths.append(width)
    order = [*range(lead), lead, lead + 2, lead + 4, lead + 1, lead + 3, lead + 5]
    windows = jnp.transpose(gathered, order).reshape(
        *self.shape[:lead], *output_size, int(np.prod(widths))
    )
    if self.dtype in HALF:
        total = jnp.zeros(windows.shape[:-1], self.dtype)
        for k in range(windows.shape[-1]):  # static window size: the kernel's rounding order
            total = total + windows[..., k]
    else:
        total = jnp.sum(windows, axis=-1)
    for d, length in enumerate(lengths):
        shape = [1] * 3
        shape[d] = -1
        total = total / jnp.asarray(length.reshape(shape), self.dtype)
    return total


# -- fractional max pooling -----------------------------------------------------------------------


def _fractional_starts(sample, in_size, out_size, pool):
    """Window starts per (batch, plane), from its random sample, in the sample's dtype."""
    last = jnp.full(sample.shape + (1,), in_size - pool, jnp.int64)
    if out_size == 1:
        return last
    dtype = sample.dtype
    alpha = jnp.asarray(in_size - pool, dtype) / jnp.asarray(out_size - 1, dtype)
    i = jnp.arange(out_size - 1).astype(dtype)
    starts = (
        ((i + sample[..., None]) * alpha).astype(jnp.int32)
        - (sample * alpha).astype(jnp.int32)[..., None]
    ).astype(jnp.int64)
    return jnp.concatenate([starts, last], axis=-1)


def _fractional_max_pool(self, kernel_size, output_size, random_samples, n):
    return _fractional_max_pool_kernel(
        self, _ntuple(kernel_size, n), _ntuple(output_size, n), random_samples, n
    )


@functools.partial(jax.jit, static_argnums=(1, 2, 4))
def _fractional_max_pool_kernel(self, pool, out, random_samples, n):
    name = f"fractional_max_pool{n}d"
    unbatched = self.ndim == n + 1
    x = self[None] if unbatched else self
    sizes = x.shape[2:]
    for size, k, o, axis in zip(sizes, pool, out, "THW"[-n:], strict=True):
        if o + k - 1 > size:
            raise RuntimeError(
                f"{name}(): pool size {k} along {axis} is too large for the input "
                f"size {size} and output size {o}; use a smaller kernel_size or "
                "output_size."
            )
    samples = random_samples[: x.shape[0]].astype(x.dtype)
    # The samples' last axis is (W, H) for 2-d pooling and (T, H, W) for 3-d.
    which = (1, 0) if n == 2 else (0, 1, 2)
    # Candidate positions per axis: (N, C, out, pool), each window scanned in row-major order.
    positions = [
        _fractional_starts(samples[..., which[d]], sizes[d], out[d], pool[d])[..., None]
        + jnp.arange(pool[d])
        for d in range(n)
    ]
    flat = jnp.zeros((), jnp.int64)
    for d in range(n):
        shape = [*x.shape[:2]] + [1] * (2 * n)
        shape[2 + d], shape[2 + n + d] = out[d], pool[d]
        flat = flat * sizes[d] + positions[d].reshape(shape)
    flat = flat.reshape(*x.shape[:2], *out, -1)
    values = jnp.take_along_axis(
        x.reshape(*x.shape[:2], -1), flat.reshape(*x.shape[:2], -1), axis=2
    ).reshape(flat.shape)
    # The kernel keeps the first maximum, but a NaN replaces anything: the last NaN wins.
    first_max = jnp.argmax(values, axis=-1)
    is_nan = jnp.isnan(values)
    last_nan = values.shape[-1] - 1 - jnp.argmax(is_nan[..., ::-1], axis=-1)
    best = jnp.where(jnp.any(is_nan, axis=-1), last_nan, first_max)[..., None]
    output = jnp.take_along_axis(values, best, axis=-1)[..., 0]
    indices = jnp.take_along_axis(flat, best, axis=-1)[..., 0]
    if unbatched:
        return output[0], indices[0]
    return output, indices


@lowering(aten.fractional_max_pool2d.default)
def fractional_max_pool2d(self, kernel_size, output_size, random_samples):
    return _fractional_max_pool(self, kernel_size, output_size, random_samples, 2)


@lowering(aten.fractional_max_pool3d.default)
def fractional_max_pool3d(self, kernel_size, output_size, random_samples):
    return _fractional_max_pool(self, kernel_size, output_size, random_samples, 3)


@lowering(aten.fractional_max_pool2d_backward.default, opmath=True, args=("grad_output", "self"))
def fractional_max_pool2d_backward(grad_output, self, kernel_size, output_size, indices):
    return _scatter_to_indices(grad_output, self, indices, 2)


@lowering(aten.fractional_max_pool3d_backward.default, opmath=True, args=("grad_output", "self"))
def fractional_max_pool3d_backward(grad_output, self, kernel_size, output_size, indices):
    return _scatter_to_indices(grad_output, self, indices, 3)
