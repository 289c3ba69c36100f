"""Convolution (transposed too) and its backward.

Half-precision convolution accumulates in float32 and rounds once (bias included), as oneDNN
and cuDNN do.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.core
import jax.numpy as jnp

from .. import _aten
from .._precision import product_precision
from .._promotion import accumulator
from .._table import lowering
from ._common import _ntuple

aten = _aten.aten  # (an op this torch lacks: a Missing, skipped)


# -- convolution --------------------------------------------------------------------------------


def _conv(
    input, weight, stride, padding, dilation, transposed, output_padding, groups, rounded=False
):
    """The convolution in its accumulation dtype (float32 for half inputs), not yet rounded;
    ``rounded``: in the input's dtype (XLA accumulates a half convolution in float32 and rounds
    once), so that its gradients' convolutions take half operands too."""
    spatial = weight.ndim - 2
    unbatched = input.ndim == weight.ndim - 1
    if unbatched:
        input = input[None]
    stride, padding, dilation = (_ntuple(v, spatial) for v in (stride, padding, dilation))
    half = accumulator(input.dtype) is not None
    acc = None if rounded else accumulator(input.dtype)
    if not 1 <= spatial <= 3:
        raise NotImplementedError(
            f"torchlax lowers convolutions of 1 to 3 spatial dimensions; aten.convolution got a "
            f"weight of {weight.ndim} dimensions."
        )
    letters = "DHW"[-spatial:]
    numbers = ("NC" + letters, "OI" + letters, "NC" + letters)
    # Half precision stays on XLA's convolution: the matmul's gradient would sum in half.
    matmul = not half and not transposed and groups == 1
    if matmul and _as_matmul(input, weight, stride, padding, dilation):
        out = _conv_as_matmul(input, weight, stride, padding, dilation)
    elif not transposed:
        out = jax.lax.conv_general_dilated(
            input,
            weight,
            window_strides=stride,
            padding=[(p, p) for p in padding],
            rhs_dilation=dilation,
            dimension_numbers=numbers,
            feature_group_count=groups,
            precision=product_precision(input.dtype),
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
            precision=product_precision(input.dtype),
            preferred_element_type=acc,
        )
    return out[0] if unbatched else out


def _out_sizes(input, weight, stride, padding, dilation):
    return [
        (size + 2 * p - d * (k - 1) - 1) // s + 1
        for size, k, s, p, d in zip(
            input.shape[2:], weight.shape[2:], stride, padding, dilation, strict=True
        )
    ]


def _as_matmul(input, weight, stride, padding, dilation) -> bool:
    """Whether to lower a convolution as patches @ weight rather than XLA's convolution.

    XLA:CPU runs a convolution whose output map is tiny (ResNet's last stage: 2x2) through a
    slow generic kernel, forward and backward (its gradient swaps the operands): 512 channels
    3x3 on 2x2 maps take 76 ms against 1.3 ms as a matmul. A 1x1 kernel is a matmul anyway.
    Above 16 output positions XLA's convolution is as fast or faster (benchmarks/README.md).
    """
    out = _out_sizes(input, weight, stride, padding, dilation)
    window = math.prod(weight.shape[2:])  # one slice per window element: keep traces short
    return min(out) >= 1 and window <= 64 and (window == 1 or math.prod(out) <= 16)


def _conv_as_matmul(input, weight, stride, padding, dilation):
    """Convolution as one dot of the stacked window slices (im2col) with the weight."""
    batch, channels = input.shape[:2]
    out = _out_sizes(input, weight, stride, padding, dilation)
    padded = jnp.pad(input, [(0, 0), (0, 0), *((p, p) for p in padding)])
    patches = []
    for offset in itertools.product(*(range(k) for k in weight.shape[2:])):
        starts = [0, 0, *(o * d for o, d in zip(offset, dilation, strict=True))]
        limits = [batch, channels]
        limits += [a + (n - 1) * s + 1 for a, n, s in zip(starts[2:], out, stride, strict=True)]
        patches.append(jax.lax.slice(padded, starts, limits, (1, 1, *stride)))
    # (N, C, K, *out) against (O, C, K): the gradients are dots and pads, no convolution.
    stacked = jnp.stack(patches, axis=2)
    kernel = weight.reshape(*weight.shape[:2], -1)
    precision = product_precision(input.dtype)
    return jnp.einsum("nck...,ock->no...", stacked, kernel, precision=precision)


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
        # Rounded to x's dtype inside: a float32 accumulator here would make the gradient's
        # convolutions convert half operands to float32 (twice the memory traffic).
        return _conv(x, w, stride, padding, dilation, transposed, output_padding, groups, True)

    _, pull = jax.vjp(forward, input, weight)
    grad_input, grad_weight = pull(grad_output.astype(input.dtype))
    grad_bias = None
    if output_mask[2]:
        batched = input.ndim == weight.ndim
        axes = tuple(i for i in range(grad_output.ndim) if i != (1 if batched else 0))
        grad_bias = jnp.sum(grad_output, axis=axes, dtype=accumulator(grad_output.dtype))
        grad_bias = grad_bias.astype(grad_output.dtype)
    return (
        grad_input if output_mask[0] else None,
        grad_weight if output_mask[1] else None,
        grad_bias,
    )
