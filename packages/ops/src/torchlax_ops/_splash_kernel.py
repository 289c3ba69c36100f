"""Attention without a bias on JAX's Pallas TPU splash-attention kernel: forward and backward.

``_attention_kernels`` decides which calls take a kernel; those with no mask (``is_causal`` or
none, and the causal check's causal branch) come here. The splash kernel skips the blocks a
causal mask hides wholesale and computes the backward's dq, dk and dv in one fused kernel:
at GPT-2 small's and a Llama-style model's attention shapes its forward and backward take 0.7×
the flash kernel's time on a v5e (``benchmarks/tpu_attention.py --jax-kernels``).

The kernel does not scale the scores: q is scaled first, in its dtype (exact where the scale
is a power of two, head_dim 64 or 256; else one rounding of q, as PyTorch's math path rounds
its scaled q and k), and dq scaled back. Its logsumexp, as the flash kernel's and PyTorch's,
is that of the scaled scores. Grouped-query attention is the kernel's own (k and v keep their
heads). The forward is the public kernel with its residuals; the backward is JAX's private
``_splash_attention_bwd`` over the output and logsumexp PyTorch's autograd saved between its
two ops (the public kernel would compute its forward again in the backward).
"""

from __future__ import annotations

import functools

import jax
from torchlax_core.internal import no_x64

from ._promotion import up


def _splash():
    from jax.experimental.pallas.ops.tpu import splash_attention  # (imports Pallas: on use)

    return splash_attention


@functools.lru_cache(maxsize=64)
def _kernel(heads: int, length: int, source: int, causal: bool, block_q: int, block_kv: int):
    """The splash kernel of one shape and mask (its mask's block tables are made on the host,
    once), returning its logsumexp too."""
    splash = _splash()
    one = splash.CausalMask((length, source)) if causal else splash.FullMask((length, source))
    blocks = splash.BlockSizes(
        block_q=block_q,
        block_kv=block_kv,
        block_kv_compute=block_kv,
        block_q_dkv=block_q,
        block_kv_dkv=block_kv,
        block_kv_dkv_compute=block_kv,
        use_fused_bwd_kernel=True,
    )
    # Concrete tables, also when first made inside a trace (the cache outlives it); int32.
    with jax.ensure_compile_time_eval(), no_x64():
        return splash.make_splash_mha(
            splash.MultiHeadMask([one] * heads),
            block_sizes=blocks,
            save_residuals=True,
            head_shards=1,
            q_seq_shards=1,
        )


def _collapsed(blocks):
    # (the kernel's call does this to its tables: one leading dimension of blocks)
    return blocks.reshape(-1, *blocks.shape[-2:])


def _scaled(query, scale):
    return (query * scale).astype(query.dtype)


def forward(query, key, value, is_causal: bool, scale: float, blocks: tuple[int, int]):
    """(output, logsumexp) of attention over (batch, heads, length, head_dim) operands."""
    kernel = _kernel(query.shape[1], query.shape[2], key.shape[2], is_causal, *blocks)
    with no_x64():  # (the kernel's index maps mix int32 with Python ints)
        out, (logsumexp,) = jax.vmap(kernel)(_scaled(query, scale), key, value)
    return out, logsumexp


def backward(grad_out, query, key, value, out, logsumexp, is_causal, scale, blocks):
    """(grad_query, grad_key, grad_value) from the forward's output and logsumexp."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as impl

    kernel = _kernel(query.shape[1], query.shape[2], key.shape[2], is_causal, *blocks)
    options = kernel.kwargs
    dq_info, dkv_info = (
        info._replace(partial_mask_blocks=_collapsed(info.partial_mask_blocks))
        if info is not None and info.partial_mask_blocks is not None
        else info
        for info in (kernel.dq_mask_info, kernel.dkv_mask_info)
    )

    def one(q, k, v, o, lse, do):
        residuals = (q, k, v, None, None, o, lse, dq_info, dkv_info)
        grads = impl._splash_attention_bwd(  # pyright: ignore[reportPrivateUsage]
            False,
            options["mask_value"],
            False,
            options["block_sizes"],
            None,
            options["mask_function"],
            None,
            False,
            residuals,
            do,
        )
        return grads[3:6]

    with no_x64():
        grad_q, grad_k, grad_v = jax.vmap(one)(
            _scaled(query, scale), key, value, out, logsumexp, grad_out.astype(query.dtype)
        )
    grad_q = (up(grad_q) * scale).astype(query.dtype)  # (one rounding, as the forward's q)
    return grad_q, grad_k.astype(key.dtype), grad_v.astype(value.dtype)
