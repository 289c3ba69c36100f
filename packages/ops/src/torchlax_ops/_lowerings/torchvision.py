"""torchvision's detection ops (``torchvision::nms``, ``roi_align``, ``roi_pool``,
``ps_roi_align``, ``deform_conv2d`` and the backward ops their autograd calls).

They exist only once torchvision is imported, so they are recorded by name and found on first
use (``_table.named_lowering``); torchlax never imports torchvision itself. Each follows
torchvision's CPU kernel: the same sampling points, clamping and averaging, in the input's
dtype.

Bilinear sampling is separable: the sum over a bin's sampling points of
``w_y * w_x * input[y, x]`` is ``Wy @ input @ Wx^T`` with ``Wy`` (rows) and ``Wx`` (columns)
holding each point's two interpolation weights, so ``roi_align``/``ps_roi_align`` are two small
matrix products per ROI and never gather per-point. Their backward ops are the VJPs of the same
(linear) functions.

``nms`` returns as many indices as boxes survive: it runs eagerly on the host and raises
``DataDependentShapeError`` under tracing. ``roi_align``/``ps_roi_align`` with
``sampling_ratio <= 0`` size each ROI's sampling grid from its (traced) coordinates, so under
tracing they need ``sampling_ratio > 0`` (torchvision's detection heads pass 2).
"""

from __future__ import annotations

import jax
import jax.core
import jax.numpy as jnp
import numpy as np

from .._table import named_lowering
from ._common import HIGHEST
from .indexing import DataDependentShapeError


def _traced(*arrays) -> bool:
    return any(isinstance(a, jax.core.Tracer) for a in arrays)


def _divide(a, b):
    """``a / b`` as one correctly rounded float division, as torchvision's C++ divides.

    XLA rewrites a division by a constant, or by one value broadcast over many, into a
    multiplication by its reciprocal, an ulp off at times (7 / 3 gives 2.3333335, and 3 times
    that ceils to 8): bin edges and sampling points that land on an integer move. A divisor of
    the full shape behind an optimization barrier is divided elementwise, as written.
    """
    a = jnp.asarray(a)
    shape = jnp.broadcast_shapes(a.shape, jnp.shape(b))
    divisor = jax.lax.optimization_barrier(jnp.broadcast_to(jnp.asarray(b, a.dtype), shape))
    return jnp.broadcast_to(a, shape) / divisor


# -- nms ------------------------------------------------------------------------------------------


@named_lowering("torchvision::nms")
def nms(dets, scores, iou_threshold):
    op = "torchvision.ops.nms"
    if dets.ndim != 2 or dets.shape[-1] != 4:
        raise RuntimeError(
            f"{op}: boxes should be a 2-d tensor of shape (N, 4), got {tuple(dets.shape)}."
        )
    if scores.ndim != 1 or scores.shape[0] != dets.shape[0]:
        raise RuntimeError(
            f"{op}: scores should be a 1-d tensor with one score per box, got "
            f"{tuple(scores.shape)} for {dets.shape[0]} boxes."
        )
    if _traced(dets, scores):
        raise DataDependentShapeError(
            f"{op} returns as many indices as boxes survive, a shape that depends on the "
            "values, which JAX cannot trace (jax.jit / torchlax.jit need static shapes). Run it "
            "eagerly, outside the traced function, or keep a fixed number of boxes with "
            "torch.topk on the scores."
        )
    boxes, order_scores = np.asarray(dets), np.asarray(scores)
    # torchvision's CPU kernel: boxes by descending score (stable), each kept box suppresses the
    # later ones whose IoU with it exceeds the threshold; IoU in the boxes' dtype.
    order = np.argsort(-order_scores, kind="stable")
    x1, y1, x2, y2 = (boxes[:, i] for i in range(4))
    areas = (x2 - x1) * (y2 - y1)
    suppressed = np.zeros(len(order), dtype=bool)
    keep = []
    threshold = boxes.dtype.type(iou_threshold)
    for pos, i in enumerate(order):
        if suppressed[i]:
            continue
        keep.append(i)
        rest = order[pos + 1 :]
        w = np.maximum(
            boxes.dtype.type(0), np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest])
        )
        h = np.maximum(
            boxes.dtype.type(0), np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest])
        )
        inter = w * h
        iou = inter / (areas[i] + areas[rest] - inter)
        suppressed[rest[iou > threshold]] = True
    return jnp.asarray(np.asarray(keep, dtype=np.int64))


# -- bilinear sampling weights shared by roi_align and ps_roi_align -------------------------------


