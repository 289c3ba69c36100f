"""``torch.linalg.matrix_exp``: PyTorch's optimized Taylor polynomials (Bader-Blanes-Casas 2019)."""

from __future__ import annotations

import jax
import jax.core
import jax.numpy as jnp

from .. import _aten
from .._table import lowering
from .matmul import matmul

aten = _aten.aten  # (an op this torch lacks: a Missing, skipped)


# -- matrix exponential (PyTorch's optimized Taylor polynomials, Bader-Blanes-Casas 2019) ---------
#
# PyTorch picks a Taylor degree (1, 2, 4, 8, 12 or 18) from each matrix's 1-norm, and beyond the
# last bound scales by 2^-s and squares s times. Following the same evaluation scheme (not a Pade
# approximant) keeps float32 results within rounding of PyTorch's, not within its truncation
# error. float32/complex64 use the single-precision bounds, float64/complex128 the double ones.

_EXP_NORM_BOUNDS = {
    "single": (
        1.192092800768788e-07,
        5.978858893805233e-04,
        5.116619363445086e-02,
        5.800524627688768e-01,
        1.461661507209034e00,
        3.010066362817634e00,
    ),
    "double": (
        2.220446049250313e-16,
        2.580956802971767e-08,
        3.397168839976962e-04,
        4.991228871115323e-02,
        2.996158913811580e-01,
        1.090863719290036e00,
    ),
}
_SQRT_177 = 0.1330413469565007072504e2
_T8_X3 = 2.0 / 3.0
_T8 = dict(
    x1=_T8_X3 * ((1.0 + _SQRT_177) / 88.0),
    x2=_T8_X3 * ((1.0 + _SQRT_177) / 352.0),
    x4=(-271.0 + 29.0 * _SQRT_177) / (315.0 * _T8_X3),
    x5=(-11.0 + 11.0 * _SQRT_177) / (1260.0 * _T8_X3),
    x6=(-99.0 + 11.0 * _SQRT_177) / (5040.0 * _T8_X3),
    x7=(89.0 - _SQRT_177) / (5040.0 * _T8_X3),
    y2=(857.0 - 58.0 * _SQRT_177) / 630.0,
)
_T12_COEFFICIENTS = (  # rows: B_i = sum_j b_ij A^j over (I, A, A^2, A^3)
    (9.0198e-16, 0.46932117595418237389, -0.20099424927047284052, -0.04623946134063071740),
    (
        5.31597895759871264183,
        1.19926790417132231573,
        0.01179296240992997031,
        0.01108844528519167989,
    ),
    (
        0.18188869982170434744,
        0.05502798439925399070,
        0.09351590770535414968,
        0.00610700528898058230,
    ),
    (-2.0861320e-13, -0.13181061013830184015, -0.02027855540589259079, -0.00675951846863086359),
)
_T18_COEFFICIENTS = (  # rows: B_i = sum_j b_ij A^j over (I, A, A^2, A^3, A^6)
    (
        0.0,
        -1.00365581030144618291e-01,
        -8.02924648241156932449e-03,
        -8.92138498045729985177e-04,
        0.0,
    ),
    (
        0.0,
        3.97849749499645077844e-01,
        1.36783778460411720168e00,
        4.98289622525382669416e-01,
        -6.37898194594723280150e-04,
    ),
    (
        -1.09676396052962061844e01,
        1.68015813878906206114e00,
        5.71779846478865511061e-02,
        -6.98210122488052056106e-03,
        3.34975017086070470649e-05,
    ),
    (
        -9.04316832390810593223e-02,
        -6.76404519071381882256e-02,
        6.75961301770459654925e-02,
        2.95552570429315521194e-02,
        -1.39180257516060693404e-05,
    ),
    (
        0.0,
        0.0,
        -9.23364619367118555360e-02,
        -1.69364939002081722752e-02,
        -1.40086798182036094347e-05,
    ),
)


