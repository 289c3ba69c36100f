"""Pooling: max, average, adaptive (average and max) and fractional max pooling, with backward.

Backward ops are the ``jax.vjp`` of the forward in opmath, or a scatter to the saved indices.
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


def _windows(x, kernel, stride, padding, dilation, ceil_mode, fill):
    """Stack every window element: (..., *out, K) values, plus static (out..., K) positions."""
    n = len(kernel)
    spatial = x.shape[-n:]
    outs = [
        _pool_geometry(s, k, st, p, d, ceil_mode)
        for s, k, st, p, d in zip(spatial, kernel, stride, padding, dilation, strict=True)
    ]
    config = [(0, 0, 0)] * (x.ndim - n)
    for s, k, st, p, d, o in zip(spatial, kernel, stride, padding, dilation, outs, strict=True):
        high = max((o - 1) * st + d * (k - 1) + 1 - (s + p), 0)
        config.append((p, high, 0))
    padded = jax.lax.pad(x, jnp.asarray(fill, x.dtype), config)
    lead = x.ndim - n
    slices, positions = [], []
    for offset in itertools.product(*(range(k) for k in kernel)):
        starts = [0] * lead + [o * d for o, d in zip(offset, dilation, strict=True)]
        limits = list(x.shape[:lead]) + [
            start + (o - 1) * st + 1
            for start, o, st in zip(starts[lead:], outs, stride, strict=True)
        ]
        slices.append(jax.lax.slice(padded, starts, limits, [1] * lead + list(stride)))
        grids = np.meshgrid(
            *[
                np.arange(o) * st - p + off * d
                for o, st, p, off, d in zip(outs, stride, padding, offset, dilation, strict=True)
            ],
            indexing="ij",
        )
        positions.append(np.stack(grids, axis=-1))
    return jnp.stack(slices, axis=-1), np.stack(positions, axis=-2), outs  # positions: (*out, K, n)


def _lowest(dtype):
    if jnp.issubdtype(dtype, jnp.floating):
        return -jnp.inf
    return jnp.iinfo(dtype).min


def _window_max(values, valid, flat, dtype):
    """Each window's maximum over its valid positions (last axis) and its flat input index
    (``flat``, int64), as max pooling returns them."""
    values = jnp.where(valid, values, _lowest(dtype))
    # (index_dtype int32: a 64-bit one is narrowed when a caller's jax.jit lowers without x64)
    best = jax.lax.argmax(values, values.ndim - 1, jnp.int32)[..., None]
    out = jnp.take_along_axis(values, best, axis=-1)[..., 0]
    flat = jnp.broadcast_to(jnp.asarray(flat, jnp.int64), values.shape)
    return out, jnp.take_along_axis(flat, best, axis=-1)[..., 0]


def _max_pool(self, kernel_size, stride, padding, dilation, ceil_mode, n):
    kernel = _ntuple(kernel_size, n)
    stride = _ntuple(stride, n) if stride else kernel
    padding, dilation = _ntuple(padding, n), _ntuple(dilation, n)
    values, positions, _ = _windows(
        self, kernel, stride, padding, dilation, ceil_mode, _lowest(self.dtype)
    )
    spatial = np.array(self.shape[-n:])
    valid = np.all((positions >= 0) & (positions < spatial), axis=-1)
    flat = np.sum(positions * np.concatenate([np.cumprod(spatial[::-1])[::-1][1:], [1]]), axis=-1)
    return _window_max(values, valid, flat, self.dtype)


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


@lowering(aten.max_pool2d_with_indices_backward.default, opmath=True, args=("grad_output", "self"))
def max_pool2d_with_indices_backward(
    grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices
):
    return _scatter_to_indices(grad_output, self, indices, 2)


@lowering(aten.max_pool3d_with_indices_backward.default, opmath=True, args=("grad_output", "self"))
def max_pool3d_with_indices_backward(
    grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices
):
    return _scatter_to_indices(grad_output, self, indices, 3)


def _avg_pool(
    self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, n
):
    kernel = _ntuple(kernel_size, n)
    stride = _ntuple(stride, n) if stride else kernel
    padding = _ntuple(padding, n)
    values, positions, outs = _windows(self, kernel, stride, padding, (1,) * n, ceil_mode, 0)
    total = jnp.sum(values, axis=-1)
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
    return _window_max(values, valid, flat, self.dtype)


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
