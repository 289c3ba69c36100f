"""Factories on the jax device: PyTorch's dtypes, shapes and values."""

from __future__ import annotations

import os
import sys

import pytest
import torch
import torchlax_core

sys.path.insert(0, os.path.dirname(__file__))
from _compare_cpu import assert_same, check, run_jit  # noqa: E402


def on_jax(factory, *args, **kwargs):
    """factory(..., device="jax") compared with factory(...) on the CPU."""
    expected = factory(*args, **kwargs)
    with torchlax_core.enable():
        actual = factory(*args, device="jax", **kwargs)
    assert actual.device.type == "jax"
    assert_same(actual, expected, atol=0, rtol=0)


ARANGE = [
    ((5,), {}),
    ((1, 10, 3), {}),
    ((10, 0, -3), {}),
    ((0.0, 1.0, 0.1), {}),
    ((1, 2.5, 0.5), {}),
    ((5,), {"dtype": torch.float32}),
    ((0, 1, 0.3), {"dtype": torch.float64}),
    ((-3, 7, 2), {"dtype": torch.int32}),
    ((0, 2, 0.25), {"dtype": torch.bfloat16}),
    ((2**40, 2**40 + 5), {}),
]


@pytest.mark.parametrize("args, kwargs", ARANGE, ids=[str(a) + str(k) for a, k in ARANGE])
def test_arange(args, kwargs):
    on_jax(torch.arange, *args, **kwargs)


@pytest.mark.parametrize("value", [3, 2.5, True, 1 + 2j])
def test_full_infers_dtype_from_the_fill_value(value):
    on_jax(torch.full, (2, 3), value)


@pytest.mark.parametrize("factory", [torch.zeros, torch.ones])
@pytest.mark.parametrize("dtype", [None, torch.int64, torch.bfloat16, torch.bool])
def test_zeros_ones(factory, dtype):
    on_jax(factory, 2, 3, dtype=dtype)


def test_default_dtype_is_respected():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        on_jax(torch.zeros, 3)
        on_jax(torch.arange, 0.0, 1.0, 0.25)
        on_jax(torch.full, (2,), 1.5)
    finally:
        torch.set_default_dtype(before)


def test_empty_has_shape_and_dtype():
    with torchlax_core.enable():
        x = torch.empty(2, 3, dtype=torch.int16, device="jax")
    assert x.shape == (2, 3) and x.dtype == torch.int16 and x.device.type == "jax"


@pytest.mark.parametrize("args", [(3,), (3, 5), (4, 2)])
def test_eye(args):
    on_jax(torch.eye, *args)


@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((0, 1, 7), {}),
        ((-2, 10, 5), {"dtype": torch.float64}),
        ((0, 10, 7), {"dtype": torch.int64}),
        ((3, 3, 1), {}),
        ((0, 1, 0), {}),
        ((1, 2, 4), {"dtype": torch.complex64}),
    ],
)
def test_linspace(args, kwargs):
    expected = torch.linspace(*args, **kwargs)
    with torchlax_core.enable():
        actual = torch.linspace(*args, device="jax", **kwargs)
    assert_same(actual, expected, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize(
    "args, kwargs",
    [((0, 2, 5), {}), ((-1, 1, 4), {"base": 2.0}), ((0, 3, 4), {"dtype": torch.float64})],
)
def test_logspace(args, kwargs):
    expected = torch.logspace(*args, **kwargs)
    with torchlax_core.enable():
        actual = torch.logspace(*args, device="jax", **kwargs)
    assert_same(actual, expected, atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("fn", [torch.tril_indices, torch.triu_indices])
@pytest.mark.parametrize("args", [(3, 4), (4, 3, 1), (5, 5, -2)])
def test_triangle_indices(fn, args):
    on_jax(fn, *args)


def test_scalar_tensor():
    on_jax(torch.scalar_tensor, 3)
    on_jax(torch.scalar_tensor, 2, dtype=torch.int64)


LIKE = {
    "zeros_like": lambda x: torch.zeros_like(x),
    "ones_like_dtype": lambda x: torch.ones_like(x, dtype=torch.int32),
    "full_like": lambda x: torch.full_like(x, 7),
    "full_like_float_into_int": lambda x: torch.full_like(x.long(), 2.7),
    "new_zeros": lambda x: x.new_zeros(4, 1),
    "new_ones": lambda x: x.new_ones((2,), dtype=torch.bool),
    "new_full": lambda x: x.new_full((3,), 5),
    "empty_like_shape": lambda x: torch.empty_like(x).shape,
    "new_empty_shape": lambda x: (x.new_empty(2, 2).shape, x.new_empty(2, 2).dtype),
}


@pytest.mark.parametrize("name", LIKE)
def test_like_and_new(name):
    check(LIKE[name], torch.randn(2, 3), jit=name.startswith(("zeros", "full_like")))


def test_factory_inside_jit_program():
    def fn(x):
        return x + torch.arange(3, device=x.device) + torch.ones(3, device=x.device)

    expected = fn(torch.zeros(3))
    with torchlax_core.enable():
        actual = run_jit(fn, torch.zeros(3).to("jax"))
    assert_same(actual, expected)


@pytest.mark.parametrize(
    "start, end",
    [
        (torch.tensor(-2.0), torch.tensor(3.5)),
        (torch.tensor(1), torch.tensor(9)),
        (torch.tensor(0.5, dtype=torch.float64), 4.0),
        (-1, torch.tensor(2.0)),
    ],
)
@pytest.mark.parametrize("steps", [0, 1, 6])
def test_linspace_logspace_with_tensor_bounds_under_jit(start, end, steps):
    # The bounds may be traced: steps alone fixes the shape.
    tensors = [b for b in (start, end) if isinstance(b, torch.Tensor)]

    def bounds(ts):
        ts = iter(ts)
        return [next(ts) if isinstance(b, torch.Tensor) else b for b in (start, end)]

    def fn(*ts):
        lo, hi = bounds(ts)
        device = ts[0].device
        return (
            torch.linspace(lo, hi, steps, device=device),
            torch.linspace(lo, hi, steps, dtype=torch.int64, device=device),
            torch.logspace(lo, hi, steps, base=2.0, device=device),
        )

    check(fn, *tensors)
