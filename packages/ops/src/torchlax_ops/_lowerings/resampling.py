"""Resampling: nearest/linear upsampling, antialiased resampling, grid sampling and affine grids,
pixel shuffle, with backward.

Backward ops are the ``jax.vjp`` of the forward, computed in opmath. The grid samplers'
half-precision path computes in the input dtype step by step, as their scalar kernels do.
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.core
import jax.numpy as jnp
import numpy as np

from .. import _aten
from .._promotion import HALF, up
from .._table import lowering, named, op_name
from ._common import HIGHEST, _vjp

aten = _aten.aten  # (an op this torch lacks: a Missing, skipped)


# -- resampling ---------------------------------------------------------------------------------


def _scale_value(scale, in_size, out_size):
    return (
        np.float32(1.0 / scale)
        if scale is not None and scale > 0
        else np.float32(in_size / out_size)
    )


def _nearest_index(in_size, out_size, scale, exact):
    dst = np.arange(out_size)
    if not exact and out_size == in_size:
        return dst
    if not exact and out_size == 2 * in_size:
        return dst >> 1
    s = _scale_value(scale, in_size, out_size)
    src = (dst.astype(np.float32) + (np.float32(0.5) if exact else 0)) * s
    return np.minimum(np.floor(src).astype(np.int64), in_size - 1)


def _nearest(self, output_size, scales, exact=False):
    n = len(output_size)
    out = self
    for d, (size, scale) in enumerate(zip(output_size, scales, strict=True)):
        axis = self.ndim - n + d
        out = jnp.take(
            out, jnp.asarray(_nearest_index(self.shape[axis], size, scale, exact)), axis=axis
        )
    return out


def _linear_taps(in_size, out_size, align_corners, scale, dtype):
    acc = np.float64 if dtype == jnp.float64 else np.float32
    dst = np.arange(out_size, dtype=acc)
    if align_corners:
        ratio = acc((in_size - 1) / (out_size - 1)) if out_size > 1 else acc(0)
        src = ratio * dst
    else:
        ratio = acc(1.0 / scale) if scale is not None and scale > 0 else acc(in_size / out_size)
        src = np.maximum(ratio * (dst + acc(0.5)) - acc(0.5), acc(0))
    low = src.astype(np.int64)
    high = low + (low < in_size - 1)
    weight_high = src - low
    return low, high, acc(1) - weight_high, weight_high


def _linear(self, output_size, align_corners, scales):
    n = len(output_size)
    out = self
    for d, (size, scale) in enumerate(zip(output_size, scales, strict=True)):
        axis = self.ndim - n + d
        low, high, w_low, w_high = _linear_taps(
            self.shape[axis], size, align_corners, scale, out.dtype
        )
        shape = [1] * out.ndim
        shape[axis] = size
        out = jnp.take(out, jnp.asarray(low), axis=axis) * jnp.asarray(w_low, out.dtype).reshape(
            shape
        ) + jnp.take(out, jnp.asarray(high), axis=axis) * jnp.asarray(w_high, out.dtype).reshape(
            shape
        )
    return out


def _nearest_lowering(op, backward_op, n, exact):
    def upsample(self, output_size, *scales):
        return _nearest(self, output_size, _ntuple_scales(scales, n), exact)

    def upsample_backward(grad_output, output_size, input_size, *scales):
        zeros = jnp.zeros(tuple(input_size), grad_output.dtype)
        return _vjp(
            lambda x: _nearest(x, output_size, _ntuple_scales(scales, n), exact), zeros, grad_output
        )

    lowering(op)(named(op_name(op), upsample))
    lowering(backward_op, opmath=True)(named(op_name(backward_op), upsample_backward))


def _linear_lowering(op, backward_op, n):
    def upsample(self, output_size, align_corners, *scales):
        return _linear(self, output_size, align_corners, _ntuple_scales(scales, n))

    def upsample_backward(grad_output, output_size, input_size, align_corners, *scales):
        zeros = jnp.zeros(tuple(input_size), grad_output.dtype)
        return _vjp(
            lambda x: _linear(x, output_size, align_corners, _ntuple_scales(scales, n)),
            zeros,
            grad_output,
        )

    lowering(op, opmath=True)(named(op_name(op), upsample))
    lowering(backward_op, opmath=True)(named(op_name(backward_op), upsample_backward))


def _ntuple_scales(scales, n):
    return tuple(scales) + (None,) * (n - len(scales))


for _n, _dims in ((1, "1d"), (2, "2d"), (3, "3d")):
    _nearest_lowering(
        getattr(aten, f"upsample_nearest{_dims}").default,
        getattr(aten, f"upsample_nearest{_dims}_backward").default,
        _n,
        exact=False,
    )
    _nearest_lowering(
        getattr(aten, f"_upsample_nearest_exact{_dims}").default,
        getattr(aten, f"_upsample_nearest_exact{_dims}_backward").default,
        _n,
        exact=True,
    )
_linear_lowering(aten.upsample_linear1d.default, aten.upsample_linear1d_backward.default, 1)
_linear_lowering(aten.upsample_bilinear2d.default, aten.upsample_bilinear2d_backward.default, 2)
_linear_lowering(aten.upsample_trilinear3d.default, aten.upsample_trilinear3d_backward.default, 3)


# -- pixel shuffle ------------------------------------------------------------------------------


@lowering(aten.pixel_shuffle.default)
def pixel_shuffle(self, upscale_factor):
    r = upscale_factor
    *lead, c, h, w = self.shape
    x = self.reshape(*lead, c // (r * r), r, r, h, w)
    k = len(lead)
    x = jnp.transpose(x, (*range(k), k, k + 3, k + 1, k + 4, k + 2))
    return x.reshape(*lead, c // (r * r), h * r, w * r)


@lowering(aten.pixel_unshuffle.default)
def pixel_unshuffle(self, downscale_factor):
    r = downscale_factor
    *lead, c, h, w = self.shape
    x = self.reshape(*lead, c, h // r, r, w // r, r)
    k = len(lead)
    x = jnp.transpose(x, (*range(k), k, k + 2, k + 4, k + 1, k + 3))
    return x.reshape(*lead, c * r * r, h // r, w // r)


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
    fused = n == 2 and input.dtype not in HALF
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


@lowering(aten.grid_sampler_2d_backward.default, aten.grid_sampler_3d_backward.default, opmath=True)
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

    out, pull = jax.vjp(forward, input, grid)
    grad_input, grad_grid = pull(grad_output.astype(out.dtype))
    return grad_input.astype(input.dtype), grad_grid.astype(grid.dtype)


def _linspace_from_neg_one(steps, align_corners, dtype):
    """PyTorch's base-grid axis, rounded to ``dtype`` at each of its steps."""
    if steps <= 1:
        return jnp.zeros((steps,), dtype)
    points = jnp.linspace(-1, 1, steps, dtype=jnp.float32 if dtype in HALF else dtype)
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
        "pk,nik->npi", up(base.reshape(-1, len(spatial) + 1)), up(theta), precision=HIGHEST
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
    x = self
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
    return x


def _aa_lowering(op, backward_op, taps, kernel):
    def upsample_aa(self, output_size, align_corners, scales_h=None, scales_w=None):
        return _resample_aa(self, output_size, align_corners, (scales_h, scales_w), taps, kernel)

    def upsample_aa_backward(
        grad_output, output_size, input_size, align_corners, scales_h=None, scales_w=None
    ):
        def forward(x):
            return _resample_aa(x, output_size, align_corners, (scales_h, scales_w), taps, kernel)

        return _vjp(forward, jnp.zeros(tuple(input_size), grad_output.dtype), grad_output)

    lowering(op, opmath=True)(named(op_name(op), upsample_aa))
    lowering(backward_op, opmath=True)(named(op_name(backward_op), upsample_aa_backward))


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
