"""Neural-network ops: convolution, pooling, normalization, activations, attention, resampling.

Backward ops whose forward is lowered here are the ``jax.vjp`` of that forward (exact, and XLA
fuses them); the rest (batch/group norm, losses, ...) are ``torch._decomp`` decompositions in
``torchlax_ops._decompositions``. Half-precision inputs compute in float32 and round once, as
PyTorch's CPU kernels do.
"""

from __future__ import annotations

import functools
import itertools
import math

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import torch
import torch.nn.modules.linear_cross_entropy  # noqa: F401  (defines the torch_nn ops)
from torch._decomp import decomposition_table
from torchlax_core import Tensor, check_index, current_env

from .._table import decomposition, lowering

aten = torch.ops.aten
HIGHEST = jax.lax.Precision.HIGHEST
_HALF = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))


def _up(x):
    """x in PyTorch's opmath dtype: float32 for half precision, else unchanged."""
    return x.astype(jnp.float32) if x.dtype in _HALF else x


def _vjp(forward, x, grad_output):
    """The gradient of ``forward`` at ``x`` for ``grad_output``, in x's dtype."""
    out, pull = jax.vjp(forward, _up(x))
    return pull(_up(grad_output).astype(out.dtype))[0].astype(x.dtype)


def _ntuple(value, n):
    if isinstance(value, int):
        return (value,) * n
    value = tuple(value)
    return value * n if len(value) == 1 else value


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
    values = jnp.where(valid, values, _lowest(self.dtype))
    best = jnp.argmax(values, axis=-1)
    out = jnp.take_along_axis(values, best[..., None], axis=-1)[..., 0]
    indices = jnp.take_along_axis(
        jnp.broadcast_to(jnp.asarray(flat, jnp.int64), values.shape), best[..., None], axis=-1
    )[..., 0]
    return out, indices


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
    grad = _up(grad_output).reshape(rows, -1)
    where = indices.reshape(rows, -1)
    out = jnp.zeros((rows, plane), grad.dtype).at[jnp.arange(rows)[:, None], where].add(grad)
    return out.reshape(self.shape).astype(self.dtype)


@lowering(aten.max_pool2d_with_indices_backward.default)
def max_pool2d_with_indices_backward(
    grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices
):
    return _scatter_to_indices(grad_output, self, indices, 2)


@lowering(aten.max_pool3d_with_indices_backward.default)
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
    x = _up(self)
    values, positions, outs = _windows(x, kernel, stride, padding, (1,) * n, ceil_mode, 0)
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
    return (total / jnp.asarray(divisor, total.dtype)).astype(self.dtype)


@lowering(aten.avg_pool2d.default)
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


@lowering(aten.avg_pool3d.default)
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


@lowering(aten.avg_pool2d_backward.default)
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


@lowering(aten.avg_pool3d_backward.default)
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
    x = _up(self)
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
    return x.astype(self.dtype)


@lowering(aten._adaptive_avg_pool2d.default)
def _adaptive_avg_pool(self, output_size):
    return _adaptive_avg(self, output_size)


@lowering(aten._adaptive_avg_pool2d_backward.default)
def _adaptive_avg_pool2d_backward(grad_output, self):
    return _vjp(lambda x: _adaptive_avg(x, grad_output.shape[-2:]), self, grad_output)


@lowering(aten._adaptive_avg_pool3d_backward.default)
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
    values = jnp.where(valid, values, _lowest(self.dtype))
    best = jnp.argmax(values, axis=-1)
    out = jnp.take_along_axis(values, best[..., None], axis=-1)[..., 0]
    indices = jnp.take_along_axis(
        jnp.broadcast_to(jnp.asarray(flat), values.shape), best[..., None], axis=-1
    )[..., 0]
    return out, indices


@lowering(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default)
def adaptive_max_pool(self, output_size):
    return _adaptive_max(self, output_size)


@lowering(aten.adaptive_max_pool2d_backward.default)
def adaptive_max_pool2d_backward(grad_output, self, indices):
    return _scatter_to_indices(grad_output, self, indices, 2)


@lowering(aten.adaptive_max_pool3d_backward.default)
def adaptive_max_pool3d_backward(grad_output, self, indices):
    return _scatter_to_indices(grad_output, self, indices, 3)


# -- softmax ------------------------------------------------------------------------------------


def _softmax_like(fn, self, dim, half_to_float):
    x = _up(self)
    out = fn(x[None], axis=0)[0] if self.ndim == 0 else fn(x, axis=dim)
    return out.astype(jnp.float32 if half_to_float else self.dtype)


@lowering(aten._softmax.default)
def _softmax(self, dim, half_to_float):
    return _softmax_like(jax.nn.softmax, self, dim, half_to_float)


@lowering(aten._log_softmax.default)
def _log_softmax(self, dim, half_to_float):
    return _softmax_like(jax.nn.log_softmax, self, dim, half_to_float)


@lowering(aten._safe_softmax.default)
def _safe_softmax(self, dim, dtype=None):
    # Attention's softmax: a row masked out entirely (all -inf) gives zeros, not NaN.
    x = _up(self) if dtype is None else self.astype(_dtype_of(dtype))
    out = _softmax_like(jax.nn.softmax, x, dim, False)
    masked = jnp.all(x == -jnp.inf, axis=dim, keepdims=True) if x.ndim else x == -jnp.inf
    out = jnp.where(masked, 0, out)
    return out.astype(self.dtype if dtype is None else _dtype_of(dtype))


def _reduce_dim(x, dim):
    return x if x.ndim == 0 else jnp.sum(x, axis=dim, keepdims=True)


@lowering(aten._softmax_backward_data.default)
def _softmax_backward_data(grad_output, output, dim, input_dtype):
    g, y = _up(grad_output), _up(output)
    return (y * (g - _reduce_dim(g * y, dim))).astype(_dtype_of(input_dtype))


