"""A lowering of an op the installed PyTorch lacks is skipped alone, and said once.

On torch 2.13 ``aten.linalg_matrix_sqrth`` does not exist; naming it at import time used to fail
the import of the lowerings and leave every op unlowered. Simulated here in a fresh interpreter:
PyTorch's op lookup is made to find no such op before torchlax is imported.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import torch, torch._ops

    found = torch._ops._get_packet
    gone = {"aten::linalg_matrix_sqrth", "aten::_masked_softmax"}

    def get_packet(qualified_name, module_name):
        if qualified_name in gone:
            return None, None
        return found(qualified_name, module_name)

    torch._ops._get_packet = get_packet
    for name in ("linalg_matrix_sqrth", "_masked_softmax"):
        torch.ops.aten.__dict__.pop(name, None)
    assert not hasattr(torch.ops.aten, "linalg_matrix_sqrth")

    import torchlax, torchlax_core

    with torchlax.enable():
        a = torch.randn(3, 3, device="jax")
        print("mm", torch.allclose((a @ a).cpu(), a.cpu() @ a.cpu(), atol=1e-5))
        print("sqrt", torch.allclose(a.abs().sqrt().cpu(), a.cpu().abs().sqrt()))
        x = torch.randn(2, 4, 3, device="jax")
        mha = torch.nn.MultiheadAttention(3, 1, batch_first=True).to("jax")
        print("mha", tuple(mha(x, x, x)[0].shape))
    torchlax_core.Environment()  # a second environment registers the plugin again
    """
)


def test_a_missing_op_is_skipped_alone_and_said_once():
    env = {**os.environ, "TORCHLAX_LOG": "info"}
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "mm True" in result.stdout and "sqrt True" in result.stdout
    assert "mha (2, 4, 3)" in result.stdout
    lines = [line for line in result.stderr.splitlines() if "lacks" in line]
    assert len(lines) == 1, result.stderr[-3000:]
    assert "aten.linalg_matrix_sqrth" in lines[0] and "aten._masked_softmax" in lines[0]
    assert "failed" not in result.stderr.lower(), result.stderr[-3000:]
