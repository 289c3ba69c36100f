"""Where JAX sees no TPU: the TPU tests skip with a reason, and the TPU benchmark's smoke mode
runs on the CPU (CI-sized shapes), so the script itself is checked in CI."""

from __future__ import annotations

import json
import subprocess
import sys

import jax
import pytest
import tpu_support

pytestmark = pytest.mark.skipif(
    jax.devices()[0].platform == "tpu", reason="JAX has a TPU here: see the tpu tests"
)


def test_tpu_tests_skip_with_a_reason():
    reason = tpu_support.unavailable_reason()
    assert reason is not None and "no TPU visible to JAX" in reason and "torchlax[tpu]" in reason


@pytest.mark.slow  # a fresh interpreter compiling four small training steps
def test_tpu_benchmark_smoke_mode_on_the_cpu(tmp_path):
    out = tmp_path / "tpu.json"
    script = tpu_support.ROOT / "benchmarks" / "tpu.py"
    variants = "torchax,jax,functional,functional_cpu,jit"
    cmd = [sys.executable, str(script), "--smoke", "--models", "gpt2", "--variants", variants]
    result = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True, timeout=600)
    rows = {r["variant"]: r for r in json.loads(out.read_text())["rows"]}
    assert list(rows) == variants.split(","), result.stderr[-3000:]
    for variant in ("jax", "functional", "functional_cpu", "jit"):
        row = rows[variant]
        assert "error" not in row, row
        assert row["steady_compiles"] == 0 and row["first_call_compiles"] > 0
        assert row["median_s"] > 0 and row["flops_per_step"] > 0 and 0 < row["mfu"] < 1
        assert row["exe_peak_bytes"] > 0
    # torchax is not a dependency: measured where it imports, else named as skipped
    assert "median_s" in rows["torchax"] or "does not import" in rows["torchax"]["skipped"]
    # each variant's parameters stay on the device its step runs on (the CPU here)
    assert rows["functional"]["devices_of_params"] == [str(jax.devices()[0])]