def _grid_sizes(roi_height, roi_width, pooled_height, pooled_width, sampling_ratio, op):
    """Sampling points per bin along each axis, per ROI, and the static maximum of each."""
    if sampling_ratio > 0:
        k = roi_height.shape[0]
        full = jnp.full((k,), sampling_ratio, jnp.int32)
        return full, full, sampling_ratio, sampling_ratio
    if _traced(roi_height, roi_width):
        raise DataDependentShapeError(
            f"{op} with sampling_ratio <= 0 takes ceil(roi_size / output_size) sampling points "
            "per bin, a number that depends on the ROIs' values, which JAX cannot trace. Pass "
            "sampling_ratio > 0 (torchvision's detection heads use 2), or run it eagerly."
        )
    grid_h = jnp.ceil(_divide(roi_height, pooled_height)).astype(jnp.int32)
    grid_w = jnp.ceil(_divide(roi_width, pooled_width)).astype(jnp.int32)
    max_h = int(jnp.max(grid_h)) if grid_h.size else 1
    max_w = int(jnp.max(grid_w)) if grid_w.size else 1
    return grid_h, grid_w, max(max_h, 1), max(max_w, 1)


def _axis_weights(start, bin_size, grid, max_grid, pooled, size):
    """(K, pooled, size): for each ROI and bin, the summed interpolation weight that the bin's
    sampling points give each input row (or column), as torchvision's ``bilinear_interpolate``
    clamps them (a point more than one pixel outside contributes nothing)."""
    dtype = start.dtype
    p = jnp.arange(pooled, dtype=dtype)[None, :, None]
    i = jnp.arange(max_grid)[None, None, :]
    g = grid[:, None, None]
    coord = (
        start[:, None, None]
        + p * bin_size[:, None, None]
        + _divide((i + 0.5).astype(dtype) * bin_size[:, None, None], g.astype(dtype))
    )
    used = (i < g) & (coord >= -1.0) & (coord <= size)
    coord = jnp.maximum(coord, 0)
    low = jnp.floor(coord).astype(jnp.int32)
    at_edge = low >= size - 1
    low = jnp.where(at_edge, size - 1, low)
    high = jnp.where(at_edge, size - 1, low + 1)
    frac = jnp.where(at_edge, 0, coord - low.astype(dtype))
    positions = jnp.arange(size)[None, None, None, :]
    weights = (1 - frac)[..., None] * (positions == low[..., None]) + frac[..., None] * (
        positions == high[..., None]
    )
    return jnp.sum(jnp.where(used[..., None], weights, 0), axis=2).astype(dtype)


def _roi_geometry(
    rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, offset, min_size, op
):
    if rois.ndim != 2 or rois.shape[-1] != 5:
        raise RuntimeError(
            f"{op}: rois should be a 2-d tensor of shape (K, 5) "
            f"(batch index, x1, y1, x2, y2), got {tuple(rois.shape)}."
        )
    dtype = rois.dtype
    scale = jnp.asarray(spatial_scale, dtype)
    start_w = rois[:, 1] * scale - offset
    start_h = rois[:, 2] * scale - offset
    width = rois[:, 3] * scale - offset - start_w
    height = rois[:, 4] * scale - offset - start_h
    if min_size is not None:
        width, height = jnp.maximum(width, min_size), jnp.maximum(height, min_size)
    grid_h, grid_w, max_h, max_w = _grid_sizes(
        height, width, pooled_height, pooled_width, sampling_ratio, op
    )
    return (
        start_h,
        start_w,
        _divide(height, pooled_height),
        _divide(width, pooled_width),
        grid_h,
        grid_w,
        max_h,
        max_w,
    )


def _sampling_matrices(
    input_shape,
    rois,
    spatial_scale,
    pooled_height,
    pooled_width,
    sampling_ratio,
    aligned,
    op,
    min_size,
):
    """(Wy (K, ph, H), Wx (K, pw, W), count (K,), batch one-hot (K, N))."""
    n, _, height, width = input_shape
    offset = 0.5 if aligned else 0.0
    start_h, start_w, bin_h, bin_w, grid_h, grid_w, max_h, max_w = _roi_geometry(
        rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, offset, min_size, op
    )
    wy = _axis_weights(start_h, bin_h, grid_h, max_h, pooled_height, height)
    wx = _axis_weights(start_w, bin_w, grid_w, max_w, pooled_width, width)
    count = (grid_h * grid_w).astype(rois.dtype)
    batch = (rois[:, 0].astype(jnp.int32)[:, None] == jnp.arange(n)[None, :]).astype(rois.dtype)
    return wy, wx, count, batch