@lowering(aten._log_softmax_backward_data.default)
def _log_softmax_backward_data(grad_output, output, dim, input_dtype):
    g, y = _up(grad_output), _up(output)
    return (g - jnp.exp(y) * _reduce_dim(g, dim)).astype(_dtype_of(input_dtype))


def _dtype_of(torch_dtype):
    from torchlax_core import jax_dtype

    return jax_dtype(torch_dtype)


# -- activations --------------------------------------------------------------------------------


def _pointwise(fn):
    """Lower ``fn(x, *scalars)`` computed in opmath and rounded back to x's dtype."""

    def lowered(self, *args):
        return fn(_up(self), *args).astype(self.dtype)

    lowered.__name__ = fn.__name__
    return lowered


def _gelu(x, approximate="none"):
    return jax.nn.gelu(x, approximate=approximate == "tanh")


def _silu(x):
    return x * jax.nn.sigmoid(x)


def _mish(x):
    return x * jnp.tanh(jax.nn.softplus(x))


def _hardswish(x):
    return x * jnp.clip(x + 3, 0, 6) / 6


def _hardsigmoid(x):
    return jnp.clip(x + 3, 0, 6) / 6


def _softplus(x, beta=1, threshold=20):
    scaled = x * beta
    return jnp.where(scaled > threshold, x, jnp.log1p(jnp.exp(scaled)) / beta)


def _elu(x, alpha: float = 1, scale: float = 1, input_scale: float = 1):
    negative = alpha * scale * jnp.expm1(x * input_scale)
    return jnp.where(x > 0, x * scale, negative)


@lowering(aten.relu.default)
def relu(self):
    return jnp.maximum(self, jnp.zeros((), self.dtype))


@lowering(aten.gelu.default)
def gelu(self, *, approximate="none"):
    return _gelu(_up(self), approximate).astype(self.dtype)


@lowering(aten.gelu_backward.default)
def gelu_backward(grad_output, self, *, approximate="none"):
    return _vjp(lambda x: _gelu(x, approximate), self, grad_output)


lowering(aten.silu.default)(_pointwise(_silu))
lowering(aten.mish.default)(_pointwise(_mish))
lowering(aten.hardswish.default)(_pointwise(_hardswish))
lowering(aten.hardsigmoid.default)(_pointwise(_hardsigmoid))
lowering(aten.softplus.default)(_pointwise(_softplus))
lowering(aten.elu.default)(_pointwise(_elu))


@lowering(aten.sigmoid_backward.default)
def sigmoid_backward(grad_output, output):
    g, y = _up(grad_output), _up(output)
    return (g * jnp.conj((1 - y) * y)).astype(grad_output.dtype)


@lowering(aten.tanh_backward.default)
def tanh_backward(grad_output, output):
    g, y = _up(grad_output), _up(output)
    return (g * jnp.conj(1 - y * y)).astype(grad_output.dtype)


@lowering(aten.hardswish_backward.default)
def hardswish_backward(grad_output, self):
    x, g = _up(self), _up(grad_output)
    grad = jnp.where(x < -3, 0, jnp.where(x <= 3, g * (x / 3 + 0.5), g))
    return grad.astype(self.dtype)


@lowering(aten.hardsigmoid_backward.default)
def hardsigmoid_backward(grad_output, self):
    x, g = _up(self), _up(grad_output)
    return jnp.where((x > -3) & (x < 3), g / 6, 0).astype(self.dtype)


@lowering(aten.softplus_backward.default)
def softplus_backward(grad_output, self, beta, threshold):
    x, g = _up(self), _up(grad_output)
    z = jnp.exp(x * beta)
    return jnp.where(x * beta > threshold, g, g * z / (z + 1)).astype(self.dtype)


@lowering(aten.celu.default)
def celu(self, alpha=1.0):
    return _elu(_up(self), alpha, 1, 1 / alpha).astype(self.dtype)


@lowering(aten.elu_backward.default)
def elu_backward(grad_output, alpha, scale, input_scale, is_result, self_or_result):
    g, y = _up(grad_output), _up(self_or_result)
    if is_result:
        negative = g * input_scale * (y + alpha * scale)
    else:
        negative = g * input_scale * alpha * scale * jnp.exp(y * input_scale)
    return jnp.where(y <= 0, negative, g * scale).astype(grad_output.dtype)


@lowering(aten.leaky_relu.default)
def leaky_relu(self, negative_slope=0.01):
    x = _up(self)
    return jnp.where(x > 0, x, x * negative_slope).astype(self.dtype)


@lowering(aten.leaky_relu_backward.default)
def leaky_relu_backward(grad_output, self, negative_slope, self_is_result):
    g = _up(grad_output)
    return jnp.where(self > 0, g, g * negative_slope).astype(grad_output.dtype)


@lowering(aten.rrelu_with_noise_functional.default)
def rrelu_with_noise_functional(
    self, noise, lower=0.125, upper=1 / 3, training=False, generator=None
):
    x = _up(self)
    if not training:  # the mean slope; the noise is left as it is
        return jnp.where(x >= 0, x, x * ((lower + upper) / 2)).astype(self.dtype), noise
    # Training: each non-positive element gets its own slope drawn from U(lower, upper).
    slope = jax.random.uniform(
        current_env().next_prng_key(generator), self.shape, x.dtype, lower, upper
    )
    slope = jnp.where(x <= 0, slope, 1)
    return (x * slope).astype(self.dtype), slope.astype(noise.dtype)


