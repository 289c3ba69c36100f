"""Special functions (special.py) against eager PyTorch on the CPU, eagerly and under jax.jit.

The arguments straddle each algorithm's branch points (Bessel functions switch at 5, 8 or 2,
Airy Ai at +-2.09, 8.32 and 103.892, digamma shifts to 10) and include poles, negative
arguments, large arguments, infinities and nan, in float32 and float64; integer and bool
inputs must come back as float32.
"""

from __future__ import annotations

import math
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from _compare_cpu import check  # noqa: E402

INF, NAN = math.inf, math.nan
TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.float64: (1e-12, 1e-12)}
FLOATS = (torch.float32, torch.float64)


def grid(values, dtype):
    return torch.tensor(values, dtype=dtype)


def same(fn, *args, dtype=torch.float64, jit=True):
    atol, rtol = TOLERANCE.get(dtype, (1e-5, 1e-5))
    check(fn, *args, atol=atol, rtol=rtol, jit=jit)


GAMMA_ARGS = [
    -8.3156849084,
    -7.9505867958,
    -3.5,
    -2.0,
    -1.0,
    -0.5,
    -1e-8,
    -0.0,
    0.0,
    1e-8,
    0.25,
    0.5,
    1.0,
    1.5,
    3.3,
    9.99,
    10.0,
    10.5,
    123.4,
    1e5,
    1e18,
    INF,
    -INF,
    NAN,
]