def _check_input(input, rois, op):
    if input.ndim != 4:
        raise RuntimeError(f"{op}: input should be a 4-d (N, C, H, W) tensor, got {input.ndim}-d.")
    if input.dtype != rois.dtype:
        raise RuntimeError(
            f"{op}: input ({input.dtype}) and rois ({rois.dtype}) must have the same dtype."
        )


# -- roi_align ----------------------------------------------------------------------------------


def _roi_align(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
    op = "torchvision.ops.roi_align"
    wy, wx, count, batch = _sampling_matrices(
        input.shape,
        rois,
        spatial_scale,
        pooled_height,
        pooled_width,
        sampling_ratio,
        aligned,
        op,
        None if aligned else 1.0,
    )
    count = jnp.maximum(count, 1)
    out = jnp.einsum(
        "kn,kph,nchw,kqw->kcpq", batch, wy, input, wx, precision=HIGHEST, optimize=True
    )
    return _divide(out, count[:, None, None, None]).astype(input.dtype)


@named_lowering("torchvision::roi_align")
def roi_align(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
    _check_input(input, rois, "torchvision.ops.roi_align")
    return _roi_align(
        input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned
    )


@named_lowering("torchvision::_roi_align_backward")
def _roi_align_backward(
    grad,
    rois,
    spatial_scale,
    pooled_height,
    pooled_width,
    batch_size,
    channels,
    height,
    width,
    sampling_ratio,
    aligned,
):
    zeros = jnp.zeros((batch_size, channels, height, width), grad.dtype)
    _, vjp = jax.vjp(
        lambda x: _roi_align(
            x, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned
        ),
        zeros,
    )
    return vjp(grad)[0]


# -- ps_roi_align -------------------------------------------------------------------------------


def _ps_roi_align(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio):
    op = "torchvision.ops.ps_roi_align"
    n, c, h, w = input.shape
    # torchvision shifts by half a pixel (as aligned=True) and does not widen small ROIs.
    wy, wx, count, batch = _sampling_matrices(
        input.shape,
        rois,
        spatial_scale,
        pooled_height,
        pooled_width,
        sampling_ratio,
        True,
        op,
        None,
    )
    grouped = input.reshape(
        n, c // (pooled_height * pooled_width), pooled_height, pooled_width, h, w
    )
    out = jnp.einsum(
        "kn,kph,ncpqhw,kqw->kcpq", batch, wy, grouped, wx, precision=HIGHEST, optimize=True
    )
    return _divide(out, count[:, None, None, None]).astype(input.dtype)


def _channel_mapping(k, out_channels, pooled_height, pooled_width):
    c = jnp.arange(out_channels)[:, None, None]
    p = jnp.arange(pooled_height)[None, :, None]
    q = jnp.arange(pooled_width)[None, None, :]
    mapping = (c * pooled_height + p) * pooled_width + q
    return jnp.broadcast_to(mapping, (k, out_channels, pooled_height, pooled_width))


@named_lowering("torchvision::ps_roi_align")
def ps_roi_align(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio):
    op = "torchvision.ops.ps_roi_align"
    _check_input(input, rois, op)
    if input.shape[1] % (pooled_height * pooled_width) != 0:
        raise RuntimeError(
            f"{op}: input channels ({input.shape[1]}) must be a multiple of "
            f"output_size[0] * output_size[1] ({pooled_height * pooled_width})."
        )
    out = _ps_roi_align(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio)
    mapping = _channel_mapping(rois.shape[0], out.shape[1], pooled_height, pooled_width)
    return out, mapping.astype(jnp.int32)


@named_lowering("torchvision::_ps_roi_align_backward")
def _ps_roi_align_backward(
    grad,
    rois,
    channel_mapping,
    spatial_scale,
    pooled_height,
    pooled_width,
    sampling_ratio,
    batch_size,
    channels,
    height,
    width,
):
    zeros = jnp.zeros((batch_size, channels, height, width), grad.dtype)
    _, vjp = jax.vjp(
        lambda x: _ps_roi_align(
            x, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio
        ),
        zeros,
    )
    return vjp(grad)[0]


# -- roi_pool -----------------------------------------------------------------------------------


def _bins(start, bin_size, pooled, size):
    """(K, pooled, size) membership of each input row (column) in each bin, as torchvision
    computes the bins (floor/ceil of the bin edges, offset by the ROI's start, clamped)."""
    p = jnp.arange(pooled, dtype=bin_size.dtype)[None, :]
    lo = jnp.floor(p * bin_size[:, None]).astype(jnp.int32) + start[:, None]
    hi = jnp.ceil((p + 1) * bin_size[:, None]).astype(jnp.int32) + start[:, None]
    lo, hi = jnp.clip(lo, 0, size), jnp.clip(hi, 0, size)
    positions = jnp.arange(size)[None, None, :]
    return (positions >= lo[..., None]) & (positions < hi[..., None])


@named_lowering("torchvision::roi_pool")
def roi_pool(input, rois, spatial_scale, pooled_height, pooled_width):
    op = "torchvision.ops.roi_pool"
    _check_input(input, rois, op)
    if rois.ndim != 2 or rois.shape[-1] != 5:
        raise RuntimeError(
            f"{op}: rois should be a 2-d tensor of shape (K, 5), got {tuple(rois.shape)}."
        )
    n, c, height, width = input.shape
    scale = jnp.asarray(spatial_scale, rois.dtype)
    # std::round: halves away from zero (jnp.round rounds them to even).
    corners = rois[:, 1:] * scale
    corners = (jnp.sign(corners) * jnp.floor(jnp.abs(corners) + 0.5)).astype(jnp.int32)
    start_w, start_h, end_w, end_h = (corners[:, i] for i in range(4))
    roi_w = jnp.maximum(end_w - start_w + 1, 1).astype(rois.dtype)
    roi_h = jnp.maximum(end_h - start_h + 1, 1).astype(rois.dtype)
    in_h = _bins(start_h, _divide(roi_h, pooled_height), pooled_height, height)  # (K, ph, H)
    in_w = _bins(start_w, _divide(roi_w, pooled_width), pooled_width, width)  # (K, pw, W)
    x = input[rois[:, 0].astype(jnp.int32)]  # (K, C, H, W)
    # Max over each bin's columns, then its rows; the first maximum in row-major order wins.
    cols = jnp.where(in_w[:, None, None, :, :], x[:, :, :, None, :], -jnp.inf)  # (K,C,H,pw,W)
    col_max = jnp.max(cols, axis=-1)
    col_arg = jnp.argmax(cols, axis=-1)
    rows = jnp.where(in_h[:, None, :, None, :], jnp.swapaxes(col_max, 2, 3)[:, :, None], -jnp.inf)
    value = jnp.max(rows, axis=-1)  # (K, C, ph, pw)
    row = jnp.argmax(rows, axis=-1)
    col = jnp.take_along_axis(jnp.swapaxes(col_arg, 2, 3)[:, :, None], row[..., None], axis=-1)[
        ..., 0
    ]
    empty = ~(jnp.any(in_h, axis=-1)[:, :, None] & jnp.any(in_w, axis=-1)[:, None, :])
    empty = empty[:, None]
    output = jnp.where(empty, 0, value).astype(input.dtype)
    argmax = jnp.where(empty, -1, row * width + col).astype(jnp.int32)
    return output, argmax


@named_lowering("torchvision::_roi_pool_backward")
def _roi_pool_backward(
    grad,
    rois,
    argmax,
    spatial_scale,
    pooled_height,
    pooled_width,
    batch_size,
    channels,
    height,
    width,
):
    k = grad.shape[0]
    batch = jnp.broadcast_to(rois[:, 0].astype(jnp.int32)[:, None, None, None], grad.shape)
    channel = jnp.broadcast_to(jnp.arange(channels)[None, :, None, None], grad.shape)
    valid = argmax >= 0
    flat = jnp.zeros((batch_size, channels, height * width), grad.dtype)
    flat = flat.at[batch, channel, jnp.where(valid, argmax, 0)].add(jnp.where(valid, grad, 0))
    del k
    return flat.reshape(batch_size, channels, height, width)


# -- deform_conv2d ------------------------------------------------------------------------------


def _deform_sample(input, y, x):
    """torchvision's deformable-conv bilinear sampling: zero outside, each corner checked.

    input (N, G, Cg, H, W); y, x (N, G, P) -> (N, G, Cg, P)."""
    n, g, cg, height, width = input.shape
    flat = input.reshape(n, g, cg, height * width)
    inside = (y > -1) & (y < height) & (x > -1) & (x < width)
    y_low, x_low = jnp.floor(y), jnp.floor(x)
    ly, lx = y - y_low, x - x_low
    y_low, x_low = y_low.astype(jnp.int32), x_low.astype(jnp.int32)
    out = 0
    for dy, wy in ((0, 1 - ly), (1, ly)):
        for dx, wx in ((0, 1 - lx), (1, lx)):
            yy, xx = y_low + dy, x_low + dx
            ok = inside & (yy >= 0) & (yy <= height - 1) & (xx >= 0) & (xx <= width - 1)
            index = jnp.where(ok, yy * width + xx, 0)
            values = jnp.take_along_axis(flat, index[:, :, None, :], axis=-1)
            out = out + jnp.where(ok, wy * wx, 0)[:, :, None, :] * values
    return out


def _deform_conv2d(
    input,
    weight,
    offset,
    mask,
    bias,
    stride_h,
    stride_w,
    pad_h,
    pad_w,
    dilation_h,
    dilation_w,
    groups,
    offset_groups,
    use_mask,
):
    n, c_in, height, width = input.shape
    c_out, _, kh, kw = weight.shape
    out_h = (height + 2 * pad_h - (dilation_h * (kh - 1) + 1)) // stride_h + 1
    out_w = (width + 2 * pad_w - (dilation_w * (kw - 1) + 1)) // stride_w + 1
    dtype = input.dtype
    offset = offset.reshape(n, offset_groups, kh, kw, 2, out_h, out_w)
    base_y = (jnp.arange(out_h) * stride_h - pad_h)[None, :, None] + (jnp.arange(kh) * dilation_h)[
        :, None, None
    ]  # (kh, Ho, 1)
    base_x = (jnp.arange(out_w) * stride_w - pad_w)[None, None, :] + (jnp.arange(kw) * dilation_w)[
        :, None, None
    ]  # (kw, 1, Wo)
    y = base_y[None, None, :, None, :, :].astype(dtype) + offset[:, :, :, :, 0]
    x = base_x[None, None, None, :, :, :].astype(dtype) + offset[:, :, :, :, 1]
    points = kh * kw * out_h * out_w
    grouped = input.reshape(n, offset_groups, c_in // offset_groups, height, width)
    columns = _deform_sample(
        grouped, y.reshape(n, offset_groups, points), x.reshape(n, offset_groups, points)
    )
    if use_mask:
        columns = columns * mask.reshape(n, offset_groups, 1, points)
    columns = columns.reshape(n, groups, c_in // groups, kh, kw, out_h, out_w)
    w = weight.reshape(groups, c_out // groups, c_in // groups, kh, kw)
    out = jnp.einsum("ngcijhw,gocij->ngohw", columns, w, precision=HIGHEST)
    out = out.reshape(n, c_out, out_h, out_w) + bias[None, :, None, None]
    return out.astype(dtype)


@named_lowering("torchvision::deform_conv2d")
def deform_conv2d(
    input,
    weight,
    offset,
    mask,
    bias,
    stride_h,
    stride_w,
    pad_h,
    pad_w,
    dilation_h,
    dilation_w,
    groups,
    offset_groups,
    use_mask,
):
    op = "torchvision.ops.deform_conv2d"
    if input.ndim != 4 or weight.ndim != 4:
        raise RuntimeError(
            f"{op}: input and weight must be 4-d, got {input.ndim}-d and {weight.ndim}-d."
        )
    kh, kw = weight.shape[2:]
    if offset.shape[1] != offset_groups * 2 * kh * kw:
        raise RuntimeError(
            f"{op}: the shape of the offset tensor at dimension 1 is not valid: "
            f"expected {offset_groups * 2 * kh * kw} (2 * offset_groups * kernel "
            f"height * kernel width), got {offset.shape[1]}."
        )
    if input.shape[1] % offset_groups or input.shape[1] != weight.shape[1] * groups:
        raise RuntimeError(
            f"{op}: input channels ({input.shape[1]}) must equal weight.shape[1] "
            f"* groups ({weight.shape[1]} * {groups}) and be divisible by "
            f"offset_groups ({offset_groups})."
        )
    geometry = (
        stride_h,
        stride_w,
        pad_h,
        pad_w,
        dilation_h,
        dilation_w,
        groups,
        offset_groups,
        use_mask,
    )
    return _deform_conv2d(input, weight, offset, mask, bias, *geometry)


@named_lowering("torchvision::_deform_conv2d_backward")
def _deform_conv2d_backward(
    grad,
    input,
    weight,
    offset,
    mask,
    bias,
    stride_h,
    stride_w,
    pad_h,
    pad_w,
    dilation_h,
    dilation_w,
    groups,
    offset_groups,
    use_mask,
):
    geometry = (
        stride_h,
        stride_w,
        pad_h,
        pad_w,
        dilation_h,
        dilation_w,
        groups,
        offset_groups,
        use_mask,
    )

    def forward(input, weight, offset, mask, bias):
        return _deform_conv2d(input, weight, offset, mask, bias, *geometry)

    _, vjp = jax.vjp(forward, input, weight, offset, mask, bias)
    grads = list(vjp(grad))
    if not use_mask:
        grads[3] = jnp.zeros_like(mask)
    return tuple(grads)
