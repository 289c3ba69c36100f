"""The fused kernels behind ``torch.nn``'s inference fast paths.

In ``eval()`` under ``no_grad``, ``nn.MultiheadAttention`` calls
``aten._native_multi_head_attention`` and ``nn.TransformerEncoderLayer`` calls
``aten._transformer_encoder_layer_fwd`` instead of their module code; both mask with
``aten._masked_softmax``. These lowerings compute what PyTorch's CPU kernels compute, in the
same order (bias, then scaling of q by ``1/sqrt(head_dim)``, then ``q k^T``), with matrix
products at the precision of PyTorch's float32 matmul mode (``_precision``). A mask is boolean with True meaning "masked out" (a float mask is
read as ``mask != 0``, as the kernels do), and a row masked out entirely gives NaN, as on CPU.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch
from torchlax_core import current_env

from .. import _aten
from .. import _attention_kernels as kernels
from .._precision import product_precision
from .._promotion import accumulator, declared
from .._recompute import fenced, recomputed
from .._table import decomposition, lowering
from .activations import _gelu, safe_softmax
from .matmul import matmul
from .normalization import native_layer_norm

aten = _aten.aten  # (an op this torch lacks: a Missing, skipped)


def _mask_for(scores, mask, dim, mask_type, op):
    """``mask`` broadcast to ``scores``' shape according to PyTorch's ``mask_type`` codes:
    0 an (L, L) attention mask, 1 a (B, L) key padding mask, 2 a mask of the scores' shape."""
    mask = mask if mask.dtype == jnp.bool_ else mask != 0
    if mask.ndim != 2 or scores.ndim != 4:
        mask_type = 2  # types 0 and 1 only describe 2-d masks of 4-d scores, as in ATen
    if mask_type == 2:
        if mask.shape != scores.shape:
            raise RuntimeError(
                f"{op}: for mask_type == 2 the mask's shape {tuple(mask.shape)} "
                f"must match the input's shape {tuple(scores.shape)}."
            )
        return mask
    batch, _, length, keys = scores.shape
    if mask_type == 1:
        if mask.shape != (batch, keys):
            raise RuntimeError(
                f"{op}: for mask_type == 1 (key padding) the mask must have shape "
                f"(B, L) = {(batch, keys)}, got {tuple(mask.shape)}."
            )
        return jnp.broadcast_to(mask[:, None, None, :], scores.shape)
    if mask_type == 0:
        if mask.shape != (length, keys):
            raise RuntimeError(
                f"{op}: for mask_type == 0 (attention mask) the mask must have "
                f"shape (L, L) = {(length, keys)}, got {tuple(mask.shape)}."
            )
        return jnp.broadcast_to(mask, scores.shape)
    raise RuntimeError(
        f"{op}: unknown mask_type {mask_type}; use 0 (an (L, L) attention mask), "
        "1 (a (B, L) key padding mask) or 2 (a mask of the input's shape)."
    )


def _softmax_masked(scores, mask, dim, mask_type, op):
    if mask is not None:
        scores = jnp.where(_mask_for(scores, mask, dim, mask_type, op), -jnp.inf, scores)
    return jax.nn.softmax(scores, axis=dim)


# Shared by _masked_softmax and the fused MHA kernel (whose products stay in the input dtype):
# the softmax alone computes half precision in float32, declared on _masked_softmax's schema.
_softmax_masked = declared(aten._masked_softmax.default, _softmax_masked, None, ("self",), True)


@lowering(aten._masked_softmax.default)
def _masked_softmax(self, mask, dim=None, mask_type=None):
    if mask.dtype != jnp.bool_:
        raise RuntimeError(
            "aten._masked_softmax: the mask must be a boolean tensor "
            f"(got {mask.dtype}); pass mask.bool()."
        )
    dim = self.ndim - 1 if dim is None else dim % max(self.ndim, 1)
    if mask_type is None:
        mask_type = 2
    return _softmax_masked(self, mask, dim, mask_type, "aten._masked_softmax")