@lowering(aten.rrelu_with_noise_backward.default)
def rrelu_with_noise_backward(grad_output, self, noise, lower, upper, training, self_is_result):
    if training and upper - lower > 1e-6:  # the slopes drawn in the forward
        return (_up(grad_output) * _up(noise)).astype(grad_output.dtype)
    return leaky_relu_backward(grad_output, self, (lower + upper) / 2, self_is_result)


@decomposition(aten.rrelu_with_noise.default)
def rrelu_with_noise(self, noise, lower=0.125, upper=1 / 3, training=False, generator=None):
    out, new_noise = aten.rrelu_with_noise_functional(
        self, noise, lower, upper, training, generator=generator
    )
    noise.copy_(new_noise)  # the schema writes the drawn slopes into ``noise``
    return out


@decomposition(aten.rrelu_with_noise_.default)
def rrelu_with_noise_(self, noise, lower=0.125, upper=1 / 3, training=False, generator=None):
    out, new_noise = aten.rrelu_with_noise_functional(
        self, noise, lower, upper, training, generator=generator
    )
    noise.copy_(new_noise)
    return self.copy_(out)


@lowering(aten.hardtanh.default)
def hardtanh(self, min_val=-1, max_val=1):
    return jnp.clip(self, jnp.asarray(min_val, self.dtype), jnp.asarray(max_val, self.dtype))


@lowering(aten.hardtanh_backward.default)
def hardtanh_backward(grad_output, self, min_val, max_val):
    return jnp.where((self <= min_val) | (self >= max_val), 0, grad_output).astype(
        grad_output.dtype
    )


@lowering(aten.threshold.default)
def threshold(self, threshold, value):
    return jnp.where(self <= threshold, jnp.asarray(value, self.dtype), self)


@lowering(aten.threshold_backward.default)
def threshold_backward(grad_output, self, threshold):
    return jnp.where(self <= threshold, jnp.zeros((), grad_output.dtype), grad_output)


@lowering(aten.hardshrink.default)
def hardshrink(self, lambd=0.5):
    return jnp.where(jnp.abs(self) <= lambd, jnp.zeros((), self.dtype), self)


@lowering(aten.hardshrink_backward.default)
def hardshrink_backward(grad_out, self, lambd):
    return jnp.where(jnp.abs(self) <= lambd, jnp.zeros((), grad_out.dtype), grad_out)


@lowering(aten.softshrink.default)
def softshrink(self, lambd=0.5):
    x = _up(self)
    return jnp.where(x > lambd, x - lambd, jnp.where(x < -lambd, x + lambd, 0)).astype(self.dtype)


@lowering(aten.softshrink_backward.default)
def softshrink_backward(grad_output, self, lambd):
    return jnp.where(jnp.abs(self) <= lambd, jnp.zeros((), grad_output.dtype), grad_output)


# -- normalization, embedding, dropout ------------------------------------------------------------


@lowering(aten.native_layer_norm.default)
def native_layer_norm(input, normalized_shape, weight, bias, eps):
    axes = tuple(range(input.ndim - len(normalized_shape), input.ndim))
    x = _up(input)
    mean = jnp.mean(x, axis=axes, keepdims=True)
    centered = x - mean
    rstd = jax.lax.rsqrt(jnp.mean(centered * centered, axis=axes, keepdims=True) + eps)
    out = centered * rstd
    if weight is not None:
        out = out * _up(weight)
    if bias is not None:
        out = out + _up(bias)
    mixed = weight is not None and weight.dtype != input.dtype
    stats = jnp.float32 if mixed else input.dtype
    return out.astype(input.dtype), mean.astype(stats), rstd.astype(stats)


def _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """(out, save_mean, save_invstd, new_running_mean, new_running_var) as PyTorch's CPU kernel.

    The saved statistics are float32 when a half-precision input meets float32 parameters
    ("mixed type"), else the input's dtype; in eval mode they are empty, shape (0,).
    """
    params = [t for t in (weight, bias, running_mean, running_var) if t is not None]
    mixed = input.dtype in _HALF and any(p.dtype == jnp.float32 for p in params)
    stats_dtype = jnp.float32 if mixed else input.dtype
    x = _up(input)
    axes = (0, *range(2, input.ndim))
    shape = (1, -1) + (1,) * (input.ndim - 2)
    new_mean, new_var = running_mean, running_var
    if training:
        mean = jnp.mean(x, axis=axes)
        var = jnp.mean(jnp.square(x - mean.reshape(shape)), axis=axes)
        invstd = jax.lax.rsqrt(var + eps)
        saved = mean.astype(stats_dtype), invstd.astype(stats_dtype)
        if running_mean is not None:
            new_mean = (momentum * mean + (1 - momentum) * _up(running_mean)).astype(
                running_mean.dtype
            )
        if running_var is not None:
            n = input.size // input.shape[1]
            unbiased = var * n / jnp.asarray(n - 1, var.dtype)
            new_var = (momentum * unbiased + (1 - momentum) * _up(running_var)).astype(
                running_var.dtype
            )
    else:
        if running_mean is None or running_var is None:
            raise RuntimeError(
                "batch_norm: running_mean and running_var must be given in eval "
                "mode (training=False); pass them, or set training=True."
            )
        mean = _up(running_mean).astype(x.dtype)
        invstd = jax.lax.rsqrt(_up(running_var).astype(x.dtype) + eps)
        saved = jnp.zeros((0,), stats_dtype), jnp.zeros((0,), stats_dtype)
    out = (x - mean.reshape(shape)) * invstd.reshape(shape)
    if weight is not None:
        out = out * _up(weight).reshape(shape)
    if bias is not None:
        out = out + _up(bias).reshape(shape)
    return (out.astype(input.dtype), *saved, new_mean, new_var)


def _no_reserve():
    return jnp.zeros((0,), jnp.uint8)  # cuDNN's reserve space: always empty off CUDA


