"""Pointwise semantics where PyTorch and jnp part ways, checked against eager PyTorch on CPU."""

from __future__ import annotations

import math

import pytest
import torch
import torchlax_core


def jx(t: torch.Tensor) -> torch.Tensor:
    with torchlax_core.enable():
        return t.to("jax")


def same(actual, expected, **kw):
    assert isinstance(actual, torchlax_core.Tensor), type(actual)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual.cpu(), expected, equal_nan=True, **kw)


INTS = torch.tensor([7, -7, 7, -7, 0, 1, -1, 9], dtype=torch.int64)
INT_DIVISORS = torch.tensor([2, 2, -2, -2, 3, -5, 5, 3], dtype=torch.int64)
FLOATS = torch.tensor(
    [7.5, -7.5, 7.5, -7.5, 0.0, -0.0, 1.0, -1.0, math.inf, -math.inf, math.nan, 5.0]
)
FLOAT_DIVISORS = torch.tensor([2.0, 2.0, -2.0, -2.0, 3.0, 3.0, 0.0, 0.0, 2.0, 0.0, 1.0, math.inf])


@pytest.mark.parametrize("mode", [None, "trunc", "floor"])
def test_integer_division_rounding(mode):
    same(
        torch.div(jx(INTS), jx(INT_DIVISORS), rounding_mode=mode),
        torch.div(INTS, INT_DIVISORS, rounding_mode=mode),
    )


@pytest.mark.parametrize("mode", [None, "trunc", "floor"])
def test_float_division_rounding_with_zero_nan_inf(mode):
    same(
        torch.div(jx(FLOATS), jx(FLOAT_DIVISORS), rounding_mode=mode),
        torch.div(FLOATS, FLOAT_DIVISORS, rounding_mode=mode),
    )


def test_floor_divide_and_python_scalar():
    same(jx(INTS) // 3, INTS // 3)
    same(jx(FLOATS) // -2.0, FLOATS // -2.0)
    same(
        torch.floor_divide(jx(FLOATS), jx(FLOAT_DIVISORS)),
        torch.floor_divide(FLOATS, FLOAT_DIVISORS),
    )


def test_remainder_takes_divisor_sign_and_fmod_dividend_sign():
    same(torch.remainder(jx(INTS), jx(INT_DIVISORS)), torch.remainder(INTS, INT_DIVISORS))
    same(torch.fmod(jx(INTS), jx(INT_DIVISORS)), torch.fmod(INTS, INT_DIVISORS))
    same(torch.remainder(jx(FLOATS), jx(FLOAT_DIVISORS)), torch.remainder(FLOATS, FLOAT_DIVISORS))
    same(torch.fmod(jx(FLOATS), jx(FLOAT_DIVISORS)), torch.fmod(FLOATS, FLOAT_DIVISORS))
    same(jx(INTS) % -3, INTS % -3)
    same(torch.remainder(5, jx(INT_DIVISORS)), torch.remainder(5, INT_DIVISORS))


def test_integer_true_division_is_float():
    same(jx(INTS) / jx(INT_DIVISORS), INTS / INT_DIVISORS)
    same(jx(INTS) / 2, INTS / 2)


def test_integer_power_with_negative_exponents():
    base = torch.tensor([2, -1, -1, 1, 0, 3, -2])
    exponent = torch.tensor([-1, -3, -2, -5, 2, 3, 3])
    same(torch.pow(jx(base), jx(exponent)), torch.pow(base, exponent))
    same(jx(base) ** 2, base**2)
    same(2 ** jx(exponent.abs()), 2 ** exponent.abs())
    same(jx(base) ** 0.5, base**0.5)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool])
def test_integral_tensor_to_a_negative_python_int_raises_as_pytorch(dtype):
    base = torch.tensor([2, 1, 0, 1], dtype=dtype)
    with pytest.raises(RuntimeError, match="Integers to negative integer powers are not allowed"):
        base**-1
    with pytest.raises(RuntimeError, match="Integers to negative integer powers are not allowed"):
        jx(base) ** -1
    same(jx(base) ** 3, base**3)  # (uint8 and int32 wrap as C does; bool computes in int64)
    same(jx(base) ** 0, base**0)


def test_integer_power_of_a_python_int_is_compiled_and_leaves_float_power_compiled():
    """``x_int ** 2`` used to read its exponent on the host (``jnp.power`` of a concrete
    array), which marked ``pow.Tensor_Scalar`` never cacheable: every later ``x ** 2`` of the
    process, float ones too, then ran op by op."""
    env = torchlax_core.Environment()
    env.config.op_cache_size, env.config.op_cache_min_calls = 4096, 2
    env.config.fallback_to_torch = False
    ints, floats = torch.arange(-3, 4), torch.randn(5)
    with torchlax_core.enable(env):
        x_int, x = ints.to("jax"), floats.to("jax")
        with pytest.raises(RuntimeError):
            x_int**-1
        for _ in range(3):  # plain, compile, hit
            same(x_int**2, ints**2)
            same(x_int ** torch.tensor(2).to("jax"), ints ** torch.tensor(2))
        hits = env.stats()["op_cache_hits"]
        for _ in range(3):
            same(x**2, floats**2)
        stats = env.stats()
    assert "aten.pow.Tensor_Scalar" not in stats["op_cache_uncacheable"]
    assert "aten.pow.Tensor_Tensor" not in stats["op_cache_uncacheable"]
    assert stats["op_cache_hits"] - hits == 1


