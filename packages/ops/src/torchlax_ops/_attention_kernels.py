"""Scaled dot-product attention on JAX's Pallas TPU flash-attention kernel: when, and the calls.

``kernel_refusal`` is the one rule: on a TPU, a call the kernel computes as PyTorch does, and
that the kernel pays for, runs ``jax.experimental.pallas.ops.tpu.flash_attention`` (forward and
backward: torchlax does not write a kernel); any other call, and every call elsewhere, runs the
plain lowering in ``_lowerings.attention``. Each decision is logged once per kind of call at
``TORCHLAX_LOG=info`` (logger ``torchlax.attention``).

Whether the kernel pays (``TORCHLAX_ATTENTION_KERNEL``, read at the first attention call, so
that a bad value fails that call and not the import of the ops: ``auto``, the default;
``always``, every call it can compute; ``never``): under ``auto`` it takes the calls whose
float32 scores, which the plain lowering materializes, would reach ``_SCORES_BYTES``, and no
call with a mask (the kernel takes a mask as a float32 bias of the scores' full shape, as large
as what it saves). On a v5e at GPT-2 small's attention the plain lowering was the faster one
(benchmarks/tpu_attention.py; numbers in benchmarks/README.md).

What the kernel takes: bfloat16 q, k, v (float32 too under the "medium" float32 matmul
precision: the kernel's products are single bfloat16 passes, measured on a v5e) of shape
(batch, heads, length, head_dim),
both lengths multiples of 128 (its block), a head_dim of at most 128 or a multiple of it, no
dropout. Grouped-query attention repeats k and v over the groups first (their gradients are
summed back); a boolean or float mask becomes the kernel's additive bias (masked out: a large
finite negative, where the kernel's own masking works; a row masked out entirely gives zeros,
as PyTorch's ``_safe_softmax``, with a logsumexp of 0, as the plain lowering). Dropout is
refused: the kernel draws no dropout mask, and the plain lowering's mask is the one its
backward redraws from the saved seed.

The kernel's forward with residuals and its backward are JAX's private ``_flash_attention``
and ``_flash_attention_bwd``: PyTorch's autograd saves the output and the logsumexp between
its two ops, where the public ``flash_attention`` would recompute the forward in the backward.
The backward takes the saved logsumexp as the kernel's row maximum and 1 as its row sum (its
weights are ``exp(s - m) / l``).
"""

from __future__ import annotations

import functools
import math
import os

import jax
import jax.numpy as jnp
from torchlax_core.internal import float32_matmul_precision, get_logger, no_x64

from ._promotion import accumulator

__all__ = ["backward", "forward", "kernel_refusal", "use_kernel"]

_log = get_logger("attention")
_BLOCK = 128
_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
# A masked-out position's bias: finite (the kernel's running maximum must stay a number) and far
# below any score, even divided by a small scale (the kernel scales the bias with the scores).
_MASKED = -1e30
_logged: set = set()
_CHOICES = ("auto", "always", "never")
_SCORES_BYTES = 1 << 30


def _choice_from_environment() -> str:
    value = os.environ.get("TORCHLAX_ATTENTION_KERNEL", "auto").strip().lower() or "auto"
    if value not in _CHOICES:
        raise ValueError(
            f"scaled_dot_product_attention reads TORCHLAX_ATTENTION_KERNEL={value!r}, which is "
            f"not one of {', '.join(_CHOICES)}: set it to 'auto' (the default), 'always' or "
            "'never', or unset it."
        )
    return value


choice: str | None = None  # None: not read yet (``_chosen``)


def _chosen() -> str:
    global choice
    if choice is None:
        choice = _choice_from_environment()
    return choice


def platform() -> str:
    """Where the lowerings run: JAX's default backend (torchlax's ``jax`` device)."""
    return jax.default_backend()


def kernel_refusal(
    query,
    key,
    value,
    attn_bias,
    dropout_p,
    on: str,
    mode: str = "highest",
    chosen: str = "always",
) -> str | None:
    """Why the flash-attention kernel does not compute this call on platform ``on`` under the
    float32 matmul precision ``mode`` and the choice ``chosen`` (see the module), or None: it
    does. Takes arrays (or anything with ``shape`` and ``dtype``)."""
    if on != "tpu":
        return f"the platform is {on}, not a TPU"
    if chosen == "never":
        return "TORCHLAX_ATTENTION_KERNEL=never"
    why = _unsupported(query, key, value, attn_bias, dropout_p, mode)
    if why is None and chosen == "auto":
        why = _not_worth_it(query, key, attn_bias)
    return why


