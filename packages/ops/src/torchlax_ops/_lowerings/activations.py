"""Activations and softmax: relu, gelu, silu, elu family, hard*/soft* functions, thresholds,
rrelu, softmax and log_softmax, with their backward ops.

Half-precision inputs compute in float32 and round once, as PyTorch's CPU kernels do: a
lowering declares it with ``opmath=True``.
"""

from __future__ import annotations

import jax
import jax.core
import jax.numpy as jnp
from torchlax_core import current_env

from .. import _aten
from .._table import decomposition, lowering, named, op_name
from ._common import _dtype_of, _vjp

aten = _aten.aten  # (an op this torch lacks: a Missing, skipped)


# -- softmax ------------------------------------------------------------------------------------


def _along(fn, x, dim):
    """``fn(x, axis=dim)``, a 0-d ``x`` taken as one element along its only axis."""
    return fn(x[None], axis=0)[0] if x.ndim == 0 else fn(x, axis=dim)


# half_to_float: a half input's softmax stays float32 instead of rounding back.
@lowering(aten._softmax.default, opmath=True, results=("half_to_float",))
def _softmax(self, dim, half_to_float):
    return _along(jax.nn.softmax, self, dim)


@lowering(aten._log_softmax.default, opmath=True, results=("half_to_float",))
def _log_softmax(self, dim, half_to_float):
    return _along(jax.nn.log_softmax, self, dim)


@lowering(aten._safe_softmax.default, opmath=True, results=("dtype",))
def _safe_softmax(self, dim, dtype=None):
    # Attention's softmax: a row masked out entirely (all -inf) gives zeros, not NaN.
    return _along(safe_softmax, self, dim)


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


@lowering(aten._softmax_backward_data.default, opmath=True)
def _softmax_backward_data(grad_output, output, dim, input_dtype):
    g, y = grad_output, output
    return (y * (g - _reduce_dim(g * y, dim))).astype(_dtype_of(input_dtype))


@lowering(aten._log_softmax_backward_data.default, opmath=True)
def _log_softmax_backward_data(grad_output, output, dim, input_dtype):
    g, y = grad_output, output
    return (g - jnp.exp(y) * _reduce_dim(g, dim)).astype(_dtype_of(input_dtype))


# -- activations --------------------------------------------------------------------------------


def _pointwise(op, fn):
    """``fn(x, *scalars)`` named after ``op`` (registered with ``opmath=True``)."""

    def lowered(self, *args):
        return fn(self, *args)

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


@lowering(aten.gelu.default, opmath=True)
def gelu(self, *, approximate="none"):
    return _gelu(self, approximate)


@lowering(aten.gelu_backward.default, opmath=True)
def gelu_backward(grad_output, self, *, approximate="none"):
    return _vjp(lambda x: _gelu(x, approximate), self, grad_output)


for _op, _fn in {
    aten.silu.default: _silu,
    aten.mish.default: _mish,
    aten.hardswish.default: _hardswish,
    aten.hardsigmoid.default: _hardsigmoid,
    aten.softplus.default: _softplus,
    aten.elu.default: _elu,
}.items():
    lowering(_op, opmath=True)(_pointwise(_op, _fn))


@lowering(aten.sigmoid_backward.default, opmath=True)
def sigmoid_backward(grad_output, output):
    return grad_output * jnp.conj((1 - output) * output)


@lowering(aten.tanh_backward.default, opmath=True)
def tanh_backward(grad_output, output):
    return grad_output * jnp.conj(1 - output * output)


@lowering(aten.hardswish_backward.default, opmath=True)
def hardswish_backward(grad_output, self):
    g = grad_output
    return jnp.where(self < -3, 0, jnp.where(self <= 3, g * (self / 3 + 0.5), g))


@lowering(aten.hardsigmoid_backward.default, opmath=True)
def hardsigmoid_backward(grad_output, self):
    return jnp.where((self > -3) & (self < 3), grad_output / 6, 0)


@lowering(aten.softplus_backward.default, opmath=True)
def softplus_backward(grad_output, self, beta, threshold):
    z = jnp.exp(self * beta)
    return jnp.where(self * beta > threshold, grad_output, grad_output * z / (z + 1))


@lowering(aten.celu.default, opmath=True)
def celu(self, alpha=1.0):
    return _elu(self, alpha, 1, 1 / alpha)


@lowering(aten.elu_backward.default, opmath=True)
def elu_backward(grad_output, alpha, scale, input_scale, is_result, self_or_result):
    g, y = grad_output, self_or_result
    if is_result:
        negative = g * input_scale * (y + alpha * scale)
    else:
        negative = g * input_scale * alpha * scale * jnp.exp(y * input_scale)
    return jnp.where(y <= 0, negative, g * scale)


@lowering(aten.leaky_relu.default, opmath=True)
def leaky_relu(self, negative_slope=0.01):
    return jnp.where(self > 0, self, self * negative_slope)


@lowering(aten.leaky_relu_backward.default, opmath=True)
def leaky_relu_backward(grad_output, self, negative_slope, self_is_result):
    return jnp.where(self > 0, grad_output, grad_output * negative_slope)


@lowering(aten.rrelu_with_noise_functional.default, opmath=True, args=("self",))
def rrelu_with_noise_functional(
    self, noise, lower=0.125, upper=1 / 3, training=False, generator=None
):
    x = self
    if not training:  # the mean slope; the noise is left as it is
        return jnp.where(x >= 0, x, x * ((lower + upper) / 2)), noise
    # Training: each non-positive element gets its own slope drawn from U(lower, upper).
    slope = jax.random.uniform(
        current_env().next_prng_key(generator), self.shape, x.dtype, lower, upper
    )
    slope = jnp.where(x <= 0, slope, 1)
    return x * slope, slope.astype(noise.dtype)


@lowering(aten.rrelu_with_noise_backward.default, opmath=True)
def rrelu_with_noise_backward(grad_output, self, noise, lower, upper, training, self_is_result):
    if training and upper - lower > 1e-6:  # the slopes drawn in the forward
        return grad_output * noise
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


@lowering(aten.softshrink.default, opmath=True)
def softshrink(self, lambd=0.5):
    return jnp.where(self > lambd, self - lambd, jnp.where(self < -lambd, self + lambd, 0))


@lowering(aten.softshrink_backward.default)
def softshrink_backward(grad_output, self, lambd):
    return jnp.where(jnp.abs(self) <= lambd, jnp.zeros((), grad_output.dtype), grad_output)