@pytest.mark.parametrize("decimals", [0, 2, -1])
def test_round_half_to_even_and_decimals(decimals):
    x = torch.tensor([0.5, 1.5, 2.5, -0.5, -2.5, 1.2345, 15.0, 25.0, 123.456, math.nan])
    same(torch.round(jx(x), decimals=decimals), torch.round(x, decimals=decimals))


def test_rounding_integers_is_identity():
    for fn in (torch.floor, torch.ceil, torch.trunc, torch.round):
        same(fn(jx(INTS)), fn(INTS))


def test_clamp_promotes_and_propagates_nan():
    x = torch.tensor([-2.0, 0.5, math.nan, 3.0])
    same(torch.clamp(jx(x), -1, 1), torch.clamp(x, -1, 1))
    same(torch.clamp(jx(INTS), 0.5, 3.5), torch.clamp(INTS, 0.5, 3.5))
    same(torch.clamp(jx(x), min=jx(torch.zeros(4))), torch.clamp(x, min=torch.zeros(4)))
    same(torch.clamp(jx(x), 2.0, 1.0), torch.clamp(x, 2.0, 1.0))  # min > max: max wins


def test_maximum_propagates_nan_fmax_ignores_it():
    a = torch.tensor([1.0, math.nan, math.nan, -0.0])
    b = torch.tensor([math.nan, 2.0, math.nan, 0.0])
    for fn in (torch.maximum, torch.minimum, torch.fmax, torch.fmin):
        same(fn(jx(a), jx(b)), fn(a, b))


def test_predicates_on_nan_inf_and_ints():
    x = torch.tensor([1.0, math.nan, math.inf, -math.inf, -0.0])
    for fn in (
        torch.isnan,
        torch.isinf,
        torch.isposinf,
        torch.isneginf,
        torch.isfinite,
        torch.signbit,
        torch.logical_not,
    ):
        same(fn(jx(x)), fn(x))
        same(fn(jx(INTS)), fn(INTS))
    same(torch.nan_to_num(jx(x)), torch.nan_to_num(x))
    same(
        torch.nan_to_num(jx(x), nan=1.0, posinf=2.0, neginf=-2.0),
        torch.nan_to_num(x, nan=1.0, posinf=2.0, neginf=-2.0),
    )


def test_xlogy_zero_and_nan():
    x = torch.tensor([0.0, 0.0, 1.0, 2.0, 0.0])
    y = torch.tensor([0.0, math.nan, 0.0, 3.0, -1.0])
    same(torch.xlogy(jx(x), jx(y)), torch.xlogy(x, y))
    same(torch.special.xlog1py(jx(x), jx(y)), torch.special.xlog1py(x, y))


def test_bitwise_shifts_out_of_range():
    x = torch.tensor([1, -8, 5, 1], dtype=torch.int64)
    s = torch.tensor([3, 1, 64, 70])
    same(jx(x) << jx(s), x << s)
    same(jx(x) >> jx(s), x >> s)
    x32 = torch.tensor([1, -8, 5], dtype=torch.int32)
    same(jx(x32) << 2, x32 << 2)


def test_comparisons_with_scalars_and_zero_dim_cpu_tensor():
    x = torch.tensor([1, 2, 3])
    same(jx(x) > 1.5, x > 1.5)
    same(jx(x) == torch.tensor(2), x == torch.tensor(2))
    same(torch.eq(jx(x.float()), jx(x.double())), torch.eq(x.float(), x.double()))


@pytest.mark.parametrize(
    "a, b",
    [
        (torch.tensor([1, 2], dtype=torch.int32), 2.5),  # int tensor + float scalar -> float32
        (torch.tensor([1, 2], dtype=torch.int64), True),
        (torch.tensor([1.0, 2.0], dtype=torch.bfloat16), 1e3),
        (torch.tensor([True, False]), 3),
        (torch.tensor([1.0, 2.0]), torch.tensor(2.0, dtype=torch.float64)),  # 0-d does not win
        (torch.tensor([1, 2], dtype=torch.int32), torch.tensor(2.5, dtype=torch.float64)),
        (torch.tensor([1, 2], dtype=torch.uint8), torch.tensor(-1, dtype=torch.int64)),
    ],
)
def test_promotion_with_scalars_and_zero_dim_tensors(a, b):
    # b stays a Python scalar or a 0-d CPU tensor: both mix with jax tensors as scalars
    same(jx(a) + b, a + b)
    same(jx(a) * b, a * b)
    same(torch.add(jx(a), b, alpha=2), torch.add(a, b, alpha=2))


