"""Spatial ops: convolution, affine grids and grid sampling, antialiased resampling, fractional
max pooling and 3-d adaptive average pooling.

Each follows the arithmetic of PyTorch's CPU kernel, rounding where it rounds: half-precision
convolution accumulates in float32 and rounds once (bias included); the grid samplers'
half-precision path and ``adaptive_avg_pool3d`` compute in the input dtype step by step, as
their scalar kernels do. Backward ops are the ``jax.vjp`` of the forward, computed in opmath.
The larger kernels are ``jax.jit``-compiled per configuration, so an eager call is one XLA
computation rather than dozens of small ones.
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import torch

from .._table import lowering
from .nn import _HALF, _adaptive_bounds, _ntuple, _scatter_to_indices, _up

aten = torch.ops.aten
HIGHEST = jax.lax.Precision.HIGHEST


# -- convolution --------------------------------------------------------------------------------


def _conv(input, weight, stride, padding, dilation, transposed, output_padding, groups):
    """The convolution in its accumulation dtype (float32 for half inputs), not yet rounded."""
    spatial = weight.ndim - 2
    unbatched = input.ndim == weight.ndim - 1
    if unbatched:
        input = input[None]
    stride, padding, dilation = (_ntuple(v, spatial) for v in (stride, padding, dilation))
    acc = jnp.float32 if input.dtype in _HALF else None
    if not 1 <= spatial <= 3:
        raise NotImplementedError(
            f"torchlax lowers convolutions of 1 to 3 spatial dimensions; aten.convolution got a "
            f"weight of {weight.ndim} dimensions."
        )
    letters = "DHW"[-spatial:]
    numbers = ("NC" + letters, "OI" + letters, "NC" + letters)
    if not transposed:
        out = jax.lax.conv_general_dilated(
            input,
            weight,
            window_strides=stride,
            padding=[(p, p) for p in padding],
            rhs_dilation=dilation,
            dimension_numbers=numbers,
            feature_group_count=groups,
            precision=HIGHEST,
            preferred_element_type=acc,
        )
    else:
        # A transposed convolution is the input-gradient of a convolution: dilate the input by
        # the stride and convolve with the flipped kernel, its in/out channels swapped per group.
        output_padding = _ntuple(output_padding, spatial)
        cin, cout_g = weight.shape[:2]
        kernel = weight.reshape(groups, cin // groups, cout_g, *weight.shape[2:])
        kernel = jnp.swapaxes(kernel, 1, 2).reshape(
            groups * cout_g, cin // groups, *weight.shape[2:]
        )
        kernel = jnp.flip(kernel, axis=tuple(range(2, weight.ndim)))
        pads = [
            (d * (k - 1) - p, d * (k - 1) - p + op)
            for k, p, d, op in zip(weight.shape[2:], padding, dilation, output_padding, strict=True)
        ]
        out = jax.lax.conv_general_dilated(
            input,
            kernel,
            window_strides=(1,) * spatial,
            padding=pads,
            lhs_dilation=stride,
            rhs_dilation=dilation,
            dimension_numbers=numbers,
            feature_group_count=groups,
            precision=HIGHEST,
            preferred_element_type=acc,
        )
    return out[0] if unbatched else out


@lowering(aten.convolution.default)
def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    out = _conv(input, weight, stride, padding, dilation, transposed, output_padding, groups)
    if bias is not None:
        # oneDNN adds the bias to the float32 accumulator: a half result is rounded once.
        channel_axis = 0 if input.ndim == weight.ndim - 1 else 1
        shape = [1] * out.ndim
        shape[channel_axis] = -1
        out = out + bias.astype(out.dtype).reshape(shape)
    return out.astype(input.dtype)


@lowering(aten._convolution.default)
def _convolution(
    input,
    weight,
    bias,
    stride,
    padding,
    dilation,
    transposed,
    output_padding,
    groups,
    benchmark,
    deterministic,
    cudnn_enabled,
    allow_tf32,
):
    return convolution(
        input, weight, bias, stride, padding, dilation, transposed, output_padding, groups
    )


@lowering(aten.convolution_backward.default)
def convolution_backward(
    grad_output,
    input,
    weight,
    bias_sizes,
    stride,
    padding,
    dilation,
    transposed,
    output_padding,
    groups,
    output_mask,
):
    def forward(x, w):
        return _conv(x, w, stride, padding, dilation, transposed, output_padding, groups).astype(
            x.dtype
        )

    _, pull = jax.vjp(forward, input, weight)
    grad_input, grad_weight = pull(grad_output.astype(input.dtype))
    grad_bias = None
    if output_mask[2]:
        batched = input.ndim == weight.ndim
        axes = tuple(i for i in range(grad_output.ndim) if i != (1 if batched else 0))
        grad_bias = jnp.sum(_up(grad_output), axis=axes).astype(grad_output.dtype)
    return (
        grad_input if output_mask[0] else None,
        grad_weight if output_mask[1] else None,
        grad_bias,
    )


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
    if self.dtype in _HALF:
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


# -- grid sampling ----------------------------------------------------------------------------------

_BILINEAR, _NEAREST, _BICUBIC = 0, 1, 2
_ZEROS, _BORDER, _REFLECTION = 0, 1, 2


def _unnormalize(coord, size, align_corners, fused):
    """Grid coordinate in [-1, 1] -> input pixel coordinate."""
    if fused:  # PyTorch's vectorized float kernel: one multiply-add
        return coord * ((size - 1) / 2 if align_corners else size / 2) + (size - 1) / 2
    if align_corners:
        return (coord + 1) / 2 * (size - 1)
    return ((coord + 1) * size - 1) / 2


def _clip(coord, size):
    # where, not clip: the gradient is zero on and beyond the borders, as in PyTorch.
    high = size - 1
    return jnp.where(
        coord <= 0,
        jnp.zeros((), coord.dtype),
        jnp.where(coord >= high, jnp.asarray(high, coord.dtype), coord),
    )


def _reflect(coord, twice_low, twice_high):
    if twice_low == twice_high:
        return jnp.zeros_like(coord)
    low = jnp.asarray(twice_low, coord.dtype) / 2
    span = jnp.asarray(twice_high - twice_low, coord.dtype) / 2
    distance = jnp.abs(coord - low)
    extra = jnp.fmod(distance, span)
    flips = jnp.floor(distance / span)
    even = jnp.fmod(flips.astype(jnp.float32), 2) == 0
    return jnp.where(even, extra + low, span - extra + low)


def _pad_coordinate(coord, size, padding_mode, align_corners):
    if padding_mode == _BORDER:
        return _clip(coord, size)
    if padding_mode == _REFLECTION:
        if align_corners:
            coord = _reflect(coord, 0, 2 * (size - 1))
        else:
            coord = _reflect(coord, -1, 2 * size - 1)
        return _clip(coord, size)
    return coord


def _gather_corners(input, corners):
    """Values at each corner (a list of integer coordinates per spatial axis), 0 outside.

    One gather for all corners: (N, C, K, *grid) for K corners, plus the (N, 1, K, *grid)
    in-bounds mask.
    """
    sizes = input.shape[2:]
    indices, masks = [], []
    for corner in corners:
        index = jnp.zeros_like(corner[0])
        valid = jnp.ones(corner[0].shape, bool)
        for position, size in zip(corner, sizes, strict=True):
            index = index * size + position
            valid &= (position >= 0) & (position < size)
        indices.append(index)
        masks.append(valid)
    index, valid = jnp.stack(indices, axis=1), jnp.stack(masks, axis=1)[:, None]
    n, c = input.shape[:2]
    flat = input.reshape(n, c, -1)
    where = jnp.clip(index, 0, flat.shape[-1] - 1).reshape(n, 1, -1)
    values = jnp.take_along_axis(flat, jnp.broadcast_to(where, (n, c, where.shape[-1])), axis=2)
    values = values.reshape(n, c, *index.shape[1:])
    return jnp.where(valid, values, jnp.zeros((), values.dtype)), valid


def _cubic_coefficients(t):
    a = -0.75

    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return far(t + 1), near(t), near(1 - t), far((1 - t) + 1)


def _cubic_interp(values, t):
    c0, c1, c2, c3 = _cubic_coefficients(t)
    return values[0] * c0 + values[1] * c1 + values[2] * c2 + values[3] * c3


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def _grid_sample(input, grid, interpolation_mode, padding_mode, align_corners):
    """grid_sampler_2d/3d in the dtype of ``input``, step by step as PyTorch's CPU kernels."""
    n = grid.shape[-1]
    sizes = input.shape[2:]
    # PyTorch's 2-d float kernel is vectorized (a fused unnormalize); the rest are scalar loops.
    fused = n == 2 and input.dtype not in _HALF
    # Per spatial axis (D, H, W order); the grid's last dimension lists them as (x, y[, z]).
    coords = [grid[..., n - 1 - d] for d in range(n)]
    if interpolation_mode == _BICUBIC:
        if n != 2:
            raise RuntimeError("grid_sampler_3d: bicubic interpolation only supports 4-D input.")
        source = [
            _unnormalize(c, s, align_corners, fused) for c, s in zip(coords, sizes, strict=True)
        ]
        base = [jnp.floor(s) for s in source]
        fractions = [s - b for s, b in zip(source, base, strict=True)]
        taps = [
            [
                jax.lax.stop_gradient(
                    _pad_coordinate(b + (k - 1), size, padding_mode, align_corners)
                ).astype(jnp.int64)
                for k in range(4)
            ]
            for b, size in zip(base, sizes, strict=True)
        ]
        values, _ = _gather_corners(input, [(y, x) for y in taps[0] for x in taps[1]])
        rows = [
            _cubic_interp([values[:, :, 4 * i + j] for j in range(4)], fractions[1][:, None])
            for i in range(4)
        ]
        return _cubic_interp(rows, fractions[0][:, None])

    source = [
        _pad_coordinate(_unnormalize(c, s, align_corners, fused), s, padding_mode, align_corners)
        for c, s in zip(coords, sizes, strict=True)
    ]
    if interpolation_mode == _NEAREST:
        values, _ = _gather_corners(input, [[jnp.round(s).astype(jnp.int64) for s in source]])
        return values[:, :, 0]

    low = [jnp.floor(s).astype(jnp.int64) for s in source]
    offsets = list(itertools.product((0, 1), repeat=n))  # nw, ne, sw, se (t before b in 3-d)
    values, valid = _gather_corners(
        input, [[lo + o for lo, o in zip(low, corner, strict=True)] for corner in offsets]
    )
    out = jnp.zeros(values.shape[:2] + values.shape[3:], input.dtype)
    for k, corner in enumerate(offsets):
        # Weight: the product of the distances to the opposite corner, x first, then y, then z.
        weight = None
        for d in reversed(range(n)):
            if corner[d]:
                factor = source[d] - low[d].astype(input.dtype)
            else:
                factor = (low[d] + 1).astype(input.dtype) - source[d]
            weight = factor if weight is None else weight * factor
        # Accumulated corner by corner in the input dtype, skipping corners outside the input.
        out = jnp.where(valid[:, :, k], out + values[:, :, k] * weight[:, None], out)  # pyright: ignore[reportOptionalSubscript]  (n >= 1, so the loop above set weight)
    return out