@pytest.mark.parametrize("dtype", FLOATS)
def test_digamma_reflection_poles_and_asymptotics(dtype):
    x = grid(GAMMA_ARGS, dtype)
    same(torch.digamma, x, dtype=dtype)
    same(lambda t: torch.polygamma(0, t), x, dtype=dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_polygamma_negative_arguments_and_poles(dtype, n):
    # Poles at non-positive integers are excluded for n >= 2 (PyTorch gives inf there, checked
    # below); near the poles float32 values are huge, so compare relative.
    x = grid([v for v in GAMMA_ARGS if abs(v) > 1e-7 and abs(v) < 1e6], dtype)
    same(lambda t: torch.polygamma(n, t), x, dtype=dtype)
    same(lambda t: torch.special.polygamma(n, t), x, dtype=dtype)


def test_polygamma_at_poles():
    x = torch.tensor([0.0, -1.0, -3.0, -INF])
    for n in (2, 3):
        same(lambda t, n=n: torch.polygamma(n, t), x)


def test_polygamma_of_integers_and_bools_is_float32():
    ints = torch.tensor([1, 2, 3, 7, 20])
    for n in range(4):
        same(lambda t, n=n: torch.polygamma(n, t), ints, dtype=torch.float32)
    same(lambda t: torch.polygamma(2, t), torch.tensor([True, True]), dtype=torch.float32)
    same(torch.digamma, torch.tensor([False, True]), dtype=torch.float32)


@pytest.mark.parametrize("dtype", FLOATS)
def test_zeta_domain_edges(dtype):
    x = grid([0.5, 1.0, 1.5, 2.0, 3.0, 4.5, 2.0, 3.0, 4.0, 2.0, 30.0, NAN], dtype)
    q = grid([1.0, 2.0, 0.5, -1.5, -2.5, -2.5, -2.0, 0.0, 1e3, 1e-3, 2.0, 1.0], dtype)
    same(torch.special.zeta, x, q, dtype=dtype)
    # Poles at non-positive integer q win over a non-integer x; nan x is checked after them.
    same(
        torch.special.zeta,
        grid([2.5, 16191.576, NAN, NAN], dtype),
        grid([-3.0, -7942321.0, 0.0, -0.5], dtype),
        dtype=dtype,
    )
    same(lambda a: torch.special.zeta(a, 2.5), x, dtype=dtype)
    same(lambda b: torch.special.zeta(3.0, b), q, dtype=dtype)


def test_zeta_of_bools_and_integers():
    a, b = torch.tensor([False, True, False, True]), torch.tensor([False, False, True, True])
    same(torch.special.zeta, a, b, dtype=torch.float32)
    same(torch.special.zeta, torch.tensor([2, 3, 4]), torch.tensor([1, 5, -2]), dtype=torch.float32)


BESSEL_ARGS = [
    -30.0,
    -5.0,
    -4.99,
    -1.0,
    -1e-6,
    0.0,
    1e-6,
    0.3,
    1.0,
    2.0,
    2.5,
    4.0,
    4.99,
    5.0,
    5.01,
    7.9,
    8.0,
    8.1,
    20.0,
    100.0,
    1234.5,
    INF,
    -INF,
    NAN,
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", ["bessel_j0", "bessel_j1", "bessel_y0", "bessel_y1"])
def test_bessel_first_and_second_kind(dtype, name):
    fn = getattr(torch.special, name)
    same(fn, grid(BESSEL_ARGS, dtype), dtype=dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(
    "name",
    [
        "modified_bessel_i0",
        "modified_bessel_i1",
        "modified_bessel_k0",
        "modified_bessel_k1",
        "scaled_modified_bessel_k0",
        "scaled_modified_bessel_k1",
    ],
)
def test_modified_bessel(dtype, name):
    fn = getattr(torch.special, name)
    # Stay below exp overflow for I (float32 overflows past ~88).
    x = grid([v for v in BESSEL_ARGS if abs(v) < 80], dtype)
    same(fn, x, dtype=dtype)


@pytest.mark.parametrize("dtype", FLOATS)
def test_airy_ai_regimes(dtype):
    x = grid(
        [
            -200.0,
            -20.0,
            -2.1,
            -2.09,
            -2.0,
            -1.0,
            0.0,
            0.5,
            2.0,
            2.09,
            2.1,
            5.0,
            8.32,
            8.33,
            50.0,
            103.0,
            104.0,
            INF,
            -INF,
            NAN,
        ],
        dtype,
    )
    same(torch.special.airy_ai, x, dtype=dtype)


@pytest.mark.parametrize("dtype", FLOATS)
def test_airy_ai_far_left_keeps_pytorch_phase_rounding(dtype):
    # sin((2/3)|x|^1.5 + pi/4): an ulp in the phase moves the value by ~1e-4 here.
    x = grid(
        [-174.107666015625, -577.128662109375, -1382.5277099609375, -8210.1806640625, -4.7039751e7],
        dtype,
    )
    same(torch.special.airy_ai, x, dtype=dtype)


@pytest.mark.parametrize("dtype", FLOATS)
def test_spherical_bessel_j0(dtype):
    x = grid([-INF, -10.0, -0.5, -0.49, -1e-3, 0.0, 0.3, 0.5, 3.0, 1e4, INF, NAN], dtype)
    same(torch.special.spherical_bessel_j0, x, dtype=dtype)


@pytest.mark.parametrize(
    "name",
    [
        "bessel_j0",
        "bessel_j1",
        "bessel_y0",
        "bessel_y1",
        "modified_bessel_k0",
        "modified_bessel_k1",
        "scaled_modified_bessel_k0",
        "scaled_modified_bessel_k1",
        "airy_ai",
        "spherical_bessel_j0",
        "modified_bessel_i0",
    ],
)
def test_integer_and_bool_inputs_become_float32(name):
    fn = getattr(torch.special, name)
    same(fn, torch.tensor([-3, 0, 1, 2, 5, 9]), dtype=torch.float32)
    same(fn, torch.tensor([False, True]), dtype=torch.float32)


def test_bfloat16_is_computed_in_float32():
    x = torch.tensor([-2.5, 0.5, 1.0, 3.0, 7.0], dtype=torch.bfloat16)
    for fn in (torch.digamma, lambda t: torch.polygamma(1, t), lambda t: torch.polygamma(2, t)):
        check(fn, x, atol=1e-2, rtol=1.6e-2)


@pytest.mark.parametrize("dtype", FLOATS)
def test_polygamma_high_order_overflows_like_pytorch(dtype):
    # n! overflows float32 from n = 35 (PyTorch then gives +-inf even where zeta is tiny).
    x = grid([0.5, 3.0, 5.0, 40.0], dtype)
    for n in (20, 36, 171):
        same(lambda t, n=n: torch.polygamma(n, t), x, dtype=dtype)
