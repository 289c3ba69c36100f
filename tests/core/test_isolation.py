"""Importing torchlax changes nothing for code that does not use it."""

from __future__ import annotations

import textwrap

import fresh_python


def run(code: str) -> str:
    out = fresh_python.run(["-c", textwrap.dedent(code)], timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    return out.stdout


def test_cpu_torch_jax_and_other_compile_backends_keep_working():
    out = run("""
        import torch, jax, jax.numpy as jnp
        def f(x):
            return torch.sin(x) * 2 + x.sum()
        x = torch.randn(8)
        expected = f(x)
        import torchlax  # noqa: F401  the import under test
        import torchlax_core
        torchlax_core.default_env()  # load every plugin too
        y = torch.randn(3) + 1
        assert type(y) is torch.Tensor and y.device.type == "cpu"
        assert torch.ones(2, dtype=torch.int64).sum().dtype == torch.int64
        # Plain JAX keeps its defaults (64-bit mode stays off outside torchlax.enable()).
        assert jnp.arange(3).dtype == jnp.int32 and not jax.config.jax_enable_x64
        for backend in ("inductor", "eager", "aot_eager"):
            torch._dynamo.reset()
            compiled = torch.compile(f, backend=backend, fullgraph=True)
            torch.testing.assert_close(compiled(x), expected)
        m = torch.nn.Linear(4, 2)
        out = m(torch.randn(3, 4)).sum()
        out.backward()
        assert type(m.weight.grad) is torch.Tensor
        print("ok")
    """)
    assert out.strip() == "ok"