@lowering(aten.grid_sampler_2d.default, aten.grid_sampler_3d.default)
def grid_sampler(input, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sample(input, grid, interpolation_mode, padding_mode, align_corners)


@lowering(aten.grid_sampler_2d_backward.default, aten.grid_sampler_3d_backward.default)
def grid_sampler_backward(
    grad_output, input, grid, interpolation_mode, padding_mode, align_corners, output_mask
):
    grad_input, grad_grid = _grid_sample_vjp(
        grad_output, input, grid, interpolation_mode, padding_mode, align_corners
    )
    return grad_input if output_mask[0] else None, grad_grid


@functools.partial(jax.jit, static_argnums=(3, 4, 5))
def _grid_sample_vjp(grad_output, input, grid, interpolation_mode, padding_mode, align_corners):
    def forward(x, g):
        return _grid_sample(x, g, interpolation_mode, padding_mode, align_corners)

    out, pull = jax.vjp(forward, _up(input), _up(grid))
    grad_input, grad_grid = pull(grad_output.astype(out.dtype))
    return grad_input.astype(input.dtype), grad_grid.astype(grid.dtype)


def _linspace_from_neg_one(steps, align_corners, dtype):
    """PyTorch's base-grid axis, rounded to ``dtype`` at each of its steps."""
    if steps <= 1:
        return jnp.zeros((steps,), dtype)
    points = jnp.linspace(-1, 1, steps, dtype=jnp.float32 if dtype in _HALF else dtype)
    points = points.astype(dtype)
    if not align_corners:
        points = points * (steps - 1) / steps
    return points


@lowering(aten.affine_grid_generator.default)
def affine_grid_generator(theta, size, align_corners):
    # The base grid of (x, y[, z], 1) rows, one per output position, times theta transposed.
    spatial = size[2:]
    axes = [_linspace_from_neg_one(s, align_corners, theta.dtype) for s in reversed(spatial)]
    mesh = jnp.meshgrid(*reversed(axes), indexing="ij")[::-1]  # x varies fastest, as in PyTorch
    base = jnp.stack([*mesh, jnp.ones(tuple(spatial), theta.dtype)], axis=-1)
    out = jnp.einsum(
        "pk,nik->npi", _up(base.reshape(-1, len(spatial) + 1)), _up(theta), precision=HIGHEST
    )
    return out.reshape(size[0], *spatial, len(spatial)).astype(theta.dtype)


# -- antialiased resampling -----------------------------------------------------------------------


def _linear_filter(x):
    x = np.abs(x)
    return np.where(x < 1, 1 - x, 0).astype(x.dtype)


def _cubic_filter(x):
    a = -0.5  # Keys' kernel, as PIL and PyTorch's antialiased bicubic use
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x < 1, near, np.where(x < 2, far, 0)).astype(x.dtype)