@lowering(aten._native_batch_norm_legit_functional.default)
def _native_batch_norm_legit_functional(
    input, weight, bias, running_mean, running_var, training, momentum, eps
):
    return _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)


@lowering(aten._native_batch_norm_legit.no_stats)
def _native_batch_norm_legit_no_stats(input, weight, bias, training, momentum, eps):
    return _batch_norm(input, weight, bias, None, None, training, momentum, eps)[:3]


@lowering(aten._native_batch_norm_legit_no_training.default)
def _native_batch_norm_legit_no_training(
    input, weight, bias, running_mean, running_var, momentum, eps
):
    return _batch_norm(input, weight, bias, running_mean, running_var, False, momentum, eps)[:3]


@lowering(aten._batch_norm_with_update_functional.default)
def _batch_norm_with_update_functional(
    input, weight, bias, running_mean, running_var, momentum, eps
):
    out, mean, invstd, new_mean, new_var = _batch_norm(
        input, weight, bias, running_mean, running_var, True, momentum, eps
    )
    return out, mean, invstd, _no_reserve(), new_mean, new_var


@lowering(aten._batch_norm_no_update.default)
def _batch_norm_no_update(input, weight, bias, running_mean, running_var, momentum, eps):
    # Without running statistics it normalizes with the batch's own, as in training.
    training = running_mean is None or running_var is None
    out, mean, invstd, _, _ = _batch_norm(
        input, weight, bias, running_mean, running_var, training, momentum, eps
    )
    return out, mean, invstd, _no_reserve()


# The ops below update the running statistics in place (native_batch_norm without saying so in
# its schema): torch-level decompositions run the functional lowering, then copy_ the new
# statistics into the buffers, so views and jit see the write.


def _update_running_stats(running_mean, running_var, new_mean, new_var):
    if running_mean is not None:
        running_mean.copy_(new_mean)
    if running_var is not None:
        running_var.copy_(new_var)


@decomposition(aten.native_batch_norm.default)
def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    if not training or (running_mean is not None and running_var is not None):
        return _native_batch_norm_legit(
            input, weight, bias, running_mean, running_var, training, momentum, eps
        )
    # Training with a running statistic missing: stand-ins whose updates are dropped.
    channels = input.shape[1]
    out, mean, invstd, new_mean, new_var = aten._native_batch_norm_legit_functional(
        input,
        weight,
        bias,
        running_mean if running_mean is not None else input.new_zeros(channels),
        running_var if running_var is not None else input.new_ones(channels),
        True,
        momentum,
        eps,
    )
    _update_running_stats(running_mean, running_var, new_mean, new_var)
    return out, mean, invstd


@decomposition(aten._native_batch_norm_legit.default)
def _native_batch_norm_legit(
    input, weight, bias, running_mean, running_var, training, momentum, eps
):
    out, mean, invstd, new_mean, new_var = aten._native_batch_norm_legit_functional(
        input, weight, bias, running_mean, running_var, training, momentum, eps
    )
    if training:
        _update_running_stats(running_mean, running_var, new_mean, new_var)
    return out, mean, invstd


@decomposition(aten._batch_norm_with_update.default)
def _batch_norm_with_update(input, weight, bias, running_mean, running_var, momentum, eps):
    out, mean, invstd, reserve, new_mean, new_var = aten._batch_norm_with_update_functional(
        input, weight, bias, running_mean, running_var, momentum, eps
    )
    _update_running_stats(running_mean, running_var, new_mean, new_var)
    return out, mean, invstd, reserve


@lowering(aten.embedding.default)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    check_index(indices, 0, weight.shape[0], IndexError, "index out of range in self")
    return jnp.take(weight, indices, axis=0)


@lowering(aten.embedding_renorm.default)
def embedding_renorm(self, indices, max_norm, norm_type):
    # Each row that ``indices`` names and whose p-norm exceeds max_norm is scaled down to it.
    rows = _up(self)
    named = jnp.zeros((self.shape[0],), jnp.bool_).at[indices.reshape(-1)].set(True)
    if norm_type == float("inf"):
        norms = jnp.max(jnp.abs(rows), axis=1)
    else:
        norms = jnp.sum(jnp.abs(rows) ** norm_type, axis=1) ** (1.0 / norm_type)
    scale = jnp.where(named & (norms > max_norm), max_norm / (norms + 1e-7), 1)
    return (rows * scale[:, None]).astype(self.dtype)


@lowering(aten.embedding_dense_backward.default)
def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    flat = indices.reshape(-1)
    grad = _up(grad_output).reshape(flat.shape[0], -1)
    if padding_idx >= 0:
        grad = jnp.where((flat == padding_idx)[:, None], 0, grad)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), grad.dtype).at[flat].add(1)
        grad = grad / counts[flat][:, None]
    out = jnp.zeros((num_weights, grad.shape[1]), grad.dtype).at[flat].add(grad)
    return out.astype(grad_output.dtype)


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
    fast = mode != 2 and weight.dtype in (jnp.float32, *_HALF) and padding_idx < 0
    rows = _up(jnp.take(weight, indices, axis=0))
    if per_sample_weights is not None:
        rows = rows * _up(per_sample_weights)[:, None]
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


@lowering(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)
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


@lowering(aten._embedding_bag_backward.default)
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
    g = _up(grad)
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
        rows = rows * _up(per_sample_weights)[:, None]
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


@lowering(aten._embedding_bag_per_sample_weights_backward.default)
def _embedding_bag_per_sample_weights_backward(
    grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1
):
    # d loss / d per_sample_weights[i] = <grad of i's bag, weight row of index i> (sum mode).
    bag = _bag_of_each_index(indices, offsets, grad.shape[0])
    dots = jnp.sum(_up(grad)[bag] * _up(jnp.take(weight, indices, axis=0)), axis=1)
    if padding_idx >= 0:
        dots = jnp.where(indices == padding_idx, 0, dots)
    return dots.astype(grad.dtype)


