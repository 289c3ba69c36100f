"""Which attention runs: JAX's Pallas TPU flash-attention kernel or the plain lowering.

The rule (``torchlax_ops._attention_kernels.kernel_refusal``) is tested on the CPU with the
platform given: what the kernel can compute, then whether it pays (``TORCHLAX_ATTENTION_KERNEL``:
``auto``, ``always``, ``never``); the log line says the choice. The kernel's values, forward and backward through
PyTorch's autograd, are compared with the plain lowering's on the CPU in Pallas's TPU interpret
mode (slow: tens of seconds a call), with the platform made to read "tpu".
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchlax_core
from torchlax_ops import _attention_kernels as kernels


def spec(*shape, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dtype)


Q = spec(2, 8, 256, 64)
KV = spec(2, 8, 256, 64)


@pytest.mark.parametrize(
    ("query", "key", "mask", "dropout", "on", "refusal"),
    [
        (Q, KV, None, 0.0, "tpu", None),
        (
            spec(2, 8, 256, 64, dtype=jnp.float32),
            spec(2, 8, 256, 64, dtype=jnp.float32),
            None,
            0.0,
            "tpu",
            None,
        ),
        (Q, spec(2, 2, 256, 64), None, 0.0, "tpu", None),  # grouped-query attention
        (Q, KV, spec(256, 256, dtype=jnp.bool_), 0.0, "tpu", None),  # a mask
        (spec(2, 8, 256, 128), spec(2, 8, 384, 128), None, 0.0, "tpu", None),
        (spec(2, 8, 256, 256), spec(2, 8, 256, 256), None, 0.0, "tpu", None),
        (spec(2, 8, 256, 192), spec(2, 8, 256, 192), None, 0.0, "tpu", "head_dim 192"),
        (Q, KV, None, 0.0, "cpu", "not a TPU"),
        (Q, KV, None, 0.0, "gpu", "not a TPU"),
        (Q, KV, None, 0.1, "tpu", "dropout"),
        (spec(2, 8, 200, 64), spec(2, 8, 200, 64), None, 0.0, "tpu", "multiples of 128"),
        (
            spec(2, 8, 256, 64, dtype=jnp.float16),
            spec(2, 8, 256, 64, dtype=jnp.float16),
            None,
            0.0,
            "tpu",
            "float16",
        ),
        (Q, spec(2, 3, 256, 64), None, 0.0, "tpu", "multiple of the key/value heads"),
        (spec(8, 256, 64), spec(8, 256, 64), None, 0.0, "tpu", "not 4-d"),
    ],
)
def test_the_rule(query, key, mask, dropout, on, refusal):
    why = kernels.kernel_refusal(query, key, key, mask, dropout, on, "medium")
    if refusal is None:
        assert why is None
    else:
        assert why is not None and refusal in why


@pytest.mark.parametrize(
    ("mode", "kernel"), [("highest", False), ("high", False), ("medium", True)]
)
def test_float32_takes_the_kernel_only_under_medium_precision(mode, kernel):
    # The kernel's products are single bfloat16 passes (on a v5e, "high" measured a 1.3e-2 error
    # where bf16_3x gives ~1e-5): only "medium" allows that for float32.
    q = spec(2, 8, 256, 64, dtype=jnp.float32)
    why = kernels.kernel_refusal(q, q, q, None, 0.0, "tpu", mode)
    assert (why is None) == kernel
    assert kernel or f'"{mode}"' in why
    assert kernels.kernel_refusal(Q, KV, KV, None, 0.0, "tpu", mode) is None  # bfloat16


def test_a_value_head_dim_unlike_the_query_s_is_refused():
    value = spec(2, 8, 256, 32)
    why = kernels.kernel_refusal(Q, KV, value, None, 0.0, "tpu")
    assert why is not None and "head_dim" in why


BIG = spec(8, 16, 2048, 128)  # float32 scores of 2 GiB


@pytest.mark.parametrize(
    ("query", "mask", "chosen", "refusal"),
    [
        (BIG, None, "auto", None),
        (Q, None, "auto", "scores are 4 MiB"),
        (BIG, spec(2048, 1024, dtype=jnp.bool_), "auto", "a mask"),  # not square: never causal
        (BIG, spec(8, 1, 2048, 2048), "auto", "a mask"),  # a float mask
        (Q, None, "always", None),
        (Q, spec(256, 256, dtype=jnp.bool_), "always", None),
        (BIG, None, "never", "TORCHLAX_ATTENTION_KERNEL=never"),
    ],
)
def test_whether_the_kernel_pays(query, mask, chosen, refusal):
    why = kernels.kernel_refusal(query, query, query, mask, 0.0, "tpu", "highest", chosen)
    if refusal is None:
        assert why is None
    else:
        assert why is not None and refusal in why
    # what the kernel cannot compute stays refused whatever the choice
    assert (
        "dropout"
        in kernels.kernel_refusal(query, query, query, mask, 0.5, "tpu", "highest", chosen)
        or chosen == "never"
    )


@pytest.mark.parametrize("value", ["auto", "always", "never", " Always ", ""])
def test_the_choice_is_read_from_the_environment(value, monkeypatch):
    monkeypatch.setenv("TORCHLAX_ATTENTION_KERNEL", value)
    assert kernels._choice_from_environment() == (value.strip().lower() or "auto")


def test_a_bad_choice_names_the_variable_and_the_values(monkeypatch):
    monkeypatch.setenv("TORCHLAX_ATTENTION_KERNEL", "sometimes")
    with pytest.raises(ValueError, match="TORCHLAX_ATTENTION_KERNEL='sometimes'.*'auto'"):
        kernels._choice_from_environment()


def test_a_bad_choice_fails_the_attention_call_not_the_import(monkeypatch):
    monkeypatch.setenv("TORCHLAX_ATTENTION_KERNEL", "sometimes")
    monkeypatch.setattr(kernels, "choice", None)  # not read yet
    with pytest.raises(ValueError, match="TORCHLAX_ATTENTION_KERNEL='sometimes'"):
        kernels.plan_for(Q, KV, KV, None, 0.0)
    env = {**os.environ, "TORCHLAX_ATTENTION_KERNEL": "sometimes", "JAX_PLATFORMS": "cpu"}
    imported = subprocess.run(
        [sys.executable, "-c", "import torchlax_ops._attention_kernels"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert imported.returncode == 0, imported.stderr


def test_auto_takes_the_plain_lowering_for_small_scores_and_says_why(caplog, monkeypatch):
    monkeypatch.setattr(kernels, "_logged", {})
    monkeypatch.setattr(kernels, "choice", "auto")
    monkeypatch.setattr(kernels, "platform", lambda: "tpu")
    small = spec(2, 12, 512, 64)
    gpt2 = spec(8, 12, 1024, 64)
    with caplog.at_level(logging.INFO, logger="torchlax.attention"):
        assert not kernels.plan_for(small, small, small, None, 0.0).kernel
        assert kernels.plan_for(gpt2, gpt2, gpt2, None, 0.0).kernel  # 384 MiB of scores
    messages = [r.getMessage() for r in caplog.records if r.name == "torchlax.attention"]
    assert "plain lowering" in messages[0] and "24 MiB" in messages[0]
    assert messages[1].endswith("the Pallas TPU splash-attention kernel")
    assert kernels.seen() == sorted(m.split(": ", 1)[1] for m in messages)


def test_the_choice_is_logged_once(caplog, monkeypatch):
    monkeypatch.setattr(kernels, "_logged", {})
    monkeypatch.setattr(kernels, "choice", "always")
    with caplog.at_level(logging.INFO, logger="torchlax.attention"):
        monkeypatch.setattr(kernels, "platform", lambda: "tpu")
        assert kernels.plan_for(Q, KV, KV, None, 0.0).kernel
        assert kernels.plan_for(Q, KV, KV, None, 0.0).kernel
        assert not kernels.plan_for(Q, KV, KV, None, 0.5).kernel
    messages = [r.getMessage() for r in caplog.records if r.name == "torchlax.attention"]
    assert len(messages) == 2, messages
    assert messages[0].endswith("the Pallas TPU splash-attention kernel")
    assert "plain lowering" in messages[1] and "dropout" in messages[1]


@pytest.mark.parametrize(
    ("splash", "mask", "said"),
    [
        (True, None, "the Pallas TPU splash-attention kernel"),
        (False, None, "the Pallas TPU flash-attention kernel"),
        (True, spec(256, 256), "the Pallas TPU flash-attention kernel with the mask as its bias"),
    ],
)
def test_the_log_names_the_kernel_a_call_runs(splash, mask, said, caplog, monkeypatch):
    # The splash kernel takes calls without a mask; a mask is the flash kernel's bias.
    monkeypatch.setattr(kernels, "_logged", {})
    monkeypatch.setattr(kernels, "choice", "always")
    monkeypatch.setattr(kernels, "splash", splash)
    monkeypatch.setattr(kernels, "platform", lambda: "tpu")
    with caplog.at_level(logging.INFO, logger="torchlax.attention"):
        assert kernels.plan_for(Q, KV, KV, mask, 0.0).kernel
    messages = [r.getMessage() for r in caplog.records if r.name == "torchlax.attention"]
    assert messages[0].endswith(said), messages
    assert kernels._splashed(mask) is (splash and mask is None)


@pytest.mark.parametrize("value", ["yes", "2", "true"])
def test_a_bad_splash_switch_names_the_variable(value, monkeypatch):
    monkeypatch.setenv("TORCHLAX_ATTENTION_SPLASH", value)
    with pytest.raises(ValueError, match=f"TORCHLAX_ATTENTION_SPLASH='{value}'.*'1'.*'0'"):
        kernels._splash_from_environment()


def test_off_a_tpu_the_plain_lowering_runs_and_says_so(caplog, monkeypatch):
    monkeypatch.setattr(kernels, "_logged", {})
    q = torch.randn(1, 2, 128, 64)
    with caplog.at_level(logging.INFO, logger="torchlax.attention"):
        with torchlax_core.enable():
            out = F.scaled_dot_product_attention(q.to("jax"), q.to("jax"), q.to("jax"))
    torch.testing.assert_close(out.cpu(), F.scaled_dot_product_attention(q, q, q))
    if jax.default_backend() != "tpu":
        assert any("not a TPU" in r.getMessage() for r in caplog.records)


def _run(platform, monkeypatch, q, k, v, **kwargs):
    """Output and gradients of attention on the jax device with ``platform`` as the platform,
    no op cache (an executable of the other path must not answer)."""
    monkeypatch.setattr(kernels, "platform", lambda: platform)
    monkeypatch.setattr(kernels, "choice", "always")  # (the cases are small: auto declines)
    env = torchlax_core.Environment()
    env.config.op_cache_size = 0
    with torchlax_core.enable(env):
        xs = [x.to("jax").requires_grad_() for x in (q, k, v)]
        mask = kwargs.pop("attn_mask", None)
        if mask is not None:
            mask = mask.to("jax")
            if mask.is_floating_point():
                mask.requires_grad_()
        out = F.scaled_dot_product_attention(*xs, attn_mask=mask, **kwargs)
        grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to("jax")
        inputs = [*xs] + ([mask] if mask is not None and mask.requires_grad else [])
        grads = torch.autograd.grad(out, inputs, grad.to(out.dtype))
        return [out.cpu()] + [g.cpu() for g in grads]


@pytest.mark.slow
@pytest.mark.parametrize(
    "case",
    [
        "causal_gqa",  # the splash kernel (no mask)
        "causal_gqa_flash",  # the same on the flash kernel (TORCHLAX_ATTENTION_SPLASH=0)
        "causal_longer_keys",  # splash, PyTorch's causal mask of more keys than queries
        "no_mask_longer_keys",
        "bool_mask_with_an_empty_row",  # the flash kernel, the mask as its bias
        "float_mask",
        "causal_bool_mask",  # checked: splash where causal, else flash with the bias
    ],
)
def test_kernel_values_match_the_plain_lowering_in_interpret_mode(case, monkeypatch):
    from jax.experimental.pallas import tpu as pltpu

    gen = torch.Generator().manual_seed(0)
    heads, kv_heads = (2, 1) if case.startswith("causal_gqa") else (1, 1)
    source = 256 if case.endswith("longer_keys") else 128
    q = torch.randn(1, heads, 128, 64, generator=gen)
    k = torch.randn(1, kv_heads, source, 64, generator=gen)
    v = torch.randn(1, kv_heads, source, 64, generator=gen)
    monkeypatch.setattr(kernels, "splash", case != "causal_gqa_flash")
    if case.startswith("causal_gqa"):
        kwargs = {"is_causal": True, "enable_gqa": True}
    elif case.endswith("longer_keys"):
        kwargs = {"is_causal": case.startswith("causal")}
    elif case == "causal_bool_mask":  # checked in the program: the kernel with causal=True
        kwargs = {"attn_mask": torch.ones(128, 128, dtype=torch.bool).tril()[None, None]}
    elif case == "bool_mask_with_an_empty_row":
        mask = torch.rand(128, 128, generator=gen) > 0.3
        mask[5] = False  # a row masked out entirely: zeros, as PyTorch
        kwargs = {"attn_mask": mask}
    else:
        mask = torch.randn(1, 1, 128, 128, generator=gen)
        mask[0, 0, :, 7] = float("-inf")
        kwargs = {"attn_mask": mask}
    calls, splashed = [], []
    for name in ("forward", "backward"):
        original = getattr(kernels, name)
        monkeypatch.setattr(
            kernels, name, lambda *a, _f=original, _n=name: calls.append(_n) or _f(*a)
        )
        original = getattr(kernels._splash_kernel, name)
        monkeypatch.setattr(
            kernels._splash_kernel,
            name,
            lambda *a, _f=original, _n=name: splashed.append(_n) or _f(*a),
        )
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")  # (float32 takes the kernel under "medium")
    try:
        plain = _run("cpu", monkeypatch, q, k, v, **dict(kwargs))
        assert calls == []
        # (set for every thread, not force_tpu_interpret_mode(): PyTorch runs a jax-device
        # backward on a thread of its own)
        pltpu.set_tpu_interpret_mode()
        kernel = _run("tpu", monkeypatch, q, k, v, **dict(kwargs))
    finally:
        pltpu.set_tpu_interpret_mode(None)  # (its default: no interpret mode)
        torch.set_float32_matmul_precision(before)
    # (a square boolean mask traces both of the program's branches: causal, and as given)
    assert calls == ["forward", "backward"] or calls == ["forward"] * 2 + ["backward"] * 2
    # the splash kernel: calls without a mask, and a square boolean mask's causal branch
    flash_only = case in ("causal_gqa_flash", "float_mask")
    assert sorted(set(splashed)) == ([] if flash_only else ["backward", "forward"])
    for a, b in zip(kernel, plain, strict=True):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5)
    if case == "bool_mask_with_an_empty_row":
        assert kernel[0][0, 0, 5].abs().max() == 0


BOOL_CAUSAL = spec(8, 1, 2048, 2048, dtype=jnp.bool_)  # what transformers passes when traced


@pytest.mark.parametrize(
    ("query", "mask", "chosen", "kernel", "check"),
    [
        (BIG, BOOL_CAUSAL, "auto", False, True),  # the kernel if causal, else the plain lowering
        (BIG, spec(2048, 2048, dtype=jnp.bool_), "auto", False, True),
        (BIG, BOOL_CAUSAL, "always", True, True),  # else the kernel with the mask as its bias
        (Q, spec(256, 256, dtype=jnp.bool_), "auto", False, False),  # small scores: plain
        (BIG, spec(8, 1, 2048, 2048), "auto", False, False),  # a float mask
        (BIG, spec(2048, dtype=jnp.bool_), "always", True, False),  # not (L, S)
        (BIG, BOOL_CAUSAL, "never", False, False),
        (BIG, None, "auto", True, False),
    ],
)
def test_a_boolean_mask_is_checked_for_causality_in_the_program(
    query, mask, chosen, kernel, check, monkeypatch
):
    monkeypatch.setattr(kernels, "_logged", {})
    monkeypatch.setattr(kernels, "choice", chosen)
    monkeypatch.setattr(kernels, "platform", lambda: "tpu")
    assert kernels.plan_for(query, query, query, mask, 0.0) == kernels.Plan(kernel, check)
    # dropout: the plain lowering, with no check
    assert kernels.plan_for(query, query, query, mask, 0.1) == kernels.Plan(False, False)


@pytest.mark.parametrize(
    ("mask", "causal"),
    [
        (torch.ones(6, 6, dtype=torch.bool).tril(), True),
        (torch.ones(6, 6, dtype=torch.bool).tril().expand(3, 2, 6, 6), True),
        (torch.ones(6, 6, dtype=torch.bool), False),
        (torch.ones(6, 6, dtype=torch.bool).tril(-1), False),
        (torch.stack([torch.ones(6, 6).tril(), torch.ones(6, 6)]).bool()[:, None], False),
    ],
)
def test_the_causal_check_reads_every_row(mask, causal):
    assert bool(kernels.causal_mask(jnp.asarray(mask.numpy()), 6, 6)) is causal


def test_a_causal_check_puts_a_conditional_in_the_program(monkeypatch):
    from torchlax_ops._lowerings import attention

    monkeypatch.setattr(kernels, "_logged", {})
    monkeypatch.setattr(kernels, "choice", "auto")
    monkeypatch.setattr(kernels, "platform", lambda: "tpu")
    q = jax.ShapeDtypeStruct((8, 16, 2048, 128), jnp.bfloat16)

    def attend(q, k, v, mask):
        fused = attention._scaled_dot_product_fused_attention_overrideable
        return fused(q, k, v, mask)[:2]

    jaxpr = str(jax.make_jaxpr(attend)(q, q, q, BOOL_CAUSAL))
    assert "cond[" in jaxpr and "pallas_call" in jaxpr
    assert "pallas_call" not in str(jax.make_jaxpr(attend)(q, q, q, spec(8, 1, 2048, 2048)))


@pytest.mark.parametrize(
    ("length", "largest", "block"),
    [(1024, 512, 512), (384, 512, 128), (768, 512, 256), (2048, 1024, 1024), (128, 512, 128)],
)
def test_the_kernel_s_blocks_divide_the_lengths(length, largest, block, monkeypatch):
    monkeypatch.setattr(kernels, "block", largest)
    assert kernels._fitting(length, largest) == block
    blocks = kernels._blocks(kernels._flash(), spec(1, 1, length, 64), spec(1, 1, length, 64))
    assert blocks.block_q == blocks.block_k_major_dkv == blocks.block_q_dq == block


@pytest.mark.parametrize("value", ["100", "0", "big", "-128"])
def test_a_bad_block_names_the_variable(value, monkeypatch):
    monkeypatch.setenv("TORCHLAX_ATTENTION_BLOCK", value)
    with pytest.raises(ValueError, match=f"TORCHLAX_ATTENTION_BLOCK='{value}'.*multiple of 128"):
        kernels._block_from_environment()


@pytest.mark.slow
def test_jax_differentiates_through_the_causal_check_in_interpret_mode(monkeypatch):
    # torchlax.functional under jax.grad: JAX's autodiff goes through the cond, the kernel's
    # custom VJP in one branch and the plain lowering's checkpoint in the other.
    from jax.experimental.pallas import tpu as pltpu
    from torchlax_ops._lowerings import attention

    gen = np.random.default_rng(0)
    q, k, v = (jnp.asarray(gen.standard_normal((1, 2, 128, 64)), jnp.float32) for _ in range(3))
    weights = jnp.asarray(gen.standard_normal((1, 2, 128, 64)), jnp.float32)
    causal = jnp.tril(jnp.ones((128, 128), jnp.bool_))[None, None]
    other = causal.at[..., 5, 0].set(False)

    def loss(q, k, v, mask):
        out = attention._scaled_dot_product_fused_attention_overrideable(q, k, v, mask)[0]
        return jnp.sum(out * weights)

    grad = jax.grad(loss, argnums=(0, 1, 2))
    monkeypatch.setattr(kernels, "_logged", {})
    monkeypatch.setattr(kernels, "choice", "always")
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")  # (float32 takes the kernel only then)
    try:
        want = {name: grad(q, k, v, m) for name, m in (("causal", causal), ("other", other))}
        monkeypatch.setattr(kernels, "platform", lambda: "tpu")
        pltpu.set_tpu_interpret_mode()
        assert kernels.plan_for(q, k, v, causal, 0.0) == kernels.Plan(True, True)
        got = {name: grad(q, k, v, m) for name, m in (("causal", causal), ("other", other))}
    finally:
        pltpu.set_tpu_interpret_mode(None)
        torch.set_float32_matmul_precision(before)
    for name in want:
        for a, b in zip(got[name], want[name], strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=2e-5)