def _aa_matrix(in_size, out_size, align_corners, scale, taps, kernel, acc):
    """(out, in) interpolation weights of PyTorch's antialiased (PIL-style) separable resize."""
    if align_corners:
        ratio = acc(in_size - 1) / acc(out_size - 1) if out_size > 1 else acc(0)
    elif scale is not None and scale > 0:
        ratio = acc(1.0 / scale)
    else:
        ratio = acc(in_size) / acc(out_size)
    # Mixed float/double steps as the kernel's (double literals promote, stores round).
    support = acc(taps * 0.5 * float(ratio)) if ratio >= 1 else acc(taps * 0.5)
    max_taps = int(np.ceil(support)) * 2 + 1
    inverse = acc(1.0 / float(ratio)) if ratio >= 1 else acc(1)
    matrix = np.zeros((out_size, in_size), acc)
    for i in range(out_size):
        center = acc(float(ratio) * (i + 0.5))
        start = max(int(float(center - support) + 0.5), 0)
        count = min(max(min(int(float(center + support) + 0.5), in_size) - start, 0), max_taps)
        offsets = (np.arange(count) + start).astype(acc) - center
        weights = kernel(((offsets.astype(np.float64) + 0.5) * float(inverse)).astype(acc))
        total = acc(0)
        for w in weights:  # the kernel's sequential sum
            total = acc(total + w)
        if total != 0:
            weights = (weights / total).astype(acc)
        matrix[i, start : start + count] = weights
    return matrix