@lowering(aten.native_dropout_backward.default)
def native_dropout_backward(grad_output, mask, scale):
    # grad * mask * scale with PyTorch's promotion: an integer gradient becomes floating.
    floating = jnp.issubdtype(grad_output.dtype, jnp.inexact)
    out_dtype = grad_output.dtype if floating else _dtype_of(torch.get_default_dtype())
    return (_up(grad_output.astype(out_dtype)) * mask * scale).astype(out_dtype)


# -- attention ------------------------------------------------------------------------------------


@lowering(aten._fused_sdp_choice.default)
def _fused_sdp_choice(
    query,
    key,
    value,
    attn_mask=None,
    dropout_p=0.0,
    is_causal=False,
    *,
    scale=None,
    enable_gqa=False,
):
    # 0 = SDPBackend.math: PyTorch's composite math path (matmul, softmax, dropout), which XLA
    # fuses and autograd differentiates.
    return 0


def _attention_scores(query, key, value, attn_mask, is_causal, scale, repeat_kv, scale_first=True):
    """(q k^T * scale + mask in opmath, v): masked-out positions are -inf.

    The math path scales q before the product (``scale_first``), the flash kernel after it.
    """
    q, k, v = _up(query), _up(key), _up(value)
    if repeat_kv and k.shape[-3] != q.shape[-3]:  # grouped-query attention
        repeats = q.shape[-3] // k.shape[-3]
        k, v = jnp.repeat(k, repeats, axis=-3), jnp.repeat(v, repeats, axis=-3)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale  # a weak Python float
    if scale_first:
        scores = jnp.matmul(q * scale, jnp.swapaxes(k, -1, -2), precision=HIGHEST)
    else:
        scores = jnp.matmul(q, jnp.swapaxes(k, -1, -2), precision=HIGHEST) * scale
    length, source = q.shape[-2], k.shape[-2]
    if is_causal:
        attn_mask = jnp.tril(jnp.ones((length, source), jnp.bool_))
    if attn_mask is not None:
        if attn_mask.dtype == jnp.bool_:
            scores = jnp.where(attn_mask, scores, -jnp.inf)
        else:
            scores = scores + _up(attn_mask).astype(scores.dtype)
    return scores, v


@lowering(aten.scaled_dot_product_attention.default)
def scaled_dot_product_attention(
    query,
    key,
    value,
    attn_mask=None,
    dropout_p=0.0,
    is_causal=False,
    *,
    scale=None,
    enable_gqa=False,
):
    # Eager torchlax decomposes this composite op above the dispatcher; export and dynamo graphs
    # keep it whole and land here. PyTorch's math path: softmax(q k^T * scale + mask) v, with a
    # row masked out entirely giving zeros (``_safe_softmax``).
    scores, v = _attention_scores(query, key, value, attn_mask, is_causal, scale, enable_gqa)
    weights = jax.nn.softmax(scores, axis=-1)
    weights = jnp.where(jnp.all(scores == -jnp.inf, axis=-1, keepdims=True), 0, weights)
    if dropout_p > 0.0:
        keep = jax.random.bernoulli(
            current_env().next_prng_key(None), 1.0 - dropout_p, weights.shape
        )
        weights = jnp.where(keep, weights / (1.0 - dropout_p), 0)
    out = jnp.matmul(weights, v, precision=HIGHEST)
    return out.astype(query.dtype)


@lowering(aten._scaled_dot_product_flash_attention_for_cpu.default)
def _scaled_dot_product_flash_attention_for_cpu(
    query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None
):
    if dropout_p != 0.0:
        raise RuntimeError(
            "_scaled_dot_product_flash_attention_for_cpu: dropout_p must be 0 "
            f"(got {dropout_p}); use scaled_dot_product_attention for dropout."
        )
    scores, v = _attention_scores(
        query, key, value, attn_mask, is_causal, scale, True, scale_first=False
    )
    # (output, logsumexp of each row's scores), normalising by the row sum last as the kernel
    # does; a row masked out entirely gives 0 for both.
    top = jnp.max(scores, axis=-1, keepdims=True)
    masked = top == -jnp.inf
    weights = jnp.exp(scores - jnp.where(masked, 0, top))
    total = jnp.sum(weights, axis=-1, keepdims=True)
    out = jnp.matmul(weights, v, precision=HIGHEST) / jnp.where(masked, 1, total)
    logsumexp = jnp.where(masked, 0, top + jnp.log(total))[..., 0]
    return out.astype(query.dtype), logsumexp


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
    out = _up(self)
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
    return out.astype(self.dtype)


def _nearest_lowering(op, backward_op, n, exact):
    @lowering(op)
    def upsample(self, output_size, *scales):
        return _nearest(self, output_size, _ntuple_scales(scales, n), exact)

    @lowering(backward_op)
    def upsample_backward(grad_output, output_size, input_size, *scales):
        zeros = jnp.zeros(tuple(input_size), grad_output.dtype)
        return _vjp(
            lambda x: _nearest(x, output_size, _ntuple_scales(scales, n), exact), zeros, grad_output
        )


def _linear_lowering(op, backward_op, n):
    @lowering(op)
    def upsample(self, output_size, align_corners, *scales):
        return _linear(self, output_size, align_corners, _ntuple_scales(scales, n))

    @lowering(backward_op)
    def upsample_backward(grad_output, output_size, input_size, align_corners, *scales):
        zeros = jnp.zeros(tuple(input_size), grad_output.dtype)
        return _vjp(
            lambda x: _linear(x, output_size, align_corners, _ntuple_scales(scales, n)),
            zeros,
            grad_output,
        )


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