def _combination(matrices, coefficients):
    """sum_j c_j M_j, coefficients rounded to the matrices' dtype as PyTorch's are."""
    dtype = matrices[0].dtype
    total = jnp.asarray(coefficients[0], dtype) * matrices[0]
    for c, m in zip(coefficients[1:], matrices[1:]):
        total = total + jnp.asarray(c, dtype) * m
    return total


def _taylor_exponentials(A):
    """PyTorch's six Taylor approximations of exp(A), lowest degree first."""
    eye = jnp.broadcast_to(jnp.eye(A.shape[-1], dtype=A.dtype), A.shape)
    A2 = matmul(A, A)
    A3 = matmul(A, A2)
    A6 = matmul(A3, A3)
    t1 = eye + A
    t2 = _combination([eye, A, A2], [1.0, 1.0, 0.5])
    t4 = _combination(
        [eye, A, matmul(A2, _combination([eye, A, A2], [1 / 2.0, 1 / 6.0, 1 / 24.0]))],
        [1.0, 1.0, 1.0],
    )
    x = _T8
    A4 = matmul(A2, _combination([A, A2], [x["x1"], x["x2"]]))
    A8 = matmul(
        _combination([A2, A4], [_T8_X3, 1.0]),
        _combination([eye, A, A2, A4], [x["x4"], x["x5"], x["x6"], x["x7"]]),
    )
    t8 = _combination([eye, A, A2, A8], [1.0, 1.0, x["y2"], 1.0])
    B = [_combination([eye, A, A2, A3], row) for row in _T12_COEFFICIENTS]
    A6_12 = B[2] + matmul(B[3], B[3])
    t12 = B[0] + matmul(B[1] + A6_12, A6_12)
    B = [_combination([eye, A, A2, A3, A6], row) for row in _T18_COEFFICIENTS]
    A9 = B[3] + matmul(B[0], B[4])
    t18 = B[1] + matmul(B[2] + A9, A9)
    return t1, t2, t4, t8, t12, t18


# Half precision computes in float32 and rounds once. (PyTorch's own CPU kernel reads its
# float64 coefficient tables as bfloat16/float16 bits and returns garbage for these dtypes;
# torchlax does not reproduce that.)
@lowering(aten.linalg_matrix_exp.default, opmath=True)
def linalg_matrix_exp(self):
    if self.shape[-1] == 1:
        return jnp.exp(self)
    if self.size == 0:
        return self
    return _matrix_exp_kernel(self)


@jax.jit
def _matrix_exp_kernel(self):
    single = self.dtype in (jnp.dtype(jnp.float32), jnp.dtype(jnp.complex64))
    bounds = _EXP_NORM_BOUNDS["single" if single else "double"]
    norm = jnp.max(jnp.sum(jnp.abs(self), axis=-2), axis=-1)  # operator 1-norm
    # Degree 18 after scaling by 2^-s, s = max(0, ceil(log2(norm / theta_18))).
    steps = jnp.maximum(jnp.ceil(jnp.log2(norm / jnp.asarray(bounds[5], norm.dtype))), 0)
    steps = jnp.where(norm >= bounds[4], steps, 0).astype(jnp.int32)
    scaled = self / jnp.exp2(steps.astype(norm.dtype)).astype(self.dtype)[..., None, None]
    candidates = _taylor_exponentials(scaled)

    def square(state):
        i, X = state
        return i + 1, jnp.where((i < steps)[..., None, None], matmul(X, X), X)

    _, t18 = jax.lax.while_loop(
        lambda s: s[0] < jnp.max(steps), square, (jnp.asarray(0, jnp.int32), candidates[5])
    )
    # Each matrix takes the lowest degree whose bound its norm does not exceed; PyTorch
    # computes degree 18 for norms >= the degree-12 bound (a norm exactly on it included).
    result = t18
    for bound, candidate in reversed(list(zip(bounds[:5], candidates[:5]))):
        result = jnp.where((norm <= bound)[..., None, None], candidate, result)
    return jnp.where((norm >= bounds[4])[..., None, None], t18, result)
