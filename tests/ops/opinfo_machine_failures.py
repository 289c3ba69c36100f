"""OpInfo cases whose PyTorch reference depends on the machine, so they fail only on some.

Kept apart from ``opinfo_expected_failures.py``, which ``opinfo_report.py --write-table``
regenerates from one machine's run (it leaves these keys out).
"""

import torch

_CONV_TRANSPOSE_BF16 = (
    "on a CPU without AVX512-BF16 PyTorch takes slow_conv_transpose: bfloat16 GEMM, "
    "then col2im sums overlapping taps in bfloat16 and the bias is added in "
    "bfloat16 (three roundings; 0.75 off on cancelling samples); torchlax "
    "accumulates in float32 and rounds once, as oneDNN and cuDNN do"
)

MACHINE_FAILURES: dict[tuple[str, str | None, str | None, str], str] = {}

if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
    for _n in (1, 2, 3):
        for _mode in ("eager", "jit"):
            MACHINE_FAILURES[(f"nn.functional.conv_transpose{_n}d", None, "bfloat16", _mode)] = (
                _CONV_TRANSPOSE_BF16
            )