# -- reflection and replication padding -------------------------------------------------------------


def _pad(self, padding, mode):
    n = len(padding) // 2
    widths = [(0, 0)] * (self.ndim - n)
    widths += [(padding[2 * (n - 1 - d)], padding[2 * (n - 1 - d) + 1]) for d in range(n)]
    if mode == "edge":
        # Output element i reads input clamp(i - low, 0, size - 1): negative padding crops.
        for d, (low, high) in enumerate(widths):
            if low or high:
                size = self.shape[d]
                index = np.clip(np.arange(size + low + high) - low, 0, size - 1)
                self = jnp.take(self, jnp.asarray(index), axis=d)
        return self
    # Negative padding crops that side first (PyTorch allows it), then the rest pads.
    self = self[
        tuple(
            slice(max(-low, 0), size - max(-high, 0))
            for (low, high), size in zip(widths, self.shape, strict=True)
        )
    ]
    widths = [(max(low, 0), max(high, 0)) for low, high in widths]
    if mode == "reflect":
        for d, (low, high) in enumerate(widths):
            size = self.shape[d]
            if low >= size or high >= size:
                raise RuntimeError(
                    f"reflection_pad: padding ({low}, {high}) should be less than the input size "
                    f"{size} of dimension {d}."
                )
    return jnp.pad(self, widths, mode=mode)


def _pad_lowering(name, mode, n):
    @lowering(getattr(aten, f"{name}{n}d").default)
    def pad(self, padding):
        return _pad(self, padding, mode)

    @lowering(getattr(aten, f"{name}{n}d_backward").default)
    def pad_backward(grad_output, self, padding):
        return _vjp(lambda x: _pad(x, padding, mode), self, grad_output)


for _n in (1, 2, 3):
    _pad_lowering("reflection_pad", "reflect", _n)
    _pad_lowering("replication_pad", "edge", _n)


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


# -- connectionist temporal classification ----------------------------------------------------------


def _static_lengths(lengths):
    """A length list as Python ints when it is known on the host, else None (a traced array)."""
    if isinstance(lengths, list | tuple):
        return [int(n) for n in lengths]
    if isinstance(lengths, jax.core.Tracer):
        return None
    return [int(n) for n in np.asarray(lengths).reshape(-1)]


def _logsumexp3(a, b, c):
    """log(e^a + e^b + e^c) whose gradient stays finite (zero) where all three are -inf."""
    top = jnp.maximum(jnp.maximum(a, b), c)
    empty = top == -jnp.inf
    top = jnp.where(empty, 0, top)
    total = jnp.exp(a - top) + jnp.exp(b - top) + jnp.exp(c - top)
    return jnp.where(empty, -jnp.inf, top + jnp.log(jnp.where(empty, 1, total)))


def _ctc_alphas(log_probs, targets, input_lengths, target_lengths, blank):
    """(nll (N,), log_alpha (N, T, 2S+1)) by the CTC forward recursion, a lax.scan over time.

    S is the longest target when the lengths are known on the host (as in PyTorch), else the
    padded target width bounds it.
    """
    lengths = _static_lengths(target_lengths)
    if lengths is not None:
        width = max(lengths, default=0)
    else:
        width = targets.shape[1] if targets.ndim == 2 else targets.shape[0]
    return _ctc_recursion(
        log_probs,
        targets,
        jnp.asarray(input_lengths, jnp.int64),
        jnp.asarray(target_lengths, jnp.int64),
        blank=blank,
        width=width,
    )


@functools.partial(jax.jit, static_argnames=("blank", "width"))
def _ctc_recursion(log_probs, targets, input_lengths, target_lengths, *, blank, width):
    # One compiled computation (eagerly too): the scan's body is not re-dispatched op by op.
    time, batch, _ = log_probs.shape
    lp = _up(log_probs)
    steps = jnp.arange(width)
    if targets.ndim == 2:
        labels = jnp.take(targets, jnp.minimum(steps, targets.shape[1] - 1), axis=1)
    else:  # targets of every sample concatenated
        starts = jnp.cumsum(target_lengths) - target_lengths
        labels = jnp.take(
            targets, jnp.clip(starts[:, None] + steps, 0, max(targets.shape[0] - 1, 0))
        )
        labels = labels.reshape(batch, width)
    extended = jnp.full((batch, 2 * width + 1), blank, labels.dtype).at[:, 1::2].set(labels)
    skip = (extended != blank) & (extended != jnp.roll(extended, 2, axis=1))
    skip = skip.at[:, :2].set(False)  # may come from s - 2 (a repeated label may not)
    emissions = jnp.take_along_axis(
        lp, jnp.broadcast_to(extended[None], (time,) + extended.shape), axis=2
    )  # (T, N, 2S+1)
    neg_inf = jnp.asarray(-jnp.inf, lp.dtype)
    first = jnp.full(extended.shape, neg_inf).at[:, :2].set(emissions[0, :, :2])

    def shifted(alpha, by):
        return jnp.concatenate([jnp.full((batch, by), neg_inf), alpha[:, :-by]], axis=1)

    def step(alpha, emit):
        alpha = _logsumexp3(alpha, shifted(alpha, 1), jnp.where(skip, shifted(alpha, 2), neg_inf))
        alpha = alpha + emit
        return alpha, alpha

    _, rest = jax.lax.scan(step, first, emissions[1:])
    alphas = jnp.concatenate([first[None], rest], axis=0)  # (T, N, 2S+1)
    final = jnp.take_along_axis(alphas, jnp.clip(input_lengths - 1, 0)[None, :, None], axis=0)[0]
    end = 2 * target_lengths  # the last blank; the last label sits just before it
    last = jnp.take_along_axis(final, end[:, None], axis=1)[:, 0]
    before = jnp.take_along_axis(final, jnp.maximum(end - 1, 0)[:, None], axis=1)[:, 0]
    nll = -_logsumexp3(last, jnp.where(target_lengths > 0, before, neg_inf), neg_inf)
    # PyTorch leaves log_alpha unset past each sample's lengths: -inf here.
    inside = (jnp.arange(time)[:, None, None] < input_lengths[None, :, None]) & (
        jnp.arange(2 * width + 1)[None, None, :] <= end[None, :, None]
    )
    log_alpha = jnp.transpose(jnp.where(inside, alphas, neg_inf), (1, 0, 2))
    return nll, log_alpha


