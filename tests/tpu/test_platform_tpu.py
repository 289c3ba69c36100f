"""The TPU as torchlax's ``jax`` device: placement, 64-bit values, float32 accuracy, attention,
and the TPU benchmark's smoke mode, all in this one process (one process holds the chip)."""

from __future__ import annotations

import json
import math

import jax
import pytest
import torch
import torch.nn.functional as F
import torchlax
import tpu_support

pytestmark = tpu_support.MARKS


def test_jax_device_is_the_tpu():
    with torchlax.enable():
        x = torch.ones(4, device="jax")
    assert x.device == torch.device("jax", 0)
    assert x.jax().devices() == {jax.devices()[0]}
    assert jax.devices()[0].platform == "tpu"


def test_int64_and_float64_stay_exact():
    big = torch.tensor([2**53 + 1, -(2**62) + 7], dtype=torch.int64)
    f64 = torch.tensor([1.0, 1e-300, 1 / 3], dtype=torch.float64)
    with torchlax.enable():
        got_int = (big.to("jax") * 1 + 1).cpu()
        got_f64 = (f64.to("jax") * 3 + 1e-16).cpu()
    assert got_int.dtype == torch.int64 and got_int.tolist() == (big + 1).tolist()
    assert got_f64.dtype == torch.float64
    torch.testing.assert_close(got_f64, f64 * 3 + 1e-16, rtol=1e-15, atol=0)


@pytest.mark.parametrize("op", ["exp", "log", "tanh", "erf", "sigmoid"])
def test_float32_transcendentals_within_the_documented_accuracy(op, record_property):
    """docs/tpu.md: the TPU's float32 transcendentals agree with float64 to ~1e-4 (relative
    where the value is above 1, absolute below: log's relative error near x = 1, where the
    value is near 0, says nothing about the function)."""
    x = torch.linspace(0.05, 8.0, 4096)
    expected = getattr(torch, op)(x.double())
    with torchlax.enable():
        got = getattr(torch, op)(x.to("jax")).cpu()
    assert got.dtype == torch.float32
    rel = ((got.double() - expected).abs() / expected.abs().clamp_min(1.0)).max().item()
    record_property(f"{op} max error (relative above 1, absolute below)", f"{rel:.3g}")
    assert rel < 2e-4


def test_float32_matmul_at_default_precision_is_float32_accurate(record_property):
    """torch's default float32 matmul precision ("highest"): float32 products on the TPU too
    (XLA's own default there would be one bf16 pass, ~1e-2 relative)."""
    assert torch.get_float32_matmul_precision() == "highest"
    a, b = torch.randn(256, 512), torch.randn(512, 256)
    expected = a.double() @ b.double()
    with torchlax.enable():
        got = (a.to("jax") @ b.to("jax")).cpu()
    rel = ((got.double() - expected).abs().max() / expected.abs().max()).item()
    record_property("highest matmul relative error", f"{rel:.3g}")
    assert rel < 1e-5


@pytest.mark.parametrize("precision, low, high", [("high", 0.0, 1e-4), ("medium", 1e-4, 3e-2)])
def test_float32_matmul_precision_knob_changes_the_product(precision, low, high, record_property):
    """torch.set_float32_matmul_precision: "high" is three bf16 passes (bf16_3x), "medium" one;
    each then differs from the float64 product by its own order of magnitude."""
    a, b = torch.randn(256, 512), torch.randn(512, 256)
    expected = a.double() @ b.double()
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        with torchlax.enable():
            eager = (a.to("jax") @ b.to("jax")).cpu()
            jitted = torchlax.jit(lambda x, y: x @ y)(a.to("jax"), b.to("jax")).cpu()
    finally:
        torch.set_float32_matmul_precision(before)
    for how, got in (("eager", eager), ("jit", jitted)):
        rel = ((got.double() - expected).abs().max() / expected.abs().max()).item()
        record_property(f"{precision} {how} matmul relative error", f"{rel:.3g}")
        assert low < rel < high, (how, rel)


@pytest.mark.parametrize("causal", [True, False])
def test_bf16_attention_forward_and_backward(causal, record_property):
    """scaled_dot_product_attention on bf16 (B, H, T, D) against float64 on the CPU, at bf16's
    tolerance (8 bits of mantissa), values and the gradients of q, k, v."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 256, 64, generator=g) for _ in range(3))
    upstream = torch.randn(2, 4, 256, 64, generator=g)

    def run(q, k, v, device):
        with torchlax.enable():
            leaves = [t.to(device).requires_grad_() for t in (q, k, v)]
            out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
            (out.double() * upstream.double().to(device)).sum().backward()
            return [out.detach().cpu()] + [t.grad.cpu() for t in leaves]

    expected = run(q.double(), k.double(), v.double(), "cpu")
    got = run(q.bfloat16(), k.bfloat16(), v.bfloat16(), "jax")
    for what, a, e in zip(("out", "dq", "dk", "dv"), got, expected):
        assert a.dtype == torch.bfloat16 and a.shape == e.shape
        err = ((a.double() - e).abs().max() / e.abs().max()).item()
        record_property(f"attention causal={causal} {what} relative error", f"{err:.3g}")
        assert err < 3e-2, (what, err)


def test_benchmark_smoke_mode_runs_on_the_tpu(tmp_path):
    bench = tpu_support.tpu_benchmark()
    out = tmp_path / "tpu_smoke.json"
    bench.main(
        ["--smoke", "--models", "gpt2", "--variants", "jax,functional,jit", "--out", str(out)]
    )
    rows = json.loads(out.read_text())["rows"]
    assert [r["variant"] for r in rows] == ["jax", "functional", "jit"]
    for row in rows:
        assert "error" not in row, row
        assert row["steady_compiles"] == 0, row
        assert row.get("devices_of_params", [str(jax.devices()[0])]) == [str(jax.devices()[0])]
        assert math.isfinite(row["median_s"]) and row["mfu"] > 0
