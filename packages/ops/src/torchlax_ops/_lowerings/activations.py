"""Activations and softmax: relu, gelu, silu, elu family, hard*/soft* functions, thresholds,
rrelu, softmax and log_softmax, with their backward ops.

Half-precision inputs compute in float32 and round once, as PyTorch's CPU kernels do.
"""

from __future__ import annotations

import jax
import jax.core
import jax.numpy as jnp
import torch
from torchlax_core import current_env

from .._table import decomposition, lowering, named, op_name
from ._common import _dtype_of, _up, _vjp

aten = torch.ops.aten


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
    out = safe_softmax(x[None], 0)[0] if x.ndim == 0 else safe_softmax(x, dim)
    return out.astype(self.dtype if dtype is None else _dtype_of(dtype))


def safe_softmax(x, axis):
    """Softmax along ``axis``, zeros for a slice that is -inf throughout.

    Such a slice is the one whose maximum is -inf: the maximum the softmax needs anyway, where
    testing ``x == -inf`` would be one more pass over attention's (batch, heads, query, key)
    scores in every layer.
    """
    top = jax.lax.stop_gradient(jnp.max(x, axis=axis, keepdims=True))
    unnormalized = jnp.exp(x - top)
    out = unnormalized / jnp.sum(unnormalized, axis=axis, keepdims=True)
    return jnp.where(top == -jnp.inf, 0, out)


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


# -- activations --------------------------------------------------------------------------------


def _pointwise(op, fn):
    """Lower ``fn(x, *scalars)`` computed in opmath and rounded back to x's dtype."""

    def lowered(self, *args):
        return fn(_up(self), *args).astype(self.dtype)

    return named(op_name(op), lowered)


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


lowering(aten.silu.default)(_pointwise(aten.silu.default, _silu))
lowering(aten.mish.default)(_pointwise(aten.mish.default, _mish))
lowering(aten.hardswish.default)(_pointwise(aten.hardswish.default, _hardswish))
lowering(aten.hardsigmoid.default)(_pointwise(aten.hardsigmoid.default, _hardsigmoid))
lowering(aten.softplus.default)(_pointwise(aten.softplus.default, _softplus))
lowering(aten.elu.default)(_pointwise(aten.elu.default, _elu))


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