def _not_worth_it(query, key, attn_bias) -> str | None:
    """Why the kernel does not pay for a call it can compute (``auto``), or None."""
    if attn_bias is not None:
        return (
            "a mask (the kernel would take it as a float32 bias of the scores' full shape; "
            "TORCHLAX_ATTENTION_KERNEL=always takes the kernel anyway)"
        )
    scores = math.prod(query.shape[:-1]) * key.shape[-2] * 4
    if scores < _SCORES_BYTES:
        return (
            f"the float32 scores are {scores / 2**20:.0f} MiB, under "
            f"{_SCORES_BYTES / 2**20:.0f} MiB, where the plain lowering is the faster "
            "(TORCHLAX_ATTENTION_KERNEL=always takes the kernel anyway)"
        )
    return None


def _unsupported(query, key, value, attn_bias, dropout_p, mode: str) -> str | None:
    """Why the kernel cannot compute this call as PyTorch does on a TPU, or None."""
    if dropout_p > 0.0:
        return (
            "dropout: the Pallas kernel draws no dropout mask (the plain lowering draws "
            "PyTorch's, and its backward redraws the same from the saved seed)"
        )
    if not (len(query.shape) == len(key.shape) == len(value.shape) == 4):
        return "q, k and v are not 4-d (batch, heads, length, head_dim)"
    if not (query.dtype == key.dtype == value.dtype) or jnp.dtype(query.dtype) not in _DTYPES:
        return f"the dtype {jnp.dtype(query.dtype).name} (the kernel takes float32 or bfloat16)"
    if jnp.dtype(query.dtype) == jnp.float32 and mode != "medium":
        return (
            f'float32 under the "{mode}" matmul precision (the kernel multiplies in single '
            "bfloat16 passes; set_float32_matmul_precision('medium') allows it)"
        )
    (_, heads, length, dim), (_, kv_heads, source, _) = query.shape, key.shape
    if value.shape[-1] != dim:
        return "value's head_dim differs from query's"
    if kv_heads == 0 or heads % kv_heads:
        return "the query heads are not a multiple of the key/value heads"
    if length % _BLOCK or source % _BLOCK:
        return f"the lengths {length} and {source} are not multiples of {_BLOCK}"
    if dim > _BLOCK and dim % _BLOCK:
        return f"the head_dim {dim} is above {_BLOCK} and not a multiple of it"
    if attn_bias is not None and len(attn_bias.shape) > 4:
        return "the mask has more than 4 dimensions"
    return None


def use_kernel(query, key, value, attn_bias, dropout_p) -> bool:
    """``kernel_refusal`` on this platform, logged once per kind of call."""
    on = platform()
    # (a float32 call's choice reads the mode, which then keys the caches: torchlax_core)
    f32 = on == "tpu" and jnp.dtype(query.dtype) == jnp.float32
    mode = float32_matmul_precision() if f32 else "highest"
    why = kernel_refusal(query, key, value, attn_bias, dropout_p, on, mode, _chosen())
    shape, dtype = tuple(query.shape), jnp.dtype(query.dtype).name
    if (why, shape, dtype) not in _logged and len(_logged) < 256:
        _logged.add((why, shape, dtype))
        if why is None:
            _log.info(
                "scaled_dot_product_attention (%s, query %s): the Pallas TPU flash-attention "
                "kernel",
                dtype,
                shape,
            )
        else:
            _log.info(
                "scaled_dot_product_attention (%s, query %s): the plain lowering, since %s",
                dtype,
                shape,
                why,
            )
    return why is None


def _flash():
    from jax.experimental.pallas.ops.tpu import flash_attention  # (imports Pallas: on use)

    return flash_attention


def _blocks(flash, query, key):
    batch, heads, length, dim = query.shape
    return flash.BlockSizes.get_default(batch, heads, length, key.shape[-2], dim)