def test_bool_arithmetic():
    a = torch.tensor([True, False, True])
    b = torch.tensor([True, True, False])
    same(jx(a) + jx(b), a + b)
    same(jx(a) * jx(b), a * b)
    same(~jx(a), ~a)
    same(jx(a) & jx(b), a & b)


def test_lerp_addcmul_addcdiv():
    a, b, w = torch.randn(5), torch.randn(5), torch.rand(5)
    same(torch.lerp(jx(a), jx(b), jx(w)), torch.lerp(a, b, w))
    same(torch.lerp(jx(a), jx(b), 0.75), torch.lerp(a, b, 0.75))
    same(torch.addcmul(jx(a), jx(b), jx(w), value=0.5), torch.addcmul(a, b, w, value=0.5))
    same(torch.addcdiv(jx(a), jx(b), jx(w + 1), value=-2), torch.addcdiv(a, b, w + 1, value=-2))


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint16, torch.bool])
def test_lerp_of_a_non_float_tensor_raises_pytorchs_error(dtype):
    a = torch.ones(3, dtype=dtype)
    with pytest.raises(NotImplementedError) as expected:
        torch.lerp(a, a, 0.5)
    with pytest.raises(NotImplementedError) as got:
        torch.lerp(jx(a), jx(a), 0.5)
    assert str(got.value).startswith(str(expected.value))  # "... not implemented for 'UInt16'"


def test_unary_math_int_inputs_become_float():
    for fn in (torch.exp, torch.sin, torch.sqrt, torch.sigmoid, torch.erf, torch.log1p):
        same(fn(jx(INTS.abs())), fn(INTS.abs()))


def test_digamma_poles_and_sinc_at_zero():
    x = torch.tensor([0.0, -0.0, 1.0, 2.5])
    same(torch.digamma(jx(x)), torch.digamma(x))
    same(torch.sinc(jx(x)), torch.sinc(x))


def test_in_place_keeps_identity_and_bumps_version():
    x = jx(torch.ones(3))
    before_id, before_version = id(x), x._version
    out = x.add_(jx(torch.full((3,), 2.0)))
    assert out is x and id(x) == before_id
    assert x._version > before_version
    same(x, torch.full((3,), 3.0))
    x.mul_(2).sub_(1)
    same(x, torch.full((3,), 5.0))
    x.clamp_(max=4.0)
    same(x, torch.full((3,), 4.0))


def test_in_place_rejects_a_result_that_cannot_be_cast():
    x = jx(torch.ones(3, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="can't be cast"):
        x.div_(jx(torch.full((3,), 2)))
    x.floor_divide_(jx(torch.full((3,), 2)))
    same(x, torch.zeros(3, dtype=torch.int64))


def test_out_variant_writes_into_given_tensor():
    a, b = torch.randn(4), torch.randn(4)
    out = jx(torch.empty(4))
    result = torch.add(jx(a), jx(b), out=out)
    assert result is out
    same(out, a + b)
    out64 = jx(torch.empty(4, dtype=torch.float64))
    torch.mul(jx(a), jx(b), out=out64)  # float32 result cast into a float64 out
    same(out64, (a * b).double())


def test_method_variants():
    a, b = torch.randn(2, 3), torch.randn(2, 3)
    same(jx(a).add(jx(b), alpha=3), a.add(b, alpha=3))
    same(jx(a).pow(2), a.pow(2))
    same(jx(a).abs().neg(), a.abs().neg())
    same(jx(a).clamp(min=0), a.clamp(min=0))
    same(jx(a).eq(jx(b)), a.eq(b))
    same(jx(a).where(jx(a) > 0, 0.0), a.where(a > 0, 0.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_dynamo_fma_prim_rounds_once(dtype):
    """Dynamo writes add_(x, alpha=<tensor>) and addcmul_(value=...) as inductor's prims.fma."""
    from torch._inductor import inductor_prims  # noqa: F401  (defines torch.ops.prims.fma)

    torch.manual_seed(0)
    a, b, c = (torch.randn(50, dtype=dtype) for _ in range(3))
    lr = torch.tensor(-0.01, dtype=torch.float64)  # a 0-d float64 rate does not promote `a`
    exact = (a.double() * b.double() + c.double()).to(dtype)
    same(torch.ops.prims.fma(jx(a), jx(b), jx(c)), exact, atol=0, rtol=0)
    expected = torch.ops.prims.fma(a, lr, c)
    same(torch.ops.prims.fma(jx(a), jx(lr), jx(c)), expected)


def test_functional_copy_broadcasts_and_casts_into_self():
    self_, src = torch.zeros(2, 3, dtype=torch.int64), torch.tensor([1.7, -2.5, 3.0])
    same(torch.ops.aten.copy.default(jx(self_), jx(src)), torch.ops.aten.copy.default(self_, src))
