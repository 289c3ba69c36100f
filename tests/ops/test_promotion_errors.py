"""Mixed-dtype rules PyTorch's CPU kernels enforce, on the ``jax`` device: the same results,
or the same exception type with PyTorch's message."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
import torchlax  # (registers the jax device)

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


@pytest.mark.parametrize(
    "combine",
    [lambda h: h + 1j, lambda h: 1j * h, lambda h: h - 2j, lambda h: torch.add(h, 1j)],
    ids=["add", "reflected_mul", "sub", "torch_add"],
)
@pytest.mark.parametrize(("dtype", "aten_name"), [(H, "ComplexHalf"), (B, "BComplex32")])
def test_half_with_a_complex_number_raises_the_dtype_error_through_operators(
    combine, dtype, aten_name
):
    """The result would be complex32 (bcomplex32 for bfloat16), which JAX lacks. PyTorch's
    CPU kernels raise ``NotImplementedError: "..." not implemented for 'ComplexHalf'`` for the
    ops they lack in such a dtype (bfloat16: already the addition); the jax device raises that
    for every op, and through Python's operators too (a ``TypeError`` would turn into
    "unsupported operand type(s)" there)."""
    message = f"not implemented for '{aten_name}'"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "ComplexHalf support is experimental"
        if dtype is H:  # the CPU computes it as complex32, but not e.g. exp of it
            on_cpu = combine(torch.ones(2, dtype=dtype))
            assert on_cpu.dtype == torch.complex32
            with pytest.raises(NotImplementedError, match=message):
                on_cpu.exp()
        else:
            with pytest.raises(NotImplementedError, match=message):
                combine(torch.ones(2, dtype=dtype))
    with pytest.raises(NotImplementedError, match=message) as got:
        combine(torch.ones(2, dtype=dtype, device="jax"))
    assert isinstance(got.value, torchlax.DtypeNotImplementedError)
    assert "x.to(torch.complex64)" in str(got.value)
