"""Config(fallback_to_torch=True) inside compiled programs: torchlax.jit and torch.compile.

``aten._add_relu`` has no JAX lowering, and its Scalar overload not even a meta kernel: the
output shapes for ``jax.pure_callback`` come from PyTorch's fake-tensor machinery.
"""

import warnings

import pytest
import torch
import torchlax_core
import torchlax_interop

aten = torch.ops.aten


def _program(a):
    b = a * 1
    aten._add_relu_.Tensor(b, a)  # in place: written back from the callback
    return b, aten._add_relu.Scalar(a.double(), 0.5) - 1


@pytest.fixture
def env():
    return torchlax_core.Environment(torchlax_core.Config(fallback_to_torch=True))


def test_fallback_under_torchlax_jit_matches_pytorch_and_warns_once(env):
    x = torch.randn(4, 5)
    expected = _program(x)
    with torchlax_core.enable(env), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jitted = torchlax_interop.jit(_program)
        for _ in range(2):
            out = jitted(x.to("jax"))
            for o, e in zip(out, expected, strict=True):
                torch.testing.assert_close(o.cpu(), e)
                assert o.dtype == e.dtype and o.shape == e.shape
    messages = [str(w.message) for w in caught if "has no JAX lowering" in str(w.message)]
    assert sum("aten._add_relu.Scalar" in m for m in messages) == 1
    assert all("jax.pure_callback" in m for m in messages)


def test_fallback_under_torch_compile(env):
    x = torch.randn(4, 5)
    torch._dynamo.reset()
    with torchlax_core.enable(env), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = torch.compile(_program, backend="torchlax")(x)
    for o, e in zip(out, _program(x), strict=True):
        torch.testing.assert_close(o, e)
