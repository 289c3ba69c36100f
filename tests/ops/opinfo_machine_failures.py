"""OpInfo cases whose PyTorch reference, or XLA's CPU code, depends on the machine, so they
fail only on some.

Kept apart from ``opinfo_expected_failures.py``, which ``opinfo_report.py --write-table``
regenerates from one machine's run (it leaves these keys out).
"""

from pathlib import Path

import torch

_CONV_TRANSPOSE_BF16 = (
    "on a CPU without AVX512-BF16 PyTorch takes slow_conv_transpose: bfloat16 GEMM, "
    "then col2im sums overlapping taps in bfloat16 and the bias is added in "
    "bfloat16 (three roundings; 0.75 off on cancelling samples); torchlax "
    "accumulates in float32 and rounds once, as oneDNN and cuDNN do"
)

_GRID_SAMPLE_F16 = (
    "on an AVX-512 CPU XLA's float16 code skips a rounding that PyTorch's scalar half kernel "
    "makes (c * 5 - 1 in one fused kernel is not round(round(c * 5) - 1) in 82 of 1000 float16 "
    "values; with XLA_FLAGS=--xla_cpu_max_isa=AVX2 it is, and this case matches exactly): the "
    "lowering's unnormalize and corner sums, step by step in float16, come out 2 of 150 "
    "elements 0.003 apart"
)


def _cpu_flags() -> set[str]:
    cpuinfo = Path("/proc/cpuinfo")
    for line in cpuinfo.read_text().splitlines() if cpuinfo.exists() else []:
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


MACHINE_FAILURES: dict[tuple[str, str | None, str | None, str], str] = {}

_SDPA_FOR_CPU_F32_JIT = (
    "on an AVX-512 CPU one element is 1.4e-5 from PyTorch (tolerance 1e-5) under jit, as "
    "eagerly on every CPU (opinfo_expected_failures.py): PyTorch's own float32 result is off "
    "the float64 answer there; XLA's AVX2 code lands within the tolerance"
)

if "avx512f" in _cpu_flags():
    MACHINE_FAILURES[("nn.functional.grid_sample", None, "float16", "eager")] = _GRID_SAMPLE_F16
    MACHINE_FAILURES[
        ("torch.ops.aten._scaled_dot_product_flash_attention_for_cpu", None, "float32", "jit")
    ] = _SDPA_FOR_CPU_F32_JIT

if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
    for _n in (1, 2, 3):
        for _mode in ("eager", "jit"):
            MACHINE_FAILURES[(f"nn.functional.conv_transpose{_n}d", None, "bfloat16", _mode)] = (
                _CONV_TRANSPOSE_BF16
            )
