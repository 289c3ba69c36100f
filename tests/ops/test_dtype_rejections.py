"""Dtypes PyTorch's CPU kernels refuse raise on the jax device too, and mixed dtypes that
PyTorch promotes out of a refused one compute, as on eager CPU (issue 37, item 6)."""

from __future__ import annotations

import pytest
import torch
import torchlax  # noqa: F401  (registers the jax device)


def _bools(device):
    return torch.tensor([True, False, True], device=device)


def _ints(values, device, dtype=torch.int64):
    return torch.tensor(values, dtype=dtype, device=device)


# (id, call of a device): each computes on eager CPU.
COMPUTES = [
    (
        "clamp_bool_int_bounds",
        lambda d: torch.clamp(_bools(d), _ints([0, 0, 1], d), _ints([1] * 3, d)),
    ),
    (
        "clamp_bool_float_bounds",
        lambda d: torch.clamp(
            _bools(d), torch.tensor([0.5, 0, 1], device=d), torch.ones(3, device=d)
        ),
    ),
    ("clamp_min_bool_int", lambda d: torch.clamp(_bools(d), min=_ints([1, 1, 0], d))),
    ("clamp_max_bool_int", lambda d: torch.clamp(_bools(d), max=_ints([0, 0, 2], d))),
    (
        "addcmul_bool_ints",
        lambda d: torch.addcmul(_bools(d), _ints([1, 2, 3], d), _ints([2] * 3, d)),
    ),
    ("round_int", lambda d: torch.round(_ints([1, 2], d, torch.int8))),
]

# (id, call of a device): each raises on eager CPU.
REFUSES = [
    ("clamp_bool_bool_bounds", lambda d: torch.clamp(_bools(d), _bools(d), _bools(d))),
    ("histc_bool", lambda d: torch.histc(_bools(d), bins=3)),
    ("round_bool", lambda d: torch.round(_bools(d))),
    ("round_bool_decimals", lambda d: torch.round(_bools(d), decimals=1)),
    ("round_int_decimals", lambda d: torch.round(_ints([1, 2], d), decimals=1)),
    ("mv_bool", lambda d: torch.mv(torch.ones(2, 3, dtype=torch.bool, device=d), _bools(d))),
    ("addcmul_bool", lambda d: torch.addcmul(_bools(d), _bools(d), _bools(d))),
    ("sub_bool_int", lambda d: torch.sub(_bools(d), _ints([1, 2, 3], d))),
]


@pytest.mark.parametrize("call", [c for _, c in COMPUTES], ids=[n for n, _ in COMPUTES])
def test_computes_as_on_cpu(call):
    expected = call("cpu")
    got = call("jax")
    assert got.dtype == expected.dtype and got.shape == expected.shape
    torch.testing.assert_close(got.cpu(), expected)


@pytest.mark.parametrize("call", [c for _, c in REFUSES], ids=[n for n, _ in REFUSES])
def test_refuses_as_on_cpu(call):
    with pytest.raises(Exception) as on_cpu:
        call("cpu")
    with pytest.raises(type(on_cpu.value)):
        call("jax")


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
def test_integer_histc_computes_as_on_cuda(dtype):
    # The CPU kernel refuses integer histc, CUDA's computes it (in the input's dtype), and
    # transformers' MoE routing calls it on any device but CPU and MPS (_dtype_support.AS_ON_CUDA).
    values = [0, 1, 1, 3, 2, 3, 3]
    with pytest.raises(NotImplementedError):
        torch.histc(_ints(values, "cpu", dtype), bins=4, min=0, max=3)
    got = torch.histc(_ints(values, "jax", dtype), bins=4, min=0, max=3)
    expected = torch.histc(torch.tensor(values, dtype=torch.float32), bins=4, min=0, max=3)
    assert got.dtype == dtype
    torch.testing.assert_close(got.cpu(), expected.to(dtype))