def _resample_aa(self, output_size, align_corners, scales, taps, kernel):
    x = _up(self)
    acc = np.float64 if x.dtype == jnp.float64 else np.float32
    # PyTorch resamples the last (contiguous) axis first, and skips axes whose size is unchanged.
    for d in reversed(range(len(output_size))):
        axis = self.ndim - len(output_size) + d
        if x.shape[axis] == output_size[d]:
            continue
        matrix = _aa_matrix(
            x.shape[axis], output_size[d], align_corners, scales[d], taps, kernel, acc
        )
        x = jnp.moveaxis(
            jnp.tensordot(x, jnp.asarray(matrix), axes=[[axis], [1]], precision=HIGHEST), -1, axis
        )
    return x.astype(self.dtype)


def _aa_lowering(op, backward_op, taps, kernel):
    @lowering(op)
    def upsample_aa(self, output_size, align_corners, scales_h=None, scales_w=None):
        return _resample_aa(self, output_size, align_corners, (scales_h, scales_w), taps, kernel)

    @lowering(backward_op)
    def upsample_aa_backward(
        grad_output, output_size, input_size, align_corners, scales_h=None, scales_w=None
    ):
        def forward(x):
            return _resample_aa(x, output_size, align_corners, (scales_h, scales_w), taps, kernel)

        zeros = jnp.zeros(tuple(input_size), _up(grad_output).dtype)
        out, pull = jax.vjp(forward, zeros)
        return pull(_up(grad_output).astype(out.dtype))[0].astype(grad_output.dtype)


_aa_lowering(
    aten._upsample_bilinear2d_aa.default,
    aten._upsample_bilinear2d_aa_backward.default,
    2,
    _linear_filter,
)
_aa_lowering(
    aten._upsample_bicubic2d_aa.default,
    aten._upsample_bicubic2d_aa_backward.default,
    4,
    _cubic_filter,
)


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


@lowering(aten.fractional_max_pool2d_backward.default)
def fractional_max_pool2d_backward(grad_output, self, kernel_size, output_size, indices):
    return _scatter_to_indices(grad_output, self, indices, 2)


@lowering(aten.fractional_max_pool3d_backward.default)
def fractional_max_pool3d_backward(grad_output, self, kernel_size, output_size, indices):
    return _scatter_to_indices(grad_output, self, indices, 3)