def _linear(x, weight, bias):
    out = matmul(x, weight.T)
    return out if bias is None else out + bias.astype(out.dtype)


def _multi_head_attention(
    query,
    key,
    value,
    embed_dim,
    num_head,
    qkv_weight,
    qkv_bias,
    proj_weight,
    proj_bias,
    mask,
    need_weights,
    average_attn_weights,
    mask_type,
):
    op = "aten._native_multi_head_attention"
    if query.ndim != 3 or key.ndim != 3 or value.ndim != 3:
        raise RuntimeError(
            f"{op}: expected query, key and value to be 3-d (batch, sequence, "
            f"embed_dim), got {query.ndim}-d, {key.ndim}-d and {value.ndim}-d."
        )
    if embed_dim % num_head != 0:
        raise RuntimeError(
            f"{op}: embed_dim ({embed_dim}) must be divisible by num_head ({num_head})."
        )
    head_dim = embed_dim // num_head
    batch, length = query.shape[:2]
    if query.size == 0:
        return jnp.empty_like(query), None

    def heads(x, w, b):  # (B, T, D) -> (B, heads, T, head_dim), bias added
        x = _linear(x, w, b)
        return jnp.swapaxes(x.reshape(x.shape[0], x.shape[1], num_head, head_dim), 1, 2)

    w_q, w_k, w_v = jnp.split(qkv_weight, 3, axis=0)
    b_q, b_k, b_v = jnp.split(qkv_bias, 3, axis=0)
    q = heads(query, w_q, b_q) * jnp.asarray(1.0 / math.sqrt(head_dim), query.dtype)
    k = heads(key, w_k, b_k)
    v = heads(value, w_v, b_v)
    scores = matmul(q, jnp.swapaxes(k, -1, -2))
    weights = _softmax_masked(scores, mask, 3, mask_type, op)
    context = matmul(weights, v)  # (B, heads, T, head_dim)
    context = jnp.swapaxes(context, 1, 2).reshape(batch, length, embed_dim)
    out = _linear(context, proj_weight, proj_bias)
    if not need_weights:
        return out, None  # PyTorch returns an undefined tensor (None in Python)
    if average_attn_weights:
        weights = jnp.sum(weights, axis=1) / jnp.asarray(num_head, weights.dtype)
    return out, weights


@lowering(aten._native_multi_head_attention.default)
def _native_multi_head_attention(
    query,
    key,
    value,
    embed_dim,
    num_head,
    qkv_weight,
    qkv_bias,
    proj_weight,
    proj_bias,
    mask=None,
    need_weights=True,
    average_attn_weights=True,
    mask_type=None,
):
    return _multi_head_attention(
        query,
        key,
        value,
        embed_dim,
        num_head,
        qkv_weight,
        qkv_bias,
        proj_weight,
        proj_bias,
        mask,
        need_weights,
        average_attn_weights,
        mask_type,
    )


@lowering(aten._transformer_encoder_layer_fwd.default)
def _transformer_encoder_layer_fwd(
    src,
    embed_dim,
    num_heads,
    qkv_weight,
    qkv_bias,
    proj_weight,
    proj_bias,
    use_gelu,
    norm_first,
    eps,
    norm_weight_1,
    norm_bias_1,
    norm_weight_2,
    norm_bias_2,
    ffn_weight_1,
    ffn_bias_1,
    ffn_weight_2,
    ffn_bias_2,
    mask=None,
    mask_type=None,
):
    # ATen's transformer_encoder_layer_forward: self-attention and a two-layer feed-forward
    # block, each with a residual connection and a layer norm before (norm_first) or after.
    def norm(x, weight, bias):
        return native_layer_norm(x, (embed_dim,), weight, bias, eps)[0]

    if src.size == 0:
        return jnp.empty_like(src)
    x = norm(src, norm_weight_1, norm_bias_1) if norm_first else src
    x = _multi_head_attention(
        x,
        x,
        x,
        embed_dim,
        num_heads,
        qkv_weight,
        qkv_bias,
        proj_weight,
        proj_bias,
        mask,
        False,
        True,
        mask_type,
    )[0]
    x = x + src
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    residual = x
    if norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    hidden = _linear(x, ffn_weight_1, ffn_bias_1)
    hidden = _gelu(hidden) if use_gelu else jnp.maximum(hidden, 0)
    x = _linear(hidden, ffn_weight_2, ffn_bias_2) + residual
    if not norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    return x


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
    # fuses and autograd differentiates. (PyTorch's C++ asks a device's kernel choice through a
    # C++ stub, never this op: the jax device's fused path is the decomposition below.)
    return 0