@lowering(aten._ctc_loss.default, aten._ctc_loss.Tensor)
def _ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    if log_probs.ndim != 3:
        raise RuntimeError(
            f"_ctc_loss: log_probs must be 3-dimensional (T, N, C), got "
            f"{log_probs.ndim} dimensions; ctc_loss adds the batch dimension."
        )
    nll, log_alpha = _ctc_alphas(log_probs, targets, input_lengths, target_lengths, blank)
    if zero_infinity:
        nll = jnp.where(nll == jnp.inf, 0, nll)
    return nll.astype(log_probs.dtype), log_alpha.astype(log_probs.dtype)


@lowering(aten._ctc_loss_backward.default, aten._ctc_loss_backward.Tensor)
def _ctc_loss_backward(
    grad,
    log_probs,
    targets,
    input_lengths,
    target_lengths,
    neg_log_likelihood,
    log_alpha,
    blank,
    zero_infinity=False,
):
    # PyTorch's gradient assumes log_probs came from log_softmax: exp(log_probs) minus the
    # label occupation (the vjp of the nll), zero past each input length and, with
    # zero_infinity, for samples whose loss is infinite.
    def nll_of(lp):
        return _ctc_alphas(lp, targets, input_lengths, target_lengths, blank)[0]

    nll, pull = jax.vjp(nll_of, _up(log_probs))
    g = _up(grad)
    if zero_infinity:
        g = jnp.where(nll == jnp.inf, 0, g)
    occupation = pull(g.astype(nll.dtype))[0]
    time = log_probs.shape[0]
    inside = jnp.arange(time)[:, None] < jnp.asarray(input_lengths, jnp.int64)[None, :]
    out = jnp.where(inside[..., None], jnp.exp(_up(log_probs)) * g[None, :, None] + occupation, 0)
    if zero_infinity:
        out = jnp.where((nll == jnp.inf)[None, :, None], 0, out)
    return out.astype(log_probs.dtype)


# -- linear cross entropy -------------------------------------------------------------------------
# F.linear_cross_entropy(..., options=...) calls these custom ops, which chunk the batch to bound
# memory on PyTorch's backends. XLA fuses the projection into the loss, so one pass suffices.

torch_nn = torch.ops.torch_nn


def _linear_cross_entropy(
    input, linear_weight, target, linear_bias, weight, reduction, ignore_index, acc_dtype
):
    """cross_entropy(input @ linear_weight.T + linear_bias, target), in the accumulation dtype."""
    acc = jnp.promote_types(_dtype_of(acc_dtype), _up(input).dtype)
    logits = jnp.matmul(input.astype(acc), linear_weight.astype(acc).T, precision=HIGHEST)
    if linear_bias is not None:
        logits = logits + linear_bias.astype(acc)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    class_weight = jnp.ones(logits.shape[-1], acc) if weight is None else weight.astype(acc)
    if jnp.issubdtype(target.dtype, jnp.floating):  # class probabilities
        losses = -jnp.sum(log_probs * target.astype(acc) * class_weight, axis=-1)
        if reduction == "mean":
            return jnp.sum(losses) / losses.shape[0]
        return jnp.sum(losses) if reduction == "sum" else losses
    kept = target != ignore_index
    safe = jnp.where(kept, target, 0)
    picked = jnp.take_along_axis(log_probs, safe[:, None], axis=-1)[:, 0]
    sample_weight = jnp.where(kept, class_weight[safe], 0)
    losses = -picked * sample_weight
    if reduction == "mean":
        return jnp.sum(losses) / jnp.sum(sample_weight)
    return jnp.sum(losses) if reduction == "sum" else losses


@lowering(torch_nn._linear_cross_entropy_batch_chunked.default)
def _linear_cross_entropy_batch_chunked(
    input,
    linear_weight,
    target,
    linear_bias,
    weight,
    reduction,
    ignore_index,
    label_smoothing,
    batch_chunk_size,
    acc_policy,
    acc_dtype,
    allow_retain_graph,
    compute_input_grad,
    compute_linear_weight_grad,
    compute_linear_bias_grad,
):
    # (loss, grad_input, grad_linear_weight, grad_linear_bias): the gradients of the loss are
    # computed here (autograd scales them by the upstream gradient), empty where not asked for.
    if label_smoothing != 0.0:
        raise RuntimeError(
            "torch_nn._linear_cross_entropy_batch_chunked: label_smoothing must "
            "be 0 on the chunked path (F.linear_cross_entropy falls back to the "
            "reference path otherwise); pass options=None."
        )

    def loss_of(x, w, b):
        return _linear_cross_entropy(x, w, target, b, weight, reduction, ignore_index, acc_dtype)

    bias = (
        linear_bias
        if linear_bias is not None
        else jnp.zeros(linear_weight.shape[0], linear_weight.dtype)
    )
    loss, pull = jax.vjp(loss_of, input, linear_weight, bias)
    grad_input, grad_weight, grad_bias = pull(jnp.ones_like(loss))
    dtype = input.dtype
    return (
        loss.astype(dtype),
        grad_input.astype(dtype) if compute_input_grad else jnp.zeros((0, 0), dtype),
        grad_weight.astype(dtype) if compute_linear_weight_grad else jnp.zeros((0, 0), dtype),
        grad_bias.astype(dtype) if compute_linear_bias_grad else jnp.zeros((0,), dtype),
    )


