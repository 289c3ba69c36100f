"""Random ops. Each draws a fresh key from ``current_env().next_prng_key(generator)``.

So ``torch.manual_seed`` (and ``generator=``) make results repeatable, successive calls differ,
and under ``torchlax.jit`` keys come from the program's key input, never a baked constant.
Values follow PyTorch's distributions, not its bit streams.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from torchlax_core import check, current_env, jax_dtype

from .. import _aten
from .._promotion import opmath_dtype
from .._table import lowering
from ._common import _dtype_of

aten = _aten.aten  # (an op this torch lacks: a Missing, skipped)


def _key(generator=None):
    return current_env().next_prng_key(generator)


def _float_dtype(dtype):
    return jax_dtype(dtype) if dtype is not None else jax_dtype(torch.get_default_dtype())


def _compute_dtype(dtype):
    # Draw half-precision values in float32 and round once, as PyTorch's CPU kernels do.
    return opmath_dtype(jnp.dtype(dtype))


def _uniform(key, shape, dtype, low=0.0, high=1.0):
    dtype = jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        real = jnp.finfo(dtype).dtype
        parts = jax.random.uniform(key, (2, *shape), real, low, high)
        return jax.lax.complex(parts[0], parts[1])
    compute = _compute_dtype(dtype)
    return jax.random.uniform(key, tuple(shape), compute, low, high).astype(dtype)


def _normal(key, shape, dtype):
    dtype = jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        # PyTorch: real and imaginary parts each have variance 1/2.
        real = jnp.finfo(dtype).dtype
        parts = jax.random.normal(key, (2, *shape), real) * jnp.sqrt(jnp.asarray(0.5, real))
        return jax.lax.complex(parts[0], parts[1])
    return jax.random.normal(key, tuple(shape), _compute_dtype(dtype)).astype(dtype)


def _require_float(op: str, dtype) -> None:
    if not jnp.issubdtype(dtype, jnp.inexact):
        raise RuntimeError(
            f"{op} needs a floating-point tensor, got one of dtype {dtype}; convert it with "
            ".float() first."
        )


# -- factories --------------------------------------------------------------------------------


@lowering(aten.rand.default, aten.rand.generator)
def rand(size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    return _uniform(_key(generator), size, _float_dtype(dtype))


@lowering(aten.randn.default, aten.randn.generator)
def randn(size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    return _normal(_key(generator), size, _float_dtype(dtype))


@lowering(aten.rand_like.default, aten.rand_like.generator)
def rand_like(
    self,
    *,
    generator=None,
    dtype=None,
    layout=None,
    device=None,
    pin_memory=None,
    memory_format=None,
):
    return _uniform(_key(generator), self.shape, self.dtype if dtype is None else jax_dtype(dtype))


@lowering(aten.randn_like.default, aten.randn_like.generator)
def randn_like(
    self,
    *,
    generator=None,
    dtype=None,
    layout=None,
    device=None,
    pin_memory=None,
    memory_format=None,
):
    return _normal(_key(generator), self.shape, self.dtype if dtype is None else jax_dtype(dtype))


def _integers(key, shape, low, high, dtype):
    dtype = jnp.dtype(dtype)
    if high <= low:
        raise RuntimeError(
            f"random_ expects 'from' to be less than 'to', but got from={low} >= to={high}"
        )
    values = jax.random.randint(key, tuple(shape), low, high, dtype=jnp.int64)
    return values.astype(dtype)


@lowering(aten.randint.default, aten.randint.generator)
def randint(
    high, size, *, generator=None, dtype=torch.long, layout=None, device=None, pin_memory=None
):
    return _integers(_key(generator), size, 0, high, jax_dtype(dtype or torch.long))


@lowering(aten.randint.low, aten.randint.low_generator)
def randint_low(
    low, high, size, *, generator=None, dtype=torch.long, layout=None, device=None, pin_memory=None
):
    return _integers(_key(generator), size, low, high, jax_dtype(dtype or torch.long))


@lowering(aten.randint_like.default, aten.randint_like.generator)
def randint_like(
    self,
    high,
    *,
    generator=None,
    dtype=None,
    layout=None,
    device=None,
    pin_memory=None,
    memory_format=None,
):
    return _integers(
        _key(generator), self.shape, 0, high, self.dtype if dtype is None else jax_dtype(dtype)
    )


@lowering(aten.randint_like.low_dtype, aten.randint_like.low_generator_dtype)
def randint_like_low(
    self,
    low,
    high,
    *,
    generator=None,
    dtype=None,
    layout=None,
    device=None,
    pin_memory=None,
    memory_format=None,
):
    return _integers(
        _key(generator), self.shape, low, high, self.dtype if dtype is None else jax_dtype(dtype)
    )


@lowering(aten.randint_like.Tensor, aten.randint_like.Tensor_generator)
def randint_like_tensor(
    self,
    high,
    *,
    generator=None,
    dtype=None,
    layout=None,
    device=None,
    pin_memory=None,
    memory_format=None,
):
    out_dtype = self.dtype if dtype is None else jax_dtype(dtype)
    values = jax.random.randint(
        _key(generator), self.shape, 0, high.astype(jnp.int64), dtype=jnp.int64
    )
    return values.astype(out_dtype)


@lowering(aten.randperm.default, aten.randperm.generator)
def randperm(n, *, generator=None, dtype=torch.long, layout=None, device=None, pin_memory=None):
    return jax.random.permutation(_key(generator), n).astype(jax_dtype(dtype or torch.long))


@lowering(aten.normal.float_float)
def normal_float_float(
    mean, std, size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None
):
    out_dtype = _float_dtype(dtype)
    return (mean + std * _normal(_key(generator), size, out_dtype)).astype(out_dtype)


# -- sampling into the shape (and dtype) of an existing tensor ------------------------------------


@lowering(aten.uniform.default)
def uniform(self, from_=0.0, to=1.0, *, generator=None):
    _require_float("aten.uniform_", self.dtype)
    return _uniform(_key(generator), self.shape, self.dtype, from_, to)


@lowering(aten.normal_.default, aten.normal_functional.default)
def normal_(self, mean=0.0, std=1.0, *, generator=None):
    _require_float("aten.normal_", self.dtype)
    if std < 0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {std}")
    return (mean + std * _normal(_key(generator), self.shape, self.dtype)).astype(self.dtype)


@lowering(aten.normal.Tensor_float)
def normal_tensor_float(mean, std=1.0, *, generator=None):
    noise = _normal(_key(generator), mean.shape, mean.dtype)
    return (mean + std * noise).astype(mean.dtype)


@lowering(aten.normal.float_Tensor)
def normal_float_tensor(mean, std, *, generator=None):
    noise = _normal(_key(generator), std.shape, std.dtype)
    return (mean + std * noise).astype(std.dtype)


@lowering(aten.normal.Tensor_Tensor)
def normal_tensor_tensor(mean, std, *, generator=None):
    shape = jnp.broadcast_shapes(mean.shape, std.shape)
    dtype = jnp.promote_types(mean.dtype, std.dtype)
    return (mean + std * _normal(_key(generator), shape, dtype)).astype(dtype)


@lowering(aten.exponential.default)
def exponential(self, lambd=1.0, *, generator=None):
    _require_float("aten.exponential_", self.dtype)
    draw = jax.random.exponential(_key(generator), self.shape, _compute_dtype(self.dtype))
    return (draw / lambd).astype(self.dtype)


@lowering(aten.geometric.default)
def geometric(self, p, *, generator=None):
    # Number of Bernoulli(p) trials up to and including the first success: ceil(log(u)/log(1-p)).
    u = jax.random.uniform(
        _key(generator), self.shape, jnp.float64, minval=jnp.finfo(jnp.float64).tiny
    )
    return jnp.maximum(jnp.ceil(jnp.log(u) / jnp.log1p(-p)), 1).astype(self.dtype)


@lowering(aten.log_normal.default)
def log_normal(self, mean=1.0, std=2.0, *, generator=None):
    _require_float("aten.log_normal_", self.dtype)
    draw = jax.random.normal(_key(generator), self.shape, _compute_dtype(self.dtype))
    return jnp.exp(mean + std * draw).astype(self.dtype)


@lowering(aten.cauchy.default)
def cauchy(self, median=0.0, sigma=1.0, *, generator=None):
    _require_float("aten.cauchy_", self.dtype)
    draw = jax.random.cauchy(_key(generator), self.shape, _compute_dtype(self.dtype))
    return (median + sigma * draw).astype(self.dtype)


def _random_upper(dtype) -> int:
    # random_() without bounds: [0, 2**digits] for floats (every integer exactly representable),
    # [0, max] for integers, {0, 1} for bool.
    dtype = jnp.dtype(dtype)
    if dtype == jnp.bool_:
        return 2
    if jnp.issubdtype(dtype, jnp.floating):
        return 2 ** (jnp.finfo(dtype).nmant + 1) + 1
    return int(jnp.iinfo(dtype).max) + (0 if dtype.itemsize == 8 else 1)


@lowering(aten.random.default)
def random(self, *, generator=None):
    return _integers(_key(generator), self.shape, 0, _random_upper(self.dtype), self.dtype)


@lowering(getattr(aten.random, "from"))
def random_from(self, from_, to, *, generator=None):
    high = _random_upper(self.dtype) if to is None else to
    return _integers(_key(generator), self.shape, from_, high, self.dtype)


@lowering(aten.random.to)
def random_to(self, to, *, generator=None):
    return _integers(_key(generator), self.shape, 0, to, self.dtype)


@lowering(aten.poisson.default)
def poisson(self, generator=None):
    return jax.random.poisson(_key(generator), self, self.shape).astype(self.dtype)


# -- Bernoulli, dropout, multinomial -------------------------------------------------------------


def _bernoulli(key, p, shape, dtype):
    return (
        jax.random.uniform(
            key, tuple(shape), jnp.float32 if jnp.dtype(dtype).itemsize < 8 else jnp.float64
        )
        < p
    ).astype(dtype)


@lowering(aten.bernoulli.default)
def bernoulli(self, *, generator=None):
    return _bernoulli(_key(generator), self, self.shape, self.dtype)


@lowering(aten.bernoulli.p, aten.bernoulli_.float)
def bernoulli_p(self, p=0.5, *, generator=None):
    return _bernoulli(_key(generator), p, self.shape, self.dtype)


@lowering(aten.bernoulli.Tensor)
def bernoulli_tensor(self, p, *, generator=None):
    return _bernoulli(_key(generator), p, self.shape, self.dtype)


@lowering(aten.native_dropout.default)
def native_dropout(input, p, train):
    if train is False or p == 0:
        return input, jnp.ones(input.shape, jnp.bool_)
    keep = jax.random.uniform(_key(), input.shape, jnp.float32) >= p
    scale = 0.0 if p == 1 else 1.0 / (1.0 - p)
    return jnp.where(keep, input * jnp.asarray(scale, input.dtype), 0).astype(input.dtype), keep


@lowering(aten.multinomial.default)
def multinomial(self, num_samples, replacement=False, *, generator=None):
    if not replacement and num_samples > self.shape[-1]:
        raise RuntimeError(
            "aten.multinomial: cannot sample n_sample > prob_dist.size(-1) samples without "
            "replacement."
        )
    # PyTorch's checks of the distribution (eagerly one host read each; see torchlax_core.check).
    check(
        jnp.all(jnp.isfinite(self) & (self >= 0)),
        RuntimeError,
        "probability tensor contains either `inf`, `nan` or element < 0",
    )
    check(
        jnp.all(jnp.sum(self, axis=-1) > 0),
        RuntimeError,
        "invalid multinomial distribution (sum of probabilities <= 0)",
    )
    key = _key(generator)
    logits = jnp.log(
        self.astype(jnp.float64) if self.dtype == jnp.float64 else self.astype(jnp.float32)
    )
    if replacement:
        shape = (*self.shape[:-1], num_samples)
        draws = jax.random.categorical(key, logits[..., None, :], axis=-1, shape=shape)
        return draws.astype(jnp.int64)
    # Without replacement: the top-k of Gumbel-perturbed log-probabilities is a draw of k
    # distinct categories with PyTorch's sequential-sampling distribution.
    gumbel = jax.random.gumbel(key, self.shape, logits.dtype)
    _, picks = jax.lax.top_k(logits + gumbel, num_samples)
    return picks.astype(jnp.int64)


@lowering(aten.native_dropout_backward.default, opmath=True, args=("grad_output",))
def native_dropout_backward(grad_output, mask, scale):
    # grad * mask * scale with PyTorch's promotion: an integer gradient becomes floating.
    floating = jnp.issubdtype(grad_output.dtype, jnp.inexact)
    out_dtype = grad_output.dtype if floating else _dtype_of(torch.get_default_dtype())
    return (grad_output.astype(out_dtype) * mask * scale).astype(out_dtype)