def _dot(a, b):
    """``a @ b`` at the product precision: half operands stay half, accumulated in float32 (a
    float32 result, as PyTorch's flash kernels' products)."""
    acc = accumulator(a.dtype)
    return jnp.matmul(a, b, precision=product_precision(a.dtype), preferred_element_type=acc)


def _attention_scores(query, key, value, attn_mask, is_causal, scale, repeat_kv, scale_first=True):
    """(q k^T * scale + mask, v): masked-out positions are -inf; the scores in float32 for half
    q and k (their product's accumulator, as PyTorch's CPU flash kernel), else in their dtype.
    The math path scales q before the product (``scale_first``, not for half: the scale would
    round in half), the flash kernel after it.
    """
    q, k, v = query, key, value
    if repeat_kv and k.shape[-3] != q.shape[-3]:  # grouped-query attention
        repeats = q.shape[-3] // k.shape[-3]
        k, v = jnp.repeat(k, repeats, axis=-3), jnp.repeat(v, repeats, axis=-3)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale  # a weak Python float
    if scale_first and accumulator(q.dtype) is None:
        scores = _dot(q * scale, jnp.swapaxes(k, -1, -2))
    else:
        scores = _dot(q, jnp.swapaxes(k, -1, -2)) * scale
    length, source = q.shape[-2], k.shape[-2]
    if is_causal:
        attn_mask = jnp.tril(jnp.ones((length, source), jnp.bool_))
    if attn_mask is not None:
        if attn_mask.dtype == jnp.bool_:
            scores = jnp.where(attn_mask, scores, -jnp.inf)
        else:
            scores = scores + attn_mask.astype(scores.dtype)
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
    prng_key = current_env().next_prng_key(None) if dropout_p > 0.0 else None
    args = (attn_mask, prng_key, dropout_p, is_causal, scale, enable_gqa)
    return recomputed(_math_attention, query, key, value, *args)


def _math_attention(query, key, value, attn_mask, prng_key, dropout_p, is_causal, scale, gqa):
    scores, v = _attention_scores(query, key, value, attn_mask, is_causal, scale, gqa)
    weights = safe_softmax(scores, -1)
    if dropout_p > 0.0:
        keep = jax.random.bernoulli(prng_key, 1.0 - dropout_p, weights.shape)
        weights = jnp.where(keep, weights / (1.0 - dropout_p), 0)
    return _dot(weights.astype(v.dtype), v).astype(query.dtype)


@lowering(aten._scaled_dot_product_flash_attention_for_cpu.default)
def _scaled_dot_product_flash_attention_for_cpu(
    query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None
):
    if dropout_p != 0.0:
        raise RuntimeError(
            "_scaled_dot_product_flash_attention_for_cpu: dropout_p must be 0 "
            f"(got {dropout_p}); use scaled_dot_product_attention for dropout."
        )
    return recomputed(
        _flash_attention, query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale
    )


