"""Normalization: layer norm and batch norm (forward; their backward ops are ``torch._decomp``
decompositions in ``torchlax_ops._decompositions``).

Half-precision inputs compute in float32 and round once, as PyTorch's CPU kernels do.
"""

from __future__ import annotations

import jax
import jax.core
import jax.numpy as jnp
import torch

from .._promotion import HALF, up
from .._table import decomposition, lowering

aten = torch.ops.aten


# -- normalization ---------------------------------------------------------------------------


@lowering(aten.native_layer_norm.default)
def native_layer_norm(input, normalized_shape, weight, bias, eps):
    axes = tuple(range(input.ndim - len(normalized_shape), input.ndim))
    x = up(input)
    mean = jnp.mean(x, axis=axes, keepdims=True)
    centered = x - mean
    rstd = jax.lax.rsqrt(jnp.mean(centered * centered, axis=axes, keepdims=True) + eps)
    out = centered * rstd
    if weight is not None:
        out = out * up(weight)
    if bias is not None:
        out = out + up(bias)
    mixed = weight is not None and weight.dtype != input.dtype
    stats = jnp.float32 if mixed else input.dtype
    return out.astype(input.dtype), mean.astype(stats), rstd.astype(stats)


def _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """(out, save_mean, save_invstd, new_running_mean, new_running_var) as PyTorch's CPU kernel.

    The saved statistics are float32 when a half-precision input meets float32 parameters
    ("mixed type"), else the input's dtype; in eval mode they are empty, shape (0,).
    """
    params = [t for t in (weight, bias, running_mean, running_var) if t is not None]
    mixed = input.dtype in HALF and any(p.dtype == jnp.float32 for p in params)
    stats_dtype = jnp.float32 if mixed else input.dtype
    x = up(input)
    axes = (0, *range(2, input.ndim))
    shape = (1, -1) + (1,) * (input.ndim - 2)
    new_mean, new_var = running_mean, running_var
    if training:
        mean = jnp.mean(x, axis=axes)
        var = jnp.mean(jnp.square(x - mean.reshape(shape)), axis=axes)
        invstd = jax.lax.rsqrt(var + eps)
        saved = mean.astype(stats_dtype), invstd.astype(stats_dtype)
        if running_mean is not None:
            new_mean = (momentum * mean + (1 - momentum) * up(running_mean)).astype(
                running_mean.dtype
            )
        if running_var is not None:
            n = input.size // input.shape[1]
            unbiased = var * n / jnp.asarray(n - 1, var.dtype)
            new_var = (momentum * unbiased + (1 - momentum) * up(running_var)).astype(
                running_var.dtype
            )
    else:
        if running_mean is None or running_var is None:
            raise RuntimeError(
                "batch_norm: running_mean and running_var must be given in eval "
                "mode (training=False); pass them, or set training=True."
            )
        mean = up(running_mean).astype(x.dtype)
        invstd = jax.lax.rsqrt(up(running_var).astype(x.dtype) + eps)
        saved = jnp.zeros((0,), stats_dtype), jnp.zeros((0,), stats_dtype)
    out = (x - mean.reshape(shape)) * invstd.reshape(shape)
    if weight is not None:
        out = out * up(weight).reshape(shape)
    if bias is not None:
        out = out + up(bias).reshape(shape)
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
