"""Scaled dot-product attention on JAX's Pallas TPU kernels: when, and the flash kernel's calls.

``kernel_refusal`` is the one rule: on a TPU, a call a kernel computes as PyTorch does, and
that the kernel pays for, runs one of JAX's kernels (forward and backward: torchlax does not
write a kernel): a call without a mask the splash kernel (``_splash_kernel``; its fused
backward measured faster), one with a mask
``jax.experimental.pallas.ops.tpu.flash_attention`` with the mask as its bias
(``TORCHLAX_ATTENTION_SPLASH=0``: every kernel call the flash kernel); any other call, and
every call elsewhere, runs the plain lowering in ``_lowerings.attention``. Each decision is
logged once per kind of call at ``TORCHLAX_LOG=info`` (logger ``torchlax.attention``).

Whether the kernel pays (``TORCHLAX_ATTENTION_KERNEL``, read at the first attention call, so
that a bad value fails that call and not the import of the ops: ``auto``, the default;
``always``, every call it can compute; ``never``): under ``auto`` it takes the calls whose
float32 scores, which the plain lowering materializes, would reach ``_SCORES_BYTES``, and no
call with a mask but a causal one (the kernel takes a mask as a float32 bias of the scores' full
shape, as large as what it saves). On a v5e at 512-long blocks the kernel is the faster from
GPT-2 small's attention up (benchmarks/tpu_attention.py; numbers in benchmarks/README.md).

What the kernel takes: bfloat16 q, k, v (float32 too under the "medium" float32 matmul
precision: the kernel's products are single bfloat16 passes, measured on a v5e) of shape
(batch, heads, length, head_dim),
both lengths multiples of 128 (its block), a head_dim of at most 128 or a multiple of it, no
dropout. The flash kernel takes grouped-query attention with k and v repeated over the groups
(their gradients summed back); a boolean or float mask becomes the kernel's additive bias
(masked out: a large finite negative, where the kernel's own masking works; a row masked out
entirely gives zeros, as PyTorch's ``_safe_softmax``, with a logsumexp of 0, as the plain
lowering). Dropout is
refused: the kernel draws no dropout mask, and the plain lowering's mask is the one its
backward redraws from the saved seed.

The kernel's forward with residuals and its backward are JAX's private ``_flash_attention``
and ``_flash_attention_bwd``: PyTorch's autograd saves the output and the logsumexp between
its two ops, where the public ``flash_attention`` would recompute the forward in the backward.
The backward takes the saved logsumexp as the kernel's row maximum and 1 as its row sum (its
weights are ``exp(s - m) / l``).

A boolean mask of the scores' last two dimensions with as many queries as keys may be the
causal one: transformers materializes its causal mask whenever it is traced (``torch.compile``,
``torchlax.jit``), where eagerly it would pass ``is_causal=True``. Such a call (``plan_for``:
``Plan.causal_check``) compares the mask with the causal one in the program and runs the kernel
with ``causal=True`` (no bias) where it is (``jax.lax.cond``; the comparison reads the mask's
bytes once, and XLA shares it between the layers that take the same mask), else what the call
would run without the check.

The kernel's blocks: ``TORCHLAX_ATTENTION_BLOCK`` (read with the choice; a multiple of 128,
default ``_DEFAULT_BLOCK``) is the largest block of the forward and backward passes along each
length; a length it does not divide takes the largest power-of-two multiple of 128 below it
that does.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os

import jax
import jax.numpy as jnp
from torchlax_core.internal import float32_matmul_precision, get_logger, no_x64

from . import _splash_kernel
from ._promotion import accumulator

__all__ = [
    "Plan",
    "backward",
    "causal_mask",
    "forward",
    "kernel_refusal",
    "may_be_causal",
    "plan_for",
    "seen",
    "sum_to",
]

_log = get_logger("attention")
_BLOCK = 128
_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
# A masked-out position's bias: finite (the kernel's running maximum must stay a number) and far
# below any score, even divided by a small scale (the kernel scales the bias with the scores).
_MASKED = -1e30
_logged: dict = {}  # (why, plan, shape, dtype) -> what the log line said
_CHOICES = ("auto", "always", "never")
_SCORES_BYTES = 64 << 20
_DEFAULT_BLOCK = 512


def _choice_from_environment() -> str:
    value = os.environ.get("TORCHLAX_ATTENTION_KERNEL", "auto").strip().lower() or "auto"
    if value not in _CHOICES:
        raise ValueError(
            f"scaled_dot_product_attention reads TORCHLAX_ATTENTION_KERNEL={value!r}, which is "
            f"not one of {', '.join(_CHOICES)}: set it to 'auto' (the default), 'always' or "
            "'never', or unset it."
        )
    return value


def _block_from_environment() -> int:
    text = os.environ.get("TORCHLAX_ATTENTION_BLOCK", "").strip() or str(_DEFAULT_BLOCK)
    value = int(text) if text.isdigit() else 0
    if value < _BLOCK or value % _BLOCK:
        raise ValueError(
            f"scaled_dot_product_attention reads TORCHLAX_ATTENTION_BLOCK={text!r}, which is "
            f"not a positive multiple of {_BLOCK}: set it to 128, 256, 512, ... (the Pallas "
            f"kernel's largest block; default {_DEFAULT_BLOCK}), or unset it."
        )
    return value


def _splash_from_environment() -> bool:
    text = os.environ.get("TORCHLAX_ATTENTION_SPLASH", "").strip() or "1"
    if text not in ("0", "1"):
        raise ValueError(
            f"scaled_dot_product_attention reads TORCHLAX_ATTENTION_SPLASH={text!r}, which is "
            "neither '1' (the default: the splash kernel for calls without a mask) nor '0' "
            "(the flash kernel for every kernel call): set one, or unset it."
        )
    return text == "1"


choice: str | None = None  # None: not read yet (``_chosen``)
block: int | None = None  # None: not read yet
splash: bool | None = None  # None: not read yet


def _chosen() -> str:
    global choice, block, splash
    if choice is None:
        choice = _choice_from_environment()
    if block is None:
        block = _block_from_environment()
    if splash is None:
        splash = _splash_from_environment()
    return choice


def _splashed(attn_bias) -> bool:
    """Whether a kernel call runs the splash kernel (no bias), else the flash kernel."""
    if splash is None:
        _chosen()
    return attn_bias is None and bool(splash)


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
    if attn_bias is not None and not may_be_causal(query, key, attn_bias):
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


def may_be_causal(query, key, attn_bias) -> bool:
    """Whether ``attn_bias`` is a boolean mask that may be the causal one (``causal_mask``)."""
    length, source = query.shape[-2], key.shape[-2]
    return (
        jnp.dtype(attn_bias.dtype) == jnp.bool_
        and length == source
        and 2 <= len(attn_bias.shape) <= 4
        and tuple(attn_bias.shape[-2:]) == (length, source)
    )


def causal_mask(attn_bias, length: int, source: int):
    """Whether the boolean ``attn_bias`` is the causal mask of every batch row and head (a
    traced boolean scalar)."""
    return jnp.all(attn_bias == jnp.tril(jnp.ones((length, source), jnp.bool_)))


@dataclasses.dataclass(frozen=True)
class Plan:
    """How one attention call runs: ``kernel``, the kernel computes it as given (a mask as its
    bias), else the plain lowering; ``causal_check``, first where its boolean mask is the causal
    one at run time, the kernel with ``causal=True`` instead."""

    kernel: bool
    causal_check: bool


def plan_for(query, key, value, attn_bias, dropout_p) -> Plan:
    """The ``Plan`` of this call on this platform (``kernel_refusal``), logged once per kind
    of call."""
    on = platform()
    # (a float32 call's choice reads the mode, which then keys the caches: torchlax_core)
    f32 = on == "tpu" and jnp.dtype(query.dtype) == jnp.float32
    mode = float32_matmul_precision() if f32 else "highest"
    chosen = _chosen()
    why = kernel_refusal(query, key, value, attn_bias, dropout_p, on, mode, chosen)
    check = False
    if attn_bias is not None and may_be_causal(query, key, attn_bias):
        check = kernel_refusal(query, key, value, None, dropout_p, on, mode, chosen) is None
        if check and why is None and chosen == "auto":
            why = "a mask that is not the causal one"
    plan = Plan(why is None, check)
    _log_plan(plan, why, query, attn_bias is not None)
    return plan


def _log_plan(plan: Plan, why: str | None, query, masked: bool) -> None:
    shape, dtype = tuple(query.shape), jnp.dtype(query.dtype).name
    if (why, plan, masked, shape, dtype) in _logged or len(_logged) >= 256:
        return
    flash = "the Pallas TPU flash-attention kernel"
    kernel = "the Pallas TPU splash-attention kernel" if _splashed(None) else flash
    said = f"the plain lowering, since {why}"
    if plan.kernel:
        said = f"{flash} with the mask as its bias" if masked else kernel
    if plan.causal_check:
        other = f"{flash} with the mask as its bias" if plan.kernel else "the plain lowering"
        said = (
            f"{kernel} with causal=True where the boolean mask is the causal one (checked in "
            f"the program), else {other}"
        )
    _logged[why, plan, masked, shape, dtype] = said
    _log.info("scaled_dot_product_attention (%s, query %s): %s", dtype, shape, said)


def seen() -> list[str]:
    """The choices logged so far (each kind of call's once), as the log lines say them."""
    return sorted(set(_logged.values()))


def _flash():
    from jax.experimental.pallas.ops.tpu import flash_attention  # (imports Pallas: on use)

    return flash_attention


def _fitting(length: int, largest: int) -> int:
    """The largest block of at most ``largest`` that divides ``length`` (a multiple of 128)."""
    size = largest
    while length % size:
        size = max(_BLOCK, size // 2 // _BLOCK * _BLOCK)
    return size


def _lengths(query, key) -> tuple[int, int]:
    """The kernels' blocks along the query and the key lengths."""
    largest = block or _block_from_environment()
    return _fitting(query.shape[-2], largest), _fitting(key.shape[-2], largest)


def _blocks(flash, query, key):
    q, k = _lengths(query, key)
    return flash.BlockSizes(
        block_q=q,
        block_k_major=k,
        block_k=k,
        block_b=1,
        block_q_major_dkv=q,
        block_k_major_dkv=k,
        block_k_dkv=k,
        block_q_dkv=q,
        block_k_major_dq=k,
        block_k_dq=k,
        block_q_dq=q,
    )


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


def forward(query, key, value, attn_bias, is_causal, scale) -> tuple:
    """(output, logsumexp) of attention by the kernel (``kernel_refusal`` said yes).

    Differentiable by JAX too (``torchlax.functional`` under ``jax.grad``): its VJP is
    ``backward``, the output's cotangent alone (PyTorch's backward takes no logsumexp's)."""
    return _attend(query, key, value, attn_bias, is_causal, _scale(query, scale))  # pyright: ignore[reportReturnType]  (a pair: custom_vjp's result type is not inferred)


def _forward(query, key, value, attn_bias, is_causal, scale):
    if _splashed(attn_bias):
        return _splash_kernel.forward(query, key, value, is_causal, scale, _lengths(query, key))
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
        grad_bias = sum_to(grads[3], attn_bias.shape).astype(attn_bias.dtype)
    return (*grads[:3], grad_bias)


_attend.defvjp(_attend_forward, _attend_backward)


def sum_to(grad, shape):
    """``grad`` summed over the dimensions broadcasting gave an operand of ``shape`` (a bias,
    here and in the plain lowering's backward)."""
    lead = grad.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, n in enumerate(shape) if n == 1 and grad.shape[lead + i] != 1
    )
    return jnp.sum(grad, axis=axes).reshape(shape) if axes else grad


def backward(grad_out, query, key, value, attn_bias, out, logsumexp, is_causal, scale):
    """(grad_query, grad_key, grad_value, grad of the broadcast bias or None) by the kernel's
    backward, from the forward's output and logsumexp."""
    scale = _scale(query, scale)
    if _splashed(attn_bias):
        lengths = _lengths(query, key)
        grads = _splash_kernel.backward(
            grad_out, query, key, value, out, logsumexp, is_causal, scale, lengths
        )
        return (*grads, None)
    flash = _flash()
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
