"""Normalization: layer norm and batch norm (forward; their backward ops are ``torch._decomp``
decompositions in ``torchlax_ops._decompositions``).

Half-precision inputs compute in float32 and round once, as PyTorch's CPU kernels do: each
lowering declares it, and where its results round to, in its stanza.
"""

from __future__ import annotations

import jax
import jax.core
import jax.numpy as jnp

from .. import _aten
from .._promotion import declared, opmath_dtype
from .._table import decomposition, lowering
from ._common import _scalar_name

aten = _aten.aten  # (an op this torch lacks: a Missing, skipped)


# -- normalization ---------------------------------------------------------------------------


@lowering(aten.native_layer_norm.default)
def native_layer_norm(input, normalized_shape, weight, bias, eps):
    _check_layer_norm_dtypes(input, weight, bias)
    return _layer_norm(input, normalized_shape, weight, bias, eps)


def _check_layer_norm_dtypes(input, weight, bias) -> None:
    """PyTorch's CPU rule: parameters of the input's dtype, or a half-precision input with
    float32 parameters ("mixed type", decided by the first parameter given)."""
    params = {name: p for name, p in (("weight", weight), ("bias", bias)) if p is not None}
    if not params or next(iter(params.values())).dtype == input.dtype:
        for name, param in params.items():
            if param.dtype != input.dtype:
                raise RuntimeError(
                    f"expected scalar type {_scalar_name(input)} but found {_scalar_name(param)}. "
                    f"native_layer_norm got {name} of another dtype than its input: pass "
                    "weight and bias of the input's dtype (or float32 for a half input)."
                )
        return
    for name, param in params.items():
        if param.dtype != jnp.float32:
            raise RuntimeError(
                "mixed dtype (CPU): expect parameter to have scalar type of Float. "
                f"native_layer_norm got {name} of dtype {_scalar_name(param)} for an input of "
                f"{_scalar_name(input)}; pass weight and bias of the input's dtype, or float32 "
                "for a half-precision input."
            )
    if opmath_dtype(input.dtype) != jnp.float32:  # float32 parameters only for half inputs
        raise RuntimeError(
            "mixed dtype (CPU): all inputs must share same datatype. native_layer_norm got "
            f"float32 parameters for an input of {_scalar_name(input)}; float32 parameters "
            "mix only with a float16 or bfloat16 input, so cast them to the input's dtype."
        )


# The output takes the input's dtype; the statistics round to the arguments' common dtype, so
# a half input with float32 parameters ("mixed type") keeps float32 statistics, as PyTorch.
def _layer_norm(input, normalized_shape, weight, bias, eps):
    axes = tuple(range(input.ndim - len(normalized_shape), input.ndim))
    mean = jnp.mean(input, axis=axes, keepdims=True)
    centered = input - mean
    rstd = jax.lax.rsqrt(jnp.mean(centered * centered, axis=axes, keepdims=True) + eps)
    out = centered * rstd
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out.astype(input.dtype), mean, rstd


_layer_norm = declared(
    aten.native_layer_norm.default, _layer_norm, None, None, True, ("input", None, None)
)
# The dtype check reads the arguments as passed, before opmath's float32: the registered
# lowering checks, then runs the declared computation, and carries its declaration.
native_layer_norm.opmath = _layer_norm.opmath  # pyright: ignore[reportFunctionMemberAccess]


def _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """(out, save_mean, save_invstd, new_running_mean, new_running_var) as PyTorch's CPU kernel.

    Called by lowerings declaring ``opmath=True``: half precision arrives in float32, and the
    stanza's ``results=`` rounds each result back (the saved statistics stay float32 when a
    half-precision input meets float32 parameters). In eval mode they are empty, shape (0,).
    """
    axes = (0, *range(2, input.ndim))
    shape = (1, -1) + (1,) * (input.ndim - 2)
    new_mean, new_var = running_mean, running_var
    if training:
        mean = jnp.mean(input, axis=axes)
        var = jnp.mean(jnp.square(input - mean.reshape(shape)), axis=axes)
        invstd = jax.lax.rsqrt(var + eps)
        saved = mean, invstd
        if running_mean is not None:
            new_mean = (momentum * mean + (1 - momentum) * running_mean).astype(running_mean.dtype)
        if running_var is not None:
            n = input.size // input.shape[1]
            unbiased = var * n / jnp.asarray(n - 1, var.dtype)
            new_var = (momentum * unbiased + (1 - momentum) * running_var).astype(running_var.dtype)
    else:
        if running_mean is None or running_var is None:
            raise RuntimeError(
                "batch_norm: running_mean and running_var must be given in eval "
                "mode (training=False); pass them, or set training=True."
            )
        mean = running_mean.astype(input.dtype)
        invstd = jax.lax.rsqrt(running_var.astype(input.dtype) + eps)
        saved = jnp.zeros((0,), input.dtype), jnp.zeros((0,), input.dtype)
    out = (input - mean.reshape(shape)) * invstd.reshape(shape)
    if weight is not None:
        out = out * weight.reshape(shape)
    if bias is not None:
        out = out + bias.reshape(shape)
    return (out.astype(input.dtype), *saved, new_mean, new_var)


def _no_reserve():
    return jnp.zeros((0,), jnp.uint8)  # cuDNN's reserve space: always empty off CUDA


_STATS = ("input", None, None)  # (out, save_mean, save_invstd): see native_layer_norm
_RUNNING = ("running_mean", "running_var")


@lowering(
    aten._native_batch_norm_legit_functional.default, opmath=True, results=(*_STATS, *_RUNNING)
)
def _native_batch_norm_legit_functional(
    input, weight, bias, running_mean, running_var, training, momentum, eps
):
    return _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)


@lowering(aten._native_batch_norm_legit.no_stats, opmath=True, results=_STATS)
def _native_batch_norm_legit_no_stats(input, weight, bias, training, momentum, eps):
    return _batch_norm(input, weight, bias, None, None, training, momentum, eps)[:3]


@lowering(aten._native_batch_norm_legit_no_training.default, opmath=True, results=_STATS)
def _native_batch_norm_legit_no_training(
    input, weight, bias, running_mean, running_var, momentum, eps
):
    return _batch_norm(input, weight, bias, running_mean, running_var, False, momentum, eps)[:3]


@lowering(
    aten._batch_norm_with_update_functional.default,
    opmath=True,
    results=(*_STATS, None, *_RUNNING),  # the 4th, cuDNN's reserve space, is uint8
)
def _batch_norm_with_update_functional(
    input, weight, bias, running_mean, running_var, momentum, eps
):
    out, mean, invstd, new_mean, new_var = _batch_norm(
        input, weight, bias, running_mean, running_var, True, momentum, eps
    )
    return out, mean, invstd, _no_reserve(), new_mean, new_var


@lowering(aten._batch_norm_no_update.default, opmath=True, results=(*_STATS, None))
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
