"""Pointwise ops: arithmetic, comparisons, math functions.

Every lowering declares PyTorch's type promotion in its stanza (``@lowering(op, promote=...,
args=...)``); the body then sees its tensors (and Python scalars) already in the computation
dtype. Where PyTorch's semantics differ
from jnp's (floor division, remainder, integer powers, rounding with decimals, xlogy at 0, ...)
the body spells out PyTorch's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from torchlax_core import check

from .. import _aten
from .._promotion import Promotion, declared, elementwise, opmath_dtype
from .._table import lowering, named, named_lowering, op_name
from ._common import _scalar_name

aten = _aten.aten  # (an op this torch lacks: a Missing, skipped)

SELF = ("self",)
BINARY = ("self", "other")


def _is_int(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_


def _scaled(other, alpha):
    return other if alpha == 1 else other * alpha


def _check_alpha(op: str, computed, alpha) -> None:
    """PyTorch's alpha rule, on the computation dtype: no float alpha for integral tensors."""
    if isinstance(alpha, float) and (
        jnp.issubdtype(computed.dtype, jnp.integer) or computed.dtype == jnp.bool_
    ):
        raise RuntimeError(
            f"{op}: For integral input tensors, argument alpha must not be a floating point "
            f"number (got alpha={alpha}); pass an integer alpha or floating-point tensors."
        )


# -- arithmetic ---------------------------------------------------------------------------------


@lowering(aten.add.Tensor, aten.add.Scalar, promote=Promotion.DEFAULT, args=BINARY)
def add(self, other, *, alpha=1):
    _check_alpha("aten.add", self, alpha)
    if self.dtype == jnp.bool_:
        return jnp.logical_or(self, other if alpha == 1 else jnp.logical_and(other, bool(alpha)))
    return jnp.add(self, _scaled(other, alpha))


@lowering(aten.sub.Tensor, aten.sub.Scalar, promote=Promotion.DEFAULT, args=BINARY)
def sub(self, other, *, alpha=1):
    _check_alpha("aten.sub", self, alpha)
    return jnp.subtract(self, _scaled(other, alpha))


@lowering(aten.rsub.Tensor, aten.rsub.Scalar, promote=Promotion.DEFAULT, args=BINARY)
def rsub(self, other, *, alpha=1):
    return jnp.subtract(other, _scaled(self, alpha))


@lowering(aten.mul.Tensor, aten.mul.Scalar, promote=Promotion.DEFAULT, args=BINARY)
def mul(self, other):
    if self.dtype == jnp.bool_:
        return jnp.logical_and(self, other)
    return jnp.multiply(self, other)


@lowering(aten.div.Tensor, aten.div.Scalar, promote=Promotion.INT_TO_FLOAT, args=BINARY)
def div(self, other):
    return jnp.true_divide(self, other)


def _check_int_divisor(a, b) -> None:
    """Integer division (and remainder) by zero raises in PyTorch; floats give inf or NaN.
    ``a`` has the computation dtype (the decorator promoted it)."""
    if not jnp.issubdtype(jnp.result_type(a), jnp.integer):
        return
    check(jnp.all(jnp.asarray(b) != 0), RuntimeError, "ZeroDivisionError")


def _floor_divide(a, b):
    if _is_int(a):
        _check_int_divisor(a, b)
        return jnp.floor_divide(a, b)
    # PyTorch's div_floor: floor of the exact quotient, a / b where b is zero.
    mod = jnp.fmod(a, b)
    quotient = (a - mod) / b
    quotient = jnp.where((mod != 0) & ((b < 0) != (mod < 0)), quotient - 1, quotient)
    floored = jnp.floor(quotient)
    floored = jnp.where(quotient - floored > 0.5, floored + 1, floored)
    floored = jnp.where(quotient == 0, jnp.copysign(jnp.zeros_like(quotient), a / b), floored)
    return jnp.where(b == 0, a / b, floored)


def _trunc_divide(a, b):
    if _is_int(a):
        _check_int_divisor(a, b)
        return lax.div(*jnp.broadcast_arrays(a, b))  # C division truncates toward zero
    return jnp.trunc(a / b)


def _rounding_divide(self, other, *, rounding_mode):
    return (_floor_divide if rounding_mode == "floor" else _trunc_divide)(self, other)


