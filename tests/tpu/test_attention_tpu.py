"""F.scaled_dot_product_attention on a TPU runs JAX's Pallas attention kernels (forward and
backward: splash without a mask, flash with the mask as its bias), and computes what PyTorch
computes; calls the kernels cannot take run the plain lowering. Skipped where JAX sees no TPU (the CPU tests of the rule: tests/ops/test_attention_kernel.py).
"""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import pytest
import torch
import torch.nn.functional as F
import torchlax
import torchlax_core
from torchlax_ops import _attention_kernels as kernels


def _tpu_visible() -> bool:
    try:
        return any(d.platform == "tpu" for d in jax.devices())
    except RuntimeError:
        return False


pytestmark = [
    pytest.mark.tpu,
    pytest.mark.skipif(not _tpu_visible(), reason="needs a TPU visible to JAX"),
]


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(kernels, "_logged", {})
    # the cases are small, where TORCHLAX_ATTENTION_KERNEL=auto declines the kernel
    monkeypatch.setattr(kernels, "choice", "always")
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


def _attention(dtype, q, k, v, **kwargs):
    """Output and q, k, v gradients on the jax device (in ``dtype``) and on the CPU (float64
    from the same ``dtype`` values: the reference), as float64. No op cache: an executable
    another case compiled (the same shapes, the other kernel) must not answer."""
    cotangent = torch.randn(q.shape[:-1] + v.shape[-1:], generator=torch.Generator().manual_seed(1))
    env = torchlax_core.Environment()
    env.config.op_cache_size = 0
    results = []
    for device in ("jax", "cpu"):
        wanted = dtype if device == "jax" else torch.float64
        with torchlax_core.enable(env):
            xs = [x.to(dtype).to(wanted).to(device).requires_grad_() for x in (q, k, v)]
            mask = kwargs.get("attn_mask")
            extra = dict(kwargs)
            if mask is not None:
                extra["attn_mask"] = (
                    mask.to(device) if mask.dtype == torch.bool else mask.to(wanted).to(device)
                )
            out = F.scaled_dot_product_attention(*xs, **extra)
            grads = torch.autograd.grad(out, xs, cotangent.to(wanted).to(device))
        results.append([t.cpu().double() for t in (out, *grads)])
    return results


def _kernel_chosen(caplog, kernel: str = "") -> bool:
    """Whether the log says a call runs a Pallas kernel (``kernel``: "splash", "flash", any)."""
    return any(f"{kernel}-attention kernel" in r.getMessage() for r in caplog.records)


CASES = {
    "causal": (2, 4, 4, 256, 64, {"is_causal": True}),
    "gqa": (2, 8, 2, 256, 64, {"is_causal": True, "enable_gqa": True}),
    "bool_mask": (1, 4, 4, 256, 128, {"attn_mask": torch.rand(256, 256) > 0.2}),
    # transformers' traced causal mask: the kernel with causal=True, chosen in the program
    "causal_bool_mask": (
        2,
        4,
        4,
        256,
        64,
        {"attn_mask": torch.ones(256, 256, dtype=torch.bool).tril().expand(2, 1, 256, 256)},
    ),
    "plain": (2, 4, 4, 128, 64, {}),
    # the flash kernel where the splash kernel would run (TORCHLAX_ATTENTION_SPLASH=0)
    "causal_flash": (2, 4, 4, 256, 64, {"is_causal": True}),
    "gqa_flash": (2, 8, 2, 256, 64, {"is_causal": True, "enable_gqa": True}),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_kernel_matches_pytorch(case, dtype, caplog, monkeypatch):
    batch, heads, kv_heads, length, dim, kwargs = CASES[case]
    monkeypatch.setattr(kernels, "splash", not case.endswith("_flash"))
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(batch, heads, length, dim, generator=gen)
    k = torch.randn(batch, kv_heads, length, dim, generator=gen)
    v = torch.randn(batch, kv_heads, length, dim, generator=gen)
    if dtype == torch.float32:
        torch.set_float32_matmul_precision("medium")  # (float32 takes the kernel only then)
    with caplog.at_level(logging.INFO, logger="torchlax.attention"):
        got, want = _attention(dtype, q, k, v, **kwargs)
    kernel = "flash" if case == "bool_mask" or case.endswith("_flash") else "splash"
    assert _kernel_chosen(caplog, kernel), [r.getMessage() for r in caplog.records]
    tol = 3e-2  # single bfloat16 passes, for bfloat16 and (under "medium") float32 alike
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=tol, rtol=tol)


def test_float32_under_highest_and_dropout_run_the_plain_lowering(caplog):
    q = torch.randn(2, 4, 256, 64)
    torch.set_float32_matmul_precision("highest")
    with caplog.at_level(logging.INFO, logger="torchlax.attention"):
        with torchlax_core.enable():
            x = q.to("jax")
            out = F.scaled_dot_product_attention(x, x, x, is_causal=True)
            torch.testing.assert_close(
                out.cpu(),
                F.scaled_dot_product_attention(q, q, q, is_causal=True),
                atol=1e-4,
                rtol=1e-4,
            )
            y = x.to(torch.bfloat16)
            dropped = F.scaled_dot_product_attention(y, y, y, dropout_p=0.5)
            assert dropped.dtype == torch.bfloat16
    messages = [r.getMessage() for r in caplog.records]
    assert any("plain lowering" in m and "highest" in m for m in messages), messages
    assert any("plain lowering" in m and "dropout" in m for m in messages), messages
    assert not _kernel_chosen(caplog)


def test_auto_declines_the_kernel_for_small_scores_and_masks(caplog, monkeypatch):
    monkeypatch.setattr(kernels, "choice", "auto")
    q = torch.randn(2, 4, 256, 64, dtype=torch.bfloat16)
    with caplog.at_level(logging.INFO, logger="torchlax.attention"):
        with torchlax_core.enable():
            x = q.to("jax")
            out = F.scaled_dot_product_attention(x, x, x, is_causal=True)
    torch.testing.assert_close(
        out.cpu().double(),
        F.scaled_dot_product_attention(*(q.double(),) * 3, is_causal=True),
        atol=3e-2,
        rtol=3e-2,
    )
    assert not _kernel_chosen(caplog)
    assert any("MiB" in r.getMessage() for r in caplog.records)


def test_the_program_calls_the_pallas_kernel():
    q = jnp.ones((2, 4, 256, 64), jnp.bfloat16)

    def attention(q, k, v):
        return torchlax.call_torch(
            lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True), q, k, v
        )

    text = jax.jit(attention).lower(q, q, q).as_text()
    assert "tpu_custom_call" in text
