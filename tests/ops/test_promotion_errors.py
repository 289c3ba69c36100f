"""Mixed-dtype rules PyTorch's CPU kernels enforce, on the ``jax`` device: the same results,
or the same exception type with PyTorch's message."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import torchlax  # noqa: F401  (registers the jax device)

H, B, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64


def _layer_norm(device, input_dtype, weight_dtype, bias_dtype):
    torch.manual_seed(0)
    x = torch.randn(2, 4, dtype=input_dtype).to(device)
    weight = torch.randn(4, dtype=weight_dtype).to(device) if weight_dtype else None
    bias = torch.randn(4, dtype=bias_dtype).to(device) if bias_dtype else None
    return torch.native_layer_norm(x, [4], weight, bias, 1e-5)


@pytest.mark.parametrize(
    "dtypes",
    [
        (H, F32, F32),  # mixed type: half input, float32 parameters
        (B, None, F32),
        (H, H, H),
        (F64, None, None),
    ],
)
def test_layer_norm_accepts_what_pytorch_cpu_accepts(dtypes):
    expected, got = _layer_norm("cpu", *dtypes), _layer_norm("jax", *dtypes)
    for e, g in zip(expected, got, strict=True):
        assert g.dtype == e.dtype and g.shape == e.shape
        torch.testing.assert_close(g.cpu(), e, atol=2e-2, rtol=1e-2)


@pytest.mark.parametrize(
    ("dtypes", "pytorch_says"),
    [
        ((H, B, None), "mixed dtype (CPU): expect parameter to have scalar type of Float"),
        ((F32, None, H), "mixed dtype (CPU): expect parameter to have scalar type of Float"),
        ((H, F32, F64), "mixed dtype (CPU): expect parameter to have scalar type of Float"),
        ((F64, F32, F32), "mixed dtype (CPU): all inputs must share same datatype."),
        ((H, H, F32), "expected scalar type Half but found Float"),
        ((F32, F32, F64), "expected scalar type Float but found Double"),
    ],
)
def test_layer_norm_refuses_mixed_dtypes_as_pytorch_cpu(dtypes, pytorch_says):
    with pytest.raises(RuntimeError) as on_cpu:
        _layer_norm("cpu", *dtypes)
    assert str(on_cpu.value) == pytorch_says  # the rule this test copies is PyTorch's
    with pytest.raises(RuntimeError, match="native_layer_norm got (weight|bias|float32)") as got:
        _layer_norm("jax", *dtypes)
    assert str(got.value).startswith(pytorch_says)


def test_functional_layer_norm_refuses_a_bfloat16_weight_for_a_half_input():
    x = torch.randn(2, 4, dtype=H, device="jax")
    with pytest.raises(RuntimeError, match="mixed dtype.*native_layer_norm got weight"):
        F.layer_norm(x, [4], torch.ones(4, dtype=B, device="jax"))
