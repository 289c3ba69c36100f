"""``import torchlax`` loads Dynamo, export and distributed code only when they are used.

Each check runs in a fresh interpreter: the test process itself has imported everything.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# Imported by torch itself (``import torch``), so not torchlax's doing.
_TORCH_OWN = ("torch.export", "torch.distributed")


def run(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_import_torchlax_defers_dynamo_export_and_distributed():
    out = run("""
        import sys
        import torchlax
        lazy = ("torch._dynamo", "torchlax_dynamo", "torchlax_export", "torchlax.distributed",
                "torchlax_interop.distributed")
        print(sorted(m for m in lazy if m in sys.modules))
        assert callable(torchlax.call_jax) and callable(torchlax.jit)
        print(callable(torchlax.export.export), "torchlax_export" in sys.modules)
    """)
    loaded, export = out.splitlines()
    assert loaded == "[]"
    assert export == "True True"  # torchlax.export loads on first use


def test_call_jax_on_torchlax_tensors_works_without_dynamo():
    # (On CPU tensors the first call imports Dynamo anyway: PyTorch's custom-op kernels
    # wrap themselves in torch._dynamo.disable on first use.)
    out = run("""
        import sys
        import jax.numpy as jnp
        import torch
        import torchlax
        with torchlax.enable():
            x = torch.arange(4.0, device="jax")
            y = torchlax.call_jax(jnp.sin, x)
            assert torch.allclose(y.cpu(), torch.sin(torch.arange(4.0)))
        print("torch._dynamo" in sys.modules)
    """)
    assert out.strip() == "False"


@pytest.mark.slow
def test_torch_compile_finds_the_backend_without_import_torchlax():
    out = run("""
        import sys
        import torch
        def f(x):
            return torch.sin(x) * 2 + 1
        x = torch.randn(8)
        compiled = torch.compile(f, backend="torchlax")
        torch.testing.assert_close(compiled(x), f(x))
        print("torchlax" in sys.modules, "torchlax_dynamo" in sys.modules)
    """)
    assert out.strip() == "False True"