def _flash_attention(query, key, value, dropout_p, is_causal, *, attn_mask, scale):
    """(output, logsumexp of each row's scores), normalising by the row sum last as the kernel
    does; a row masked out entirely gives 0 for both."""
    scores, v = _attention_scores(
        query, key, value, attn_mask, is_causal, scale, True, scale_first=False
    )
    top = jnp.max(scores, axis=-1, keepdims=True)
    masked = top == -jnp.inf
    weights = jnp.exp(scores - jnp.where(masked, 0, top))
    total = jnp.sum(weights, axis=-1, keepdims=True)
    out = _dot(weights.astype(v.dtype), v) / jnp.where(masked, 1, total)
    logsumexp = jnp.where(masked, 0, top + jnp.log(total))[..., 0]
    # Half inputs: the logsumexp stays float32 (the kernel's accumulation dtype), the output
    # rounds back.
    return out.astype(query.dtype), logsumexp


# -- the overrideable fused op: the `jax` device's scaled_dot_product_attention -------------------
# PyTorch's composite scaled_dot_product_attention picks a kernel through a C++ stub that an
# out-of-tree device cannot fill from Python, so it would always take the math path: its matmul,
# softmax and dropout ops, which materialise the scores plus mask before the row maximum. The
# decomposition below (run by the core at the device's autograd key, so autograd records the
# op) calls PyTorch's overrideable fused op instead, whose forward and backward are one lowering
# each; calls it does not describe keep PyTorch's composite, with its validation and errors.


def _fusable(query, key, value, attn_mask, is_causal, enable_gqa) -> bool:
    if not torch._C._get_overrideable_sdp_enabled():  # `sdpa_kernel` without OVERRIDEABLE
        return False
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return False
    if not (query.dtype == key.dtype == value.dtype and query.is_floating_point()):
        return False
    (batch, heads, length, dim), (_, kv_heads, source, _) = query.shape, key.shape
    if key.shape[0] != batch or value.shape[0] != batch or key.shape[-1] != dim:
        return False
    if value.shape[1] != kv_heads or value.shape[2] != source:
        return False
    if kv_heads != heads and not (enable_gqa and kv_heads > 0 and heads % kv_heads == 0):
        return False
    if attn_mask is None:
        return True
    if is_causal or attn_mask.dtype not in (torch.bool, query.dtype):
        return False
    try:
        torch.broadcast_shapes(attn_mask.shape, (batch, heads, length, source))
    except RuntimeError:
        return False
    return attn_mask.dim() <= 4