@lowering(torch_nn._linear_cross_entropy_batch_chunked_no_reduction.default)
def _linear_cross_entropy_batch_chunked_no_reduction(
    input,
    linear_weight,
    target,
    linear_bias,
    weight,
    ignore_index,
    batch_chunk_size,
    acc_policy,
    acc_dtype,
):
    losses = _linear_cross_entropy(
        input, linear_weight, target, linear_bias, weight, "none", ignore_index, acc_dtype
    )
    return losses.astype(input.dtype)


# -- bilinear -------------------------------------------------------------------------------------


@lowering(aten._trilinear.default)
def _trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    # sum over ``sumdim`` of i1 * i2 * i3, each unsqueezed at its ``expand`` dims. As PyTorch
    # does, i1 * i2 is contracted first over the summed dims i3 lacks and rounded to the result
    # dtype, then contracted with i3; an operand's size-1 dim that broadcasts carries no index.
    dtype = jnp.result_type(i1.dtype, i2.dtype, i3.dtype)
    operands = [_up(i1), _up(i2), _up(i3)]
    total = i1.ndim + len(expand1)
    letters = [chr(ord("a") + d) for d in range(total)]
    shapes = []
    for x, expand in zip(operands, (expand1, expand2, expand3), strict=True):
        dims = iter(x.shape)
        shapes.append([1 if d in expand else next(dims) for d in range(total)])
    sizes = [next((s[d] for s in shapes if s[d] != 1), 1) for d in range(total)]  # broadcast
    specs, squeezed = [], []
    for x, expand, shape in zip(operands, (expand1, expand2, expand3), shapes, strict=True):
        kept = [d for d in range(total) if d not in expand]
        broadcast = [i for i, d in enumerate(kept) if shape[d] == 1 and sizes[d] != 1]
        squeezed.append(jnp.squeeze(x, axis=tuple(broadcast)) if broadcast else x)
        specs.append("".join(letters[d] for d in kept if not (shape[d] == 1 and sizes[d] != 1)))
    first_sums = {letters[d] for d in sumdim if letters[d] not in specs[2]}
    pair = "".join(c for c in letters if c in specs[0] + specs[1] and c not in first_sums)
    partial = jnp.einsum(
        f"{specs[0]},{specs[1]}->{pair}", squeezed[0], squeezed[1], precision=HIGHEST
    )
    partial = _up(partial.astype(dtype))
    kept = [d for d in range(total) if d not in sumdim]
    output = "".join(letters[d] for d in kept if letters[d] in pair + specs[2])
    out = jnp.einsum(f"{pair},{specs[2]}->{output}", partial, squeezed[2], precision=HIGHEST)
    out = out.reshape([sizes[d] for d in kept])  # dims of size 1 everywhere come back
    return out.astype(dtype)


# -- torch-level functions whose PyTorch code reads data on the host ------------------------------


def _traced(tensor) -> bool:
    return (
        isinstance(tensor, torch.Tensor)
        and hasattr(tensor, "jax")
        and isinstance(tensor.jax(), jax.core.Tracer)  # pyright: ignore[reportAttributeAccessIssue]  (hasattr checked it)
    )


def _check_targets(self, target, ignore_index):
    """nll_loss's check: each target is a class of ``self`` (dim 1, or 0 unbatched) or
    ``ignore_index``."""
    classes = self.shape[1] if self.dim() > 1 else self.shape[0]
    targets = target.jax()
    check_index(
        jnp.where(targets == ignore_index, 0, targets),
        0,
        classes,
        IndexError,
        "Target {index} is out of bounds.",
    )


# PyTorch's decompositions of the nll losses, after the target check their kernels make.
@decomposition(aten.nll_loss_forward.default)
def nll_loss_forward(self, target, weight, reduction, ignore_index):
    _check_targets(self, target, ignore_index)
    return decomposition_table[aten.nll_loss_forward.default](
        self, target, weight, reduction, ignore_index
    )


@decomposition(aten.nll_loss2d_forward.default)
def nll_loss2d_forward(self, target, weight, reduction, ignore_index):
    _check_targets(self, target, ignore_index)
    return decomposition_table[aten.nll_loss2d_forward.default](
        self, target, weight, reduction, ignore_index
    )


@decomposition(aten.one_hot.default)
def one_hot(self, num_classes=-1):
    if num_classes == -1 and _traced(self):
        raise RuntimeError(
            "one_hot: num_classes=-1 infers the number of classes from the data (its maximum), "
            "which a JAX trace (jax.jit / torchlax.jit) cannot do because the output shape would "
            "depend on it. Pass num_classes explicitly."
        )
    if self.dtype != torch.int64:
        raise RuntimeError("one_hot is only applicable to index tensor of type LongTensor.")
    if num_classes == -1:
        if self.numel() == 0:
            raise RuntimeError("Can not infer total number of classes from empty tensor.")
        num_classes = int(self.max()) + 1  # eager only: a host read, as in PyTorch
    # Checked as on PyTorch's CPU (eagerly a host read; under jit only in checked mode, else a
    # value outside [0, num_classes) gives a row of zeros).
    if isinstance(self, Tensor):  # not Dynamo's fake tensors (shape propagation has no values)
        values = self.jax()
        check_index(values, 0, 2**63 - 1, RuntimeError, "Class values must be non-negative.")
        check_index(
            values,
            -(2**63),
            num_classes,
            RuntimeError,
            "Class values must be smaller than num_classes.",
        )
    classes = torch.arange(num_classes, device=self.device)
    return (self.unsqueeze(-1) == classes).to(torch.int64)