# With a rounding mode div promotes as add does (true division promotes ints to float): a
# helper promoting div's own schema arguments.
_rounding_div = declared(aten.div.Tensor_mode, _rounding_divide, Promotion.DEFAULT, BINARY, False)


@lowering(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(self, other, *, rounding_mode=None):
    if rounding_mode not in (None, "trunc", "floor"):
        # Checked before any computing, as PyTorch does (else any other string meant trunc).
        raise RuntimeError(
            "div expected rounding_mode to be one of None, 'trunc', or 'floor' but found "
            f"'{rounding_mode}' (torch.div); pass one of those."
        )
    if rounding_mode is None:
        return div(self, other)
    return _rounding_div(self, other, rounding_mode=rounding_mode)


# floor_divide_.Tensor has no functional twin of the same overload name; lower it directly
# (the core writes the result into ``self``).
@lowering(
    aten.floor_divide.default,
    aten.floor_divide.Scalar,
    aten.floor_divide_.Tensor,
    promote=Promotion.DEFAULT,
    args=BINARY,
)
def floor_divide(self, other):
    return _floor_divide(self, other)


def _remainder(a, b):
    # PyTorch (and Python): the result takes the divisor's sign.
    _check_int_divisor(a, b)
    mod = jnp.fmod(a, b)
    wrong_sign = (mod != 0) & ((b < 0) != (mod < 0))
    return jnp.where(wrong_sign, mod + b, mod)


@lowering(aten.remainder.Tensor, aten.remainder.Scalar, promote=Promotion.DEFAULT, args=BINARY)
def remainder(self, other):
    return _remainder(self, other)


@lowering(aten.remainder.Scalar_Tensor, promote=Promotion.DEFAULT, args=BINARY)
def remainder_scalar_tensor(self, other):
    return _remainder(self, other)


@lowering(aten.fmod.Tensor, aten.fmod.Scalar, promote=Promotion.DEFAULT, args=BINARY)
def fmod(self, other):
    _check_int_divisor(self, other)
    return jnp.fmod(self, other)


# jnp.power reads a concrete 0-d integer exponent on the host (to choose lax.integer_pow); under
# jit it never does. The op cache's probe counts such a read as "reads values on the host" and
# would never cache pow again, for any signature: an array exponent goes through jit instead.
_array_power = jax.jit(jnp.power)


def _power(base, exponent):
    if jnp.issubdtype(base.dtype, jnp.integer):
        # Integer powers with negative exponents: 1 and -1 stay, every other base gives 0.
        safe = _array_power(base, jnp.maximum(exponent, 0))
        odd = (exponent % 2) != 0
        negative = jnp.where(base == 1, 1, jnp.where(base == -1, jnp.where(odd, -1, 1), 0))
        return jnp.where(exponent < 0, negative.astype(base.dtype), safe)
    if base.dtype == jnp.bool_:
        return jnp.logical_or(jnp.logical_not(exponent), base)
    return jnp.power(base, exponent)


@lowering(aten.pow.Tensor_Tensor, promote=Promotion.BOOL_TO_LONG, args=("self", "exponent"))
def power(self, exponent):
    return _power(self, exponent)


_promoted_power = declared(
    aten.pow.Tensor_Scalar, _power, Promotion.BOOL_TO_LONG, ("self", "exponent"), False
)


@lowering(aten.pow.Tensor_Scalar)
def power_scalar_exponent(self, exponent):
    # An integral tensor to a Python int: the exponent is part of the op's signature, so it stays
    # a static Python number (lax.integer_pow, no host read); PyTorch refuses negative ones.
    if _is_int(self) and isinstance(exponent, int) and not isinstance(exponent, bool):
        if exponent < 0:
            raise RuntimeError(
                f"aten.pow: Integers to negative integer powers are not allowed (a {self.dtype} "
                f"tensor to the power {exponent}); use a floating-point tensor or exponent, "
                f"e.g. x.double() ** {exponent}."
            )
        return lax.integer_pow(
            self if self.dtype != jnp.bool_ else self.astype(jnp.int64), exponent
        )
    return _promoted_power(self, exponent)


@lowering(aten.pow.Scalar, promote=Promotion.BOOL_TO_LONG, args=("self", "exponent"))
def pow_scalar(self, exponent):
    return _power(self, exponent)


@lowering(aten.float_power.Tensor_Tensor, aten.float_power.Tensor_Scalar, aten.float_power.Scalar)
def float_power(self, exponent):
    # float_power computes in double (complex double) whatever its inputs.
    base = jnp.asarray(self, dtype=jnp.float64)
    return jnp.power(base, jnp.asarray(exponent, dtype=jnp.float64))


@lowering(aten.neg.default, promote=Promotion.DEFAULT, args=SELF)
def neg(self):
    return jnp.negative(self)


@lowering(aten.abs.default, promote=Promotion.COMPLEX_TO_FLOAT, args=SELF)
def absolute(self):
    return self if self.dtype == jnp.bool_ else jnp.abs(self)


@lowering(aten.reciprocal.default, promote=Promotion.INT_TO_FLOAT, args=SELF)
def reciprocal(self):
    return 1 / self


# conj_physical conjugates complex values: lowered with the complex ops in fft.py.
@lowering(aten.positive.default, aten.resolve_conj.default, aten.resolve_neg.default)
def positive(self):
    return self


@lowering(aten.sign.default, aten.sgn.default, promote=Promotion.DEFAULT, args=SELF)
def sign(self):
    return self if self.dtype == jnp.bool_ else jnp.sign(self)


@lowering(aten.signbit.default, promote=Promotion.ALWAYS_BOOL, args=SELF)
def signbit(self):
    return jnp.signbit(self) if not _is_int(self) else self < 0


@lowering(aten.addcmul.default, promote=Promotion.DEFAULT, args=("self", "tensor1", "tensor2"))
def addcmul(self, tensor1, tensor2, *, value=1):
    return self + _scaled(tensor1 * tensor2, value)


def _add_quotient(self, tensor1, tensor2, *, value=1):
    return self + _scaled(tensor1 / tensor2, value)


# Promoted after addcdiv's check of the unpromoted dtypes.
_addcdiv = declared(aten.addcdiv.default, _add_quotient, Promotion.DEFAULT, None, False)


@lowering(aten.addcdiv.default)
def addcdiv(self, tensor1, tensor2, *, value=1):
    # Checked on the inputs' own dtypes, before promotion, as PyTorch checks them.
    if not any(jnp.issubdtype(t.dtype, jnp.inexact) for t in (tensor1, tensor2)):
        raise RuntimeError(
            "Integer division with addcdiv is no longer supported (torch.addcdiv): compute "
            "(input + value * torch.trunc(tensor1 / tensor2)).to(input.dtype) for integer "
            "inputs, or pass floating-point tensor1 and tensor2."
        )
    return _addcdiv(self, tensor1, tensor2, value=value)


# ATen's names in lerp's messages: ScalarType names of the integral types (_scalar_name), C++
# type names of the floating ones.
_CPP_TYPE_NAMES = {"float32": "float", "float64": "double", "float16": "c10::Half"}
_CPP_TYPE_NAMES |= {"bfloat16": "c10::BFloat16", "complex64": "c10::complex<float>"}
_CPP_TYPE_NAMES |= {"complex128": "c10::complex<double>"}


@lowering(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(self, end, weight):
    # No promotion in PyTorch: end, and weight unless 0-d, must have self's floating dtype.
    if not jnp.issubdtype(self.dtype, jnp.inexact):
        kernel = "lerp_kernel_tensor" if isinstance(weight, jax.Array) else "lerp_kernel_scalar"
        name = _scalar_name(self.dtype)
        raise NotImplementedError(
            f"\"{kernel}\" not implemented for '{name}' (torch.lerp); convert the inputs to a "
            "floating dtype first."
        )
    for name, other in (("end", end), ("weight", weight)):
        needs_same = isinstance(other, jax.Array) and (name == "end" or other.ndim > 0)
        if needs_same and other.dtype != self.dtype:
            raise RuntimeError(
                f"expected dtype {_CPP_TYPE_NAMES[self.dtype.name]} for `{name}` but got dtype "
                f"{_CPP_TYPE_NAMES.get(other.dtype.name, other.dtype.name)} (torch.lerp); "
                "convert it with .to(input.dtype)."
            )
    # Not opmath=True: the dtype checks above read the arguments' own dtypes.
    compute = opmath_dtype(self.dtype)
    start, end, weight = self.astype(compute), end.astype(compute), jnp.asarray(weight, compute)
    # PyTorch's formula: exact at both ends.
    diff = end - start
    result = jnp.where(jnp.abs(weight) < 0.5, start + weight * diff, end - diff * (1 - weight))
    return result.astype(self.dtype)


@named_lowering("prims::fma")
@elementwise(("a", "b", "c"), Promotion.DEFAULT)
def fma(a, b, c):
    # Dynamo writes add_(x, alpha=<tensor>) and addcmul_(..., value=...) as this inductor prim
    # (torch._inductor.inductor_prims.fma): a * b + c without rounding the product. Below
    # float64 the float64 product is exact, so that sum rounds once.
    if jnp.issubdtype(a.dtype, jnp.floating) and jnp.finfo(a.dtype).bits < 64:
        wide = jnp.float64
        return (a.astype(wide) * b.astype(wide) + c.astype(wide)).astype(a.dtype)
    return a * b + c


# -- rounding -----------------------------------------------------------------------------------


def _integral_or(op, fn):
    def apply(self):
        return self if _is_int(self) else fn(self)

    return named(op_name(op), apply)


for _op, _fn in {
    aten.floor.default: jnp.floor,
    aten.ceil.default: jnp.ceil,
    aten.trunc.default: jnp.trunc,
    aten.round.default: jnp.round,  # half to even, as PyTorch's nearbyint
}.items():
    lowering(_op, promote=Promotion.DEFAULT, args=SELF)(_integral_or(_op, _fn))


@lowering(aten.round.decimals, promote=Promotion.DEFAULT, args=SELF)
def round_decimals(self, *, decimals=0):
    if _is_int(self):
        return self
    scale = 10.0 ** abs(decimals)
    if decimals < 0:
        return jnp.round(self / scale) * scale
    return jnp.round(self * scale) / scale


@lowering(aten.frac.default, promote=Promotion.DEFAULT, args=SELF)
def frac(self):
    return self - jnp.trunc(self)


# -- unary math ---------------------------------------------------------------------------------


def _sinc(x):
    pix = jnp.pi * x
    return jnp.where(x == 0, jnp.ones_like(x), jnp.sin(pix) / jnp.where(x == 0, 1, pix))


def _angle(x):
    return jnp.where(jnp.isnan(x), x, jnp.where(x < 0, jnp.pi, 0.0).astype(x.dtype))


_INT_TO_FLOAT_UNARY = {
    aten.exp.default: jnp.exp,
    aten.exp2.default: jnp.exp2,
    aten.expm1.default: jnp.expm1,
    aten.log.default: jnp.log,
    aten.log2.default: jnp.log2,
    aten.log10.default: jnp.log10,
    aten.log1p.default: jnp.log1p,
    aten.sqrt.default: jnp.sqrt,
    aten.rsqrt.default: lax.rsqrt,
    aten.sin.default: jnp.sin,
    aten.cos.default: jnp.cos,
    aten.tan.default: jnp.tan,
    aten.asin.default: jnp.arcsin,
    aten.acos.default: jnp.arccos,
    aten.atan.default: jnp.arctan,
    aten.sinh.default: jnp.sinh,
    aten.cosh.default: jnp.cosh,
    aten.tanh.default: jnp.tanh,
    aten.asinh.default: jnp.arcsinh,
    aten.acosh.default: jnp.arccosh,
    aten.atanh.default: jnp.arctanh,
    aten.erf.default: lax.erf,
    aten.erfc.default: lax.erfc,
    aten.erfinv.default: lax.erf_inv,
    aten.sigmoid.default: jax.nn.sigmoid,
    aten.lgamma.default: lax.lgamma,
    aten.sinc.default: _sinc,
    aten.deg2rad.default: jnp.deg2rad,
    aten.rad2deg.default: jnp.rad2deg,
    aten.angle.default: _angle,
}


def _float_unary(op, fn):
    def apply(self):
        return fn(self)

    return named(op_name(op), apply)


for _op, _fn in _INT_TO_FLOAT_UNARY.items():
    lowering(_op, promote=Promotion.INT_TO_FLOAT, args=SELF)(_float_unary(_op, _fn))


@lowering(aten.logit.default, promote=Promotion.INT_TO_FLOAT, args=SELF)
def logit(self, eps=None):
    x = self if eps is None else jnp.clip(self, eps, 1 - eps)
    return jnp.log(x / (1 - x))


@lowering(aten.nan_to_num.default, promote=Promotion.DEFAULT, args=SELF)
def nan_to_num(self, nan=None, posinf=None, neginf=None):
    if _is_int(self):
        return self
    return jnp.nan_to_num(self, nan=0.0 if nan is None else nan, posinf=posinf, neginf=neginf)


# -- binary math --------------------------------------------------------------------------------


@lowering(aten.atan2.default, promote=Promotion.INT_TO_FLOAT, args=BINARY)
def atan2(self, other):
    return jnp.arctan2(self, other)


@lowering(aten.hypot.default, promote=Promotion.DEFAULT, args=BINARY)
def hypot(self, other):
    return jnp.hypot(self, other)


@lowering(aten.copysign.Tensor, aten.copysign.Scalar, promote=Promotion.INT_TO_FLOAT, args=BINARY)
def copysign(self, other):
    return jnp.copysign(self, other)


@lowering(aten.nextafter.default, promote=Promotion.NO_OPMATH, args=BINARY)
def nextafter(self, other):
    return jnp.nextafter(self, other)


@lowering(aten.logaddexp.default, promote=Promotion.DEFAULT, args=BINARY)
def logaddexp(self, other):
    return jnp.logaddexp(self, other)


@lowering(aten.logaddexp2.default, promote=Promotion.DEFAULT, args=BINARY)
def logaddexp2(self, other):
    return jnp.logaddexp2(self, other)


def _xlogy(x, y):
    # PyTorch: nan where y is nan, 0 where x == 0, else x * log(y).
    result = jnp.where(x == 0, jnp.zeros_like(x), x * jnp.log(y))
    return jnp.where(jnp.isnan(y), y, result)


@lowering(
    aten.xlogy.Tensor,
    aten.xlogy.Scalar_Other,
    aten.xlogy.Scalar_Self,
    aten.special_xlogy.default,
    promote=Promotion.INT_TO_FLOAT,
    args=BINARY,
)
def xlogy(self, other):
    return _xlogy(self, other)


@lowering(
    aten.special_xlog1py.default,
    aten.special_xlog1py.self_scalar,
    aten.special_xlog1py.other_scalar,
    promote=Promotion.INT_TO_FLOAT,
    args=BINARY,
)
def xlog1py(self, other):
    result = jnp.where(self == 0, jnp.zeros_like(self), self * jnp.log1p(other))
    return jnp.where(jnp.isnan(other), other, result)


@lowering(aten.heaviside.default, promote=Promotion.DEFAULT, args=("self", "values"))
def heaviside(self, values):
    if jnp.iscomplexobj(self):  # promoted: either argument complex
        raise RuntimeError("heaviside is not yet implemented for complex tensors.")
    return jnp.where(self == 0, values, (self > 0).astype(self.dtype))


@lowering(aten.gcd.default, promote=Promotion.DEFAULT, args=BINARY)
def gcd(self, other):
    return jnp.gcd(self, other)


@lowering(aten.lcm.default, promote=Promotion.DEFAULT, args=BINARY)
def lcm(self, other):
    return jnp.lcm(self, other)


@lowering(aten.maximum.default, promote=Promotion.DEFAULT, args=BINARY)
def maximum(self, other):
    return jnp.maximum(self, other)


@lowering(aten.minimum.default, promote=Promotion.DEFAULT, args=BINARY)
def minimum(self, other):
    return jnp.minimum(self, other)


@lowering(aten.fmax.default, promote=Promotion.DEFAULT, args=BINARY)
def fmax(self, other):
    return jnp.fmax(self, other)


@lowering(aten.fmin.default, promote=Promotion.DEFAULT, args=BINARY)
def fmin(self, other):
    return jnp.fmin(self, other)


@lowering(aten.frexp.Tensor)
def frexp(self):
    mantissa, exponent = jnp.frexp(self)
    return mantissa.astype(self.dtype), exponent.astype(jnp.int32)


@lowering(aten.ldexp.Tensor, promote=Promotion.INT_TO_FLOAT, args=BINARY)
def ldexp(self, other):
    return self * jnp.exp2(other)


# -- clamping -----------------------------------------------------------------------------------


def _refuse_complex(promoted) -> None:
    """Complex numbers have no order. A complex ``self`` is refused by the dtype table (with
    PyTorch's own message); this catches a real ``self`` whose complex bound promoted it."""
    if jnp.iscomplexobj(promoted):
        raise NotImplementedError(
            "clamp is not supported for complex types; clamp the real and imaginary parts "
            "separately (torch.complex(x.real.clamp(...), x.imag.clamp(...)))."
        )


def _require_a_bound(lo, hi) -> None:
    if lo is None and hi is None:
        raise RuntimeError(
            "torch.clamp: At least one of 'min' or 'max' must not be None; pass min=, max= or both."
        )


def _clamp(x, lo, hi):
    _refuse_complex(x)
    if lo is not None:
        x = jnp.maximum(x, lo)
    if hi is not None:
        x = jnp.minimum(x, hi)
    return x


@lowering(
    aten.clamp.default, aten.clamp.Tensor, promote=Promotion.DEFAULT, args=("self", "min", "max")
)
def clamp(self, min=None, max=None):
    _require_a_bound(min, max)
    return _clamp(self, min, max)


@lowering(
    aten.clip.default, aten.clip.Tensor, promote=Promotion.DEFAULT, args=("self", "min", "max")
)
def clip(self, min=None, max=None):
    _require_a_bound(min, max)
    return _clamp(self, min, max)


@lowering(
    aten.clamp_min.default, aten.clamp_min.Tensor, promote=Promotion.DEFAULT, args=("self", "min")
)
def clamp_min(self, min):
    _refuse_complex(self)
    return jnp.maximum(self, min)


@lowering(
    aten.clamp_max.default, aten.clamp_max.Tensor, promote=Promotion.DEFAULT, args=("self", "max")
)
def clamp_max(self, max):
    _refuse_complex(self)
    return jnp.minimum(self, max)


# -- comparisons and predicates -----------------------------------------------------------------


def _binary(op, fn):
    def apply(self, other):
        return fn(self, other)

    return named(op_name(op), apply)


for _op, _fn in {
    aten.eq: jnp.equal,
    aten.ne: jnp.not_equal,
    aten.lt: jnp.less,
    aten.le: jnp.less_equal,
    aten.gt: jnp.greater,
    aten.ge: jnp.greater_equal,
}.items():
    lowering(_op.Tensor, _op.Scalar, promote=Promotion.ALWAYS_BOOL, args=BINARY)(_binary(_op, _fn))


def _logical(op, fn):
    def apply(self, other):
        return fn(self != 0, other != 0)

    return named(op_name(op), apply)


for _op, _fn in {
    aten.logical_and.default: jnp.logical_and,
    aten.logical_or.default: jnp.logical_or,
    aten.logical_xor.default: jnp.logical_xor,
}.items():
    lowering(_op)(_logical(_op, _fn))


@lowering(aten.logical_not.default)
def logical_not(self):
    return self == 0


def _float_predicate(op, fn):
    def apply(self):
        return jnp.zeros(self.shape, jnp.bool_) if _is_int(self) else fn(self)

    return named(op_name(op), apply)


for _op, _fn in {
    aten.isnan.default: jnp.isnan,
    aten.isinf.default: jnp.isinf,
    aten.isposinf.default: jnp.isposinf,
    aten.isneginf.default: jnp.isneginf,
    aten.isfinite.default: jnp.isfinite,
}.items():
    lowering(_op)(_float_predicate(_op, _fn))


# -- bitwise ------------------------------------------------------------------------------------

for _op, _fn in {
    aten.bitwise_and: jnp.bitwise_and,
    aten.bitwise_or: jnp.bitwise_or,
    aten.bitwise_xor: jnp.bitwise_xor,
}.items():
    lowering(_op.Tensor, _op.Scalar, _op.Scalar_Tensor, promote=Promotion.DEFAULT, args=BINARY)(
        _binary(_op, _fn)
    )


@lowering(aten.bitwise_not.default, promote=Promotion.DEFAULT, args=SELF)
def bitwise_not(self):
    return jnp.logical_not(self) if self.dtype == jnp.bool_ else jnp.invert(self)


@lowering(
    aten.bitwise_left_shift.Tensor,
    aten.bitwise_left_shift.Tensor_Scalar,
    aten.bitwise_left_shift.Scalar_Tensor,
    aten.__lshift__.Tensor,
    aten.__lshift__.Scalar,
    promote=Promotion.DEFAULT,
    args=BINARY,
)
def bitwise_left_shift(self, other):
    # PyTorch: shifting by a negative amount or by the bit width or more gives 0.
    bits = jnp.iinfo(self.dtype).bits
    out_of_range = (other < 0) | (other >= bits)
    shifted = lax.shift_left(*jnp.broadcast_arrays(self, jnp.clip(other, 0, bits - 1)))
    return jnp.where(out_of_range, jnp.zeros_like(self), shifted)


@lowering(
    aten.bitwise_right_shift.Tensor,
    aten.bitwise_right_shift.Tensor_Scalar,
    aten.bitwise_right_shift.Scalar_Tensor,
    aten.__rshift__.Tensor,
    aten.__rshift__.Scalar,
    promote=Promotion.DEFAULT,
    args=BINARY,
)
def bitwise_right_shift(self, other):
    bits = jnp.iinfo(self.dtype).bits
    out_of_range = (other < 0) | (other >= bits)
    value, shift = jnp.broadcast_arrays(self, jnp.where(out_of_range, bits - 1, other))
    if jnp.issubdtype(self.dtype, jnp.unsignedinteger):
        return jnp.where(out_of_range, jnp.zeros_like(value), lax.shift_right_logical(value, shift))
    return lax.shift_right_arithmetic(value, shift)


# -- orthogonal polynomials ---------------------------------------------------------------------
# PyTorch evaluates P_n(x) by the three-term recurrence, with closed forms at x = +-1 and (for
# Chebyshev) a trigonometric form for large n inside (-1, 1). The recurrence runs to the largest
# n present, each element keeping its own P_n: one while loop, jit-friendly.


def _recurrence(x, n, p0, p1, step):
    """P_n(x) from P_0 = p0, P_1 = p1 and P_{k+1} = step(k, x, P_k, P_{k-1})."""
    top = jnp.max(n, initial=1)

    def body(k, state):
        prev, cur = state
        nxt = step(k, x, cur, prev)
        keep = k + 1 <= n
        return jnp.where(keep, cur, prev), jnp.where(keep, nxt, cur)

    _, last = lax.fori_loop(1, top, body, (p0, p1))
    return jnp.where(n == 0, p0, jnp.where(n < 0, jnp.zeros_like(x), last))


def _orders(x, n):
    x, n = jnp.broadcast_arrays(x, n)
    return x, jnp.trunc(n).astype(jnp.int64) if not _is_int(n) else n.astype(jnp.int64)


def _chebyshev(kind, x, n):
    x, n = _orders(x, n)
    one = jnp.ones_like(x)
    first = {"t": x, "u": x + x, "v": x + x - 1, "w": x + x + 1}[kind]
    value = _recurrence(x, n, one, first, lambda k, x, cur, prev: (x + x) * cur - prev)
    nf = n.astype(x.dtype)
    odd = (n % 2) != 0
    theta = jnp.arccos(jnp.clip(x, -1, 1))
    inside = jnp.abs(x) < 1
    if kind == "t":
        at_one = jnp.where((x > 0) | ~odd, one, -one)
        trig, limit = jnp.cos(nf * theta), 6
    elif kind == "u":
        at_one = jnp.where((x > 0) | ~odd, nf + 1, -(nf + 1))
        s = jnp.sin(theta)
        trig = jnp.where(
            s != 0,
            jnp.sin((nf + 1) * theta) / jnp.where(s != 0, s, 1),
            (nf + 1) * jnp.cos((nf + 1) * theta) / x,
        )
        limit = 8
    elif kind == "v":
        at_one = jnp.where(x > 0, one, jnp.where(~odd, nf + nf + 1, -(nf + nf + 1)))
        c = jnp.cos(theta / 2)
        trig = jnp.where(
            jnp.sin(theta / 2) != 1,
            jnp.cos((nf + 0.5) * theta) / c,
            jnp.where(~odd, nf + nf + 1, -(nf + nf + 1)),
        )
        limit = 8
    else:
        at_one = jnp.where(x > 0, nf + nf + 1, jnp.where(~odd, one, -one))
        s = jnp.sin(theta / 2)
        trig = jnp.where(
            jnp.cos(theta / 2) != 1,
            jnp.sin((nf + 0.5) * theta) / s,
            jnp.where(x > 0, nf + nf + 1, jnp.where(~odd, one, -one)),
        )
        limit = 8
    value = jnp.where((n > limit) & inside, trig, value)
    value = jnp.where(jnp.abs(x) == 1, at_one, value)
    return jnp.where(n < 0, jnp.zeros_like(x), value)


def _register_polynomial(names, fn):
    ops = []
    for name in names:
        packet = getattr(aten, name)
        ops += [packet.default, packet.x_scalar, packet.n_scalar]
    lowering(*ops, promote=Promotion.INT_TO_FLOAT, args=("x", "n"))(fn)


def _chebyshev_lowering(kind, shifted):
    def apply(x, n):
        return _chebyshev(kind, x + x - 1 if shifted else x, n)

    shift = "shifted_" if shifted else ""
    return named(f"special_{shift}chebyshev_polynomial_{kind}", apply)


for _kind in "tuvw":
    for _shifted in (False, True):
        _chebyshev_op = _chebyshev_lowering(_kind, _shifted)
        _register_polynomial([_chebyshev_op.__name__], _chebyshev_op)


def _hermite_h(x, n):
    x, n = _orders(x, n)
    return _recurrence(
        x, n, jnp.ones_like(x), x + x, lambda k, x, cur, prev: (x + x) * cur - (2 * k) * prev
    )


def _hermite_he(x, n):
    x, n = _orders(x, n)
    return _recurrence(x, n, jnp.ones_like(x), x, lambda k, x, cur, prev: x * cur - k * prev)


def _laguerre_l(x, n):
    x, n = _orders(x, n)
    value = _recurrence(
        x,
        n,
        jnp.ones_like(x),
        1 - x,
        lambda k, x, cur, prev: ((k + k + (1 - x)) * cur - k * prev) / (k + 1),
    )
    return jnp.where((x == 0) & (n >= 0), jnp.ones_like(x), value)


def _legendre_p(x, n):
    x, n = _orders(x, n)
    value = _recurrence(
        x,
        n,
        jnp.ones_like(x),
        x,
        lambda k, x, cur, prev: ((k + k + 1) * x * cur - k * prev) / (k + 1),
    )
    at_one = jnp.where((x > 0) | (n % 2 == 0), 1.0, -1.0).astype(x.dtype)
    return jnp.where((jnp.abs(x) == 1) & (n >= 0), at_one, value)


_register_polynomial(["special_hermite_polynomial_h"], _hermite_h)
_register_polynomial(["special_hermite_polynomial_he"], _hermite_he)
_register_polynomial(["special_laguerre_polynomial_l"], _laguerre_l)
_register_polynomial(["special_legendre_polynomial_p"], _legendre_p)


# -- whole-tensor comparisons -------------------------------------------------------------------


@lowering(aten.equal.default)
def equal(self, other):
    # Returns a Python bool, so it reads the device: eager only (under jit, compare with eq).
    return tuple(self.shape) == tuple(other.shape) and bool(jnp.array_equal(self, other))


@lowering(aten.allclose.default)
def allclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    return bool(jnp.allclose(self, other, rtol=rtol, atol=atol, equal_nan=equal_nan))


def _isin_unsupported_type(argument) -> str | None:
    """PyTorch's name of ``argument``'s dtype if isin refuses it (bools, complex numbers: its CPU
    kernel sorts), else None; a Python number counts as PyTorch wraps it (``1j``: ComplexDouble)."""
    if isinstance(argument, bool):
        return "Bool"
    if isinstance(argument, complex):
        return "ComplexDouble"
    dtype = getattr(argument, "dtype", None)
    if dtype is not None and (dtype == jnp.bool_ or jnp.issubdtype(dtype, jnp.complexfloating)):
        return _scalar_name(dtype)
    return None


def _isin_of_common_dtype(elements, test_elements, *, assume_unique=False, invert=False):
    return jnp.isin(elements, test_elements, invert=invert)


# Promoted as PyTorch promotes (the three overloads share their arguments' positions), after the
# check below: promotion would hide a bool argument next to an integer one.
_isin_promoted = declared(
    aten.isin.Tensor_Tensor, _isin_of_common_dtype, Promotion.ALWAYS_BOOL, None, False
)


@lowering(aten.isin.Tensor_Tensor, aten.isin.Tensor_Scalar, aten.isin.Scalar_Tensor)
def isin(elements, test_elements, *, assume_unique=False, invert=False):
    for argument in (elements, test_elements):  # PyTorch's CPU kernel checks elements first
        unsupported = _isin_unsupported_type(argument)
        if unsupported:
            raise RuntimeError(f"Unsupported input type encountered for isin(): {unsupported}")
    return _isin_promoted(elements, test_elements, assume_unique=assume_unique, invert=invert)