@decomposition(aten.scaled_dot_product_attention.default)
def _scaled_dot_product_attention_fused(
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
    if not _fusable(query, key, value, attn_mask, is_causal, enable_gqa):
        return aten.scaled_dot_product_attention.default.decompose(
            query,
            key,
            value,
            attn_mask,
            dropout_p,
            is_causal,
            scale=scale,
            enable_gqa=enable_gqa,
        )
    # A boolean mask goes in as it is (PyTorch's kernels take it as a 0/-inf bias: the
    # lowering selects instead of adding, the same scores).
    return aten._scaled_dot_product_fused_attention_overrideable(
        query, key, value, attn_mask, dropout_p, is_causal, False, scale=scale
    )[0]


def _pack_key(prng_key):
    """A PRNG key as the int64 scalar PyTorch saves as ``philox_seed`` for the backward."""
    return jax.lax.bitcast_convert_type(jax.random.key_data(prng_key), jnp.int64)


def _unpack_key(seed):
    return jax.random.wrap_key_data(jax.lax.bitcast_convert_type(seed, jnp.uint32))


def _dropout_keep(seed, dropout_p, shape):
    return jax.random.bernoulli(_unpack_key(seed), 1.0 - dropout_p, shape)


def _fused_scores(query, key, value, attn_bias, is_causal, scale):
    """Scores with bias and causal mask (masked-out: -inf), and k, v repeated for grouped-query
    attention; the scale multiplies the product, as the flash kernels do."""
    return _attention_scores(query, key, value, attn_bias, is_causal, scale, True, False)


@lowering(aten._scaled_dot_product_fused_attention_overrideable.default)
def _scaled_dot_product_fused_attention_overrideable(
    query,
    key,
    value,
    attn_bias=None,
    dropout_p=0.0,
    is_causal=False,
    return_debug_mask=False,
    *,
    scale=None,
):
    op = "aten._scaled_dot_product_fused_attention_overrideable"
    if return_debug_mask:
        raise RuntimeError(
            f"{op}: return_debug_mask=True is not supported on the jax device; call "
            "scaled_dot_product_attention, which passes False."
        )
    if query.ndim != 4:
        raise RuntimeError(
            f"{op}: expected 4-d query, key and value (batch, heads, length, head_dim), got a "
            f"{query.ndim}-d query; call scaled_dot_product_attention, which takes any shape."
        )
    length, source = query.shape[-2], key.shape[-2]
    offset = seed = jnp.zeros((), jnp.int64)
    plan = kernels.plan_for(query, key, value, attn_bias, dropout_p)  # a TPU's kernel (see there)
    if dropout_p > 0.0:
        seed = _pack_key(current_env().next_prng_key(None))

    def given(query, key, value, attn_bias) -> tuple:
        if plan.kernel:
            return kernels.forward(query, key, value, attn_bias, is_causal, scale)
        # Differentiated by JAX, the (L, S) float32 scores and weights are recomputed from q,
        # k, v in the backward pass instead of kept (_recompute), as the kernels keep none.
        return recomputed(
            _fused_forward, query, key, value, attn_bias, seed, dropout_p, is_causal, scale
        )

    def causal(query, key, value, attn_bias) -> tuple:
        return kernels.forward(query, key, value, None, True, scale)

    operands = (query, key, value, attn_bias)
    if plan.causal_check:
        is_causal_mask = kernels.causal_mask(attn_bias, length, source)
        out, logsumexp = jax.lax.cond(is_causal_mask, causal, given, *operands)
    else:
        out, logsumexp = given(*operands)
    return out, logsumexp, None, None, length, source, seed, offset, None


def _fused_forward(query, key, value, attn_bias, seed, dropout_p, is_causal, scale):
    """(output, logsumexp) of the fused op's plain lowering."""
    scores, v = _fused_scores(query, key, value, attn_bias, is_causal, scale)
    # Stable softmax normalised last (on the (L, Dv) output, not the (L, S) weights); a row
    # masked out entirely gives zeros, as PyTorch's _safe_softmax.
    top = jnp.max(scores, axis=-1, keepdims=True)
    masked = top == -jnp.inf
    weights = jnp.exp(scores - jnp.where(masked, 0, top))
    total = jnp.sum(weights, axis=-1, keepdims=True)
    if dropout_p > 0.0:
        keep = _dropout_keep(seed, dropout_p, weights.shape)
        weights = jnp.where(keep, weights / (1.0 - dropout_p), 0)
    out = _dot(weights.astype(v.dtype), v) / jnp.where(masked, 1, total)
    logsumexp = jnp.where(masked, 0, top + jnp.log(total))[..., 0]
    # (half inputs: the logsumexp stays float32, the kernel's accumulation dtype)
    return out.astype(query.dtype), logsumexp


def _ungroup(grad, heads):
    """A gradient with respect to repeated key/value heads, summed back over each group."""
    if grad.shape[-3] == heads:
        return grad
    *batch, _, length, dim = grad.shape
    return jnp.sum(grad.reshape(*batch, heads, -1, length, dim), axis=-3)


@lowering(aten._scaled_dot_product_fused_attention_overrideable_backward.default)
def _scaled_dot_product_fused_attention_overrideable_backward(
    grad_out,
    query,
    key,
    value,
    attn_bias,
    grad_input_mask,
    out,
    logsumexp,
    cum_seq_q,
    cum_seq_k,
    max_q,
    max_k,
    dropout_p,
    is_causal,
    philox_seed,
    philox_offset,
    *,
    scale=None,
):
    # The kernel's backward where its forward ran (and the same causal check), else the plain
    # lowering's.
    grad_out = grad_out.astype(query.dtype)
    plan = kernels.plan_for(query, key, value, attn_bias, dropout_p)  # as its forward's
    saved = (grad_out, query, key, value, attn_bias, out, logsumexp)

    def given(grad_out, query, key, value, attn_bias, out, logsumexp):
        if not plan.kernel:
            return _plain_backward(
                grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp,
                dropout_p, is_causal, philox_seed, scale,
            )  # fmt: skip
        grads = kernels.backward(
            grad_out, query, key, value, attn_bias, out, logsumexp, is_causal, scale
        )
        grad_bias = None
        if attn_bias is not None and grad_input_mask[3] and grads[3] is not None:
            grad_bias = kernels.sum_to(grads[3], attn_bias.shape).astype(attn_bias.dtype)
        return (*grads[:3], grad_bias)

    def causal(grad_out, query, key, value, attn_bias, out, logsumexp):
        grads = kernels.backward(grad_out, query, key, value, None, out, logsumexp, True, scale)
        return (*grads[:3], None)

    if plan.causal_check:
        is_causal_mask = kernels.causal_mask(attn_bias, query.shape[-2], key.shape[-2])
        return jax.lax.cond(is_causal_mask, causal, given, *saved)
    return given(*saved)


def _plain_backward(
    grad_out,
    query,
    key,
    value,
    attn_bias,
    grad_input_mask,
    out,
    logsumexp,
    dropout_p,
    is_causal,
    philox_seed,
    scale,
):
    """The fused op's gradients by the plain lowering: flash attention's backward, the weights
    recomputed from the saved logsumexp (one pass over the scores, no softmax re-run), then
    dS = P * (dP - rowsum(dO * O)). Half operands enter the products as they are (P and dS
    rounded to them first, as PyTorch's CPU flash kernel does), accumulating in float32; the
    elementwise parts compute in float32."""
    # The scores are recomputed here, not kept: fenced, or XLA merges them with the forward's
    # and keeps a float32 (L, S) array per layer alive until the backward.
    grad_out, query, key, value, attn_bias, logsumexp = fenced(
        grad_out, query, key, value, attn_bias, logsumexp
    )
    scores, v = _fused_scores(query, key, value, attn_bias, is_causal, scale)
    weights = jnp.exp(scores - logsumexp[..., None].astype(scores.dtype))
    kept = weights
    grad_kept = _dot(grad_out, jnp.swapaxes(v, -1, -2))
    if dropout_p > 0.0:
        keep = _dropout_keep(philox_seed, dropout_p, weights.shape)
        kept = jnp.where(keep, weights / (1.0 - dropout_p), 0)
        grad_kept = jnp.where(keep, grad_kept / (1.0 - dropout_p), 0)
    acc = scores.dtype
    row = jnp.sum(grad_out.astype(acc) * out.astype(acc), axis=-1, keepdims=True)
    grad_scores = weights * (grad_kept - row)
    k = jnp.repeat(key, query.shape[-3] // key.shape[-3], axis=-3)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    dtype = query.dtype
    grad_query = (_dot(grad_scores.astype(dtype), k) * scale).astype(dtype)
    grad_key = _dot(jnp.swapaxes(grad_scores, -1, -2).astype(dtype), query) * scale
    grad_value = _dot(jnp.swapaxes(kept, -1, -2).astype(dtype), grad_out)
    grad_bias = None
    if attn_bias is not None and grad_input_mask[3]:
        grad_bias = kernels.sum_to(grad_scores, attn_bias.shape).astype(attn_bias.dtype)
    grad_key = _ungroup(grad_key, key.shape[-3]).astype(key.dtype)
    return (
        grad_query,
        grad_key,
        _ungroup(grad_value, value.shape[-3]).astype(value.dtype),
        grad_bias,
    )