def _repeat(x, heads):
    return x if x.shape[1] == heads else jnp.repeat(x, heads // x.shape[1], axis=1)


def _bias(attn_bias, query, key, scale):
    """The kernel's bias (it adds it before scaling: divided by the scale here), shape
    (batch, heads, length, source), and which rows are masked out entirely (or None)."""
    if attn_bias is None:
        return None, None
    shape = (*query.shape[:3], key.shape[-2])
    if attn_bias.dtype == jnp.bool_:
        keep = jnp.broadcast_to(attn_bias, shape)
        bias = jnp.where(keep, jnp.float32(0.0), jnp.float32(_MASKED))  # (not float64: x64)
    else:
        bias = jnp.broadcast_to(attn_bias.astype(jnp.float32), shape)
        keep = bias > -jnp.inf
        bias = jnp.maximum(bias / scale, _MASKED)
        return bias, ~jnp.any(keep, axis=-1)
    return bias / scale, ~jnp.any(keep, axis=-1)


def _scale(query, scale):
    return 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale


def forward(query, key, value, attn_bias, is_causal, scale):
    """(output, logsumexp) of attention by the kernel (``kernel_refusal`` said yes).

    Differentiable by JAX too (``torchlax.functional`` under ``jax.grad``): its VJP is
    ``backward``, the output's cotangent alone (PyTorch's backward takes no logsumexp's)."""
    return _attend(query, key, value, attn_bias, is_causal, _scale(query, scale))


def _forward(query, key, value, attn_bias, is_causal, scale):
    flash = _flash()
    heads = query.shape[1]
    k, v = _repeat(key, heads), _repeat(value, heads)
    bias, empty = _bias(attn_bias, query, key, scale)
    with no_x64():  # (the kernel's index maps mix int32 with Python ints)
        out, total, top = flash._flash_attention(  # pyright: ignore[reportGeneralTypeIssues]  (JAX's private function returns a tuple here: save_residuals=True)
            query, k, v, bias, None, True, is_causal, scale, _blocks(flash, query, key), False
        )
    logsumexp = top + jnp.log(total)
    if empty is not None:
        out = jnp.where(empty[..., None], 0, out).astype(query.dtype)
        logsumexp = jnp.where(empty, 0, logsumexp)
    return out, logsumexp


def _ungroup(grad, heads):
    """A gradient of k or v repeated over the query heads, summed back over each group (a half
    one in its float32 accumulator)."""
    if grad.shape[1] == heads:
        return grad
    batch, _, length, dim = grad.shape
    grouped = grad.reshape(batch, heads, -1, length, dim)
    return jnp.sum(grouped, axis=2, dtype=accumulator(grad.dtype) or grad.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _attend(query, key, value, attn_bias, is_causal, scale):
    return _forward(query, key, value, attn_bias, is_causal, scale)


def _attend_forward(query, key, value, attn_bias, is_causal, scale):
    out, logsumexp = _forward(query, key, value, attn_bias, is_causal, scale)
    return (out, logsumexp), (query, key, value, attn_bias, out, logsumexp)


def _attend_backward(is_causal, scale, saved, cotangents):
    query, key, value, attn_bias, out, logsumexp = saved
    grads = backward(cotangents[0], query, key, value, attn_bias, out, logsumexp, is_causal, scale)
    grad_bias = None
    if attn_bias is not None and jnp.issubdtype(attn_bias.dtype, jnp.floating):
        grad_bias = _sum_to(grads[3], attn_bias.shape).astype(attn_bias.dtype)
    return (*grads[:3], grad_bias)


_attend.defvjp(_attend_forward, _attend_backward)


def _sum_to(grad, shape):
    """``grad`` summed over the dimensions broadcasting gave a bias of ``shape``."""
    lead = grad.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, n in enumerate(shape) if n == 1 and grad.shape[lead + i] != 1
    )
    return jnp.sum(grad, axis=axes).reshape(shape) if axes else grad


def backward(grad_out, query, key, value, attn_bias, out, logsumexp, is_causal, scale):
    """(grad_query, grad_key, grad_value, grad of the broadcast bias or None) by the kernel's
    backward, from the forward's output and logsumexp."""
    flash = _flash()
    scale = _scale(query, scale)
    heads = query.shape[1]
    k, v = _repeat(key, heads), _repeat(value, heads)
    bias, _ = _bias(attn_bias, query, key, scale)
    residuals = (query, k, v, bias, None, out, jnp.ones_like(logsumexp), logsumexp)
    blocks = _blocks(flash, query, key)
    with no_x64():
        grad_q, grad_k, grad_v, grad_bias, _ = flash._flash_attention_bwd(
            False, is_causal, scale, blocks, False, residuals, grad_out.astype(query.dtype)
        )
    grad_k = _ungroup(grad_k, key.shape[1]).astype(key.dtype)
    grad_v = _ungroup(grad_v, value.shape[1]).astype(value.dtype)
    if grad_bias is not None:
        grad_bias = grad_bias / scale  # the kernel's is the gradient of bias / scale
    return grad_q.astype(query.dtype), grad_k, grad_v, grad_bias
