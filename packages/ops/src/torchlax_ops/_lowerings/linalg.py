"""``torch.linalg``'s factorizations and what is built on them: LU (solve, inverse, determinants),
triangular and Cholesky, spectral (SVD, QR, eigen, pinv, polar) and Householder QR.

Factorizations return PyTorch's auxiliary outputs too (LU and 1-based int32 pivots, ``info``),
since PyTorch's derivative formulas and error checks consume them. Least squares, LDL^T and the
matrix exponential have modules of their own (``linalg_lstsq``, ``linalg_ldl``,
``linalg_matrix_exp``).
"""

from __future__ import annotations

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import torch

from .. import _aten
from .._table import lowering
from .matmul import matmul

aten = _aten.aten  # (an op this torch lacks: a Missing, skipped)


def _mT(x):
    return jnp.swapaxes(x, -1, -2)


def _mH(x):
    return jnp.conj(_mT(x)) if jnp.iscomplexobj(x) else _mT(x)


# -- LU and what is built on it -------------------------------------------------------------------


def _lu(A):
    """(LU, 1-based int32 pivots, permutation, info) of a batch of matrices."""
    lu, pivots, permutation = jax.lax.linalg.lu(A)
    return lu, pivots.astype(jnp.int32) + 1, permutation, _singular_info(lu)


def _singular_info(lu):
    # LAPACK's info: 1-based index of the first zero on U's diagonal, else 0.
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    if diag.shape[-1] == 0:  # 0x0 matrices are never singular
        return jnp.zeros(diag.shape[:-1], jnp.int32)
    zero = diag == 0
    first = jnp.argmax(zero, axis=-1).astype(jnp.int32) + 1
    return jnp.where(jnp.any(zero, axis=-1), first, 0).astype(jnp.int32)


def _permutation_from_pivots(pivots, m):
    return jax.lax.linalg.lu_pivots_to_permutation(pivots.astype(jnp.int32) - 1, m)


def _broadcast_batch(a, b, a_core=2, b_core=2):
    batch = jnp.broadcast_shapes(a.shape[:-a_core], b.shape[:-b_core])
    return (
        jnp.broadcast_to(a, batch + a.shape[-a_core:]),
        jnp.broadcast_to(b, batch + b.shape[-b_core:]),
    )


def _triangular(a, b, *, lower, left=True, unit=False, transpose=False, conjugate=False):
    a, b = _broadcast_batch(a, b)
    return jax.lax.linalg.triangular_solve(
        a,
        b,
        left_side=left,
        lower=lower,
        unit_diagonal=unit,
        transpose_a=transpose,
        conjugate_a=conjugate,
    )


def _lu_solve(lu, permutation, B, adjoint=False):
    """Solve A X = B (or A^H X = B) given A's LU factorization (P A = L U)."""
    lu, B = _broadcast_batch(lu, B)
    permutation = jnp.broadcast_to(permutation, lu.shape[:-2] + permutation.shape[-1:])
    if not adjoint:
        x = jnp.take_along_axis(B, permutation[..., :, None], axis=-2)
        x = _triangular(lu, x, lower=True, unit=True)
        return _triangular(lu, x, lower=False)
    x = _triangular(lu, B, lower=False, transpose=True, conjugate=True)
    x = _triangular(lu, x, lower=True, unit=True, transpose=True, conjugate=True)
    inverse = jnp.argsort(permutation, axis=-1)
    return jnp.take_along_axis(x, inverse[..., :, None], axis=-2)


def _det_from_lu(lu, pivots):
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    n = diag.shape[-1]
    swaps = jnp.sum(pivots != jnp.arange(1, n + 1, dtype=pivots.dtype), axis=-1)
    parity = jnp.where(swaps % 2 == 1, -1, 1).astype(diag.dtype)
    return diag, parity


@lowering(aten.linalg_lu_factor_ex.default)
def linalg_lu_factor_ex(A, *, pivot=True, check_errors=False):
    _require_pivoting(pivot)
    lu, pivots, _, info = _lu(A)
    return lu, pivots, info


@lowering(aten.linalg_lu.default)
def linalg_lu(A, *, pivot=True):
    _require_pivoting(pivot)
    lu, pivots, _, _ = _lu(A)
    return lu_unpack(lu, pivots)


@lowering(aten.lu_unpack.default)
def lu_unpack(LU_data, LU_pivots, unpack_data=True, unpack_pivots=True):
    m, n = LU_data.shape[-2:]
    k = min(m, n)
    if unpack_pivots:
        permutation = _permutation_from_pivots(LU_pivots, m)
        # A = P L U with P[perm[i], i] = 1.
        P = _mT(jax.nn.one_hot(permutation, m, dtype=LU_data.dtype))
    else:
        P = jnp.zeros((0,), LU_data.dtype)
    if unpack_data:
        L = jnp.tril(LU_data[..., :, :k], -1) + jnp.eye(m, k, dtype=LU_data.dtype)
        U = jnp.triu(LU_data[..., :k, :])
    else:
        L = U = jnp.zeros((0,), LU_data.dtype)
    return P, L, U


def _require_pivoting(pivot):
    if not pivot:
        raise RuntimeError(
            "linalg.lu: LU without pivoting is not implemented on torchlax (nor on PyTorch's "
            "CPU); call it with pivot=True."
        )


@lowering(aten.linalg_lu_solve.default)
def linalg_lu_solve(LU, pivots, B, *, left=True, adjoint=False):
    permutation = _permutation_from_pivots(pivots, LU.shape[-2])
    if left:
        return _lu_solve(LU, permutation, B, adjoint=adjoint)
    # X A = B  <=>  A^H X^H = B^H
    return _mH(_lu_solve(LU, permutation, _mH(B), adjoint=not adjoint))


def _is_vector_rhs(A, B):
    return B.ndim == 1 or (B.ndim == A.ndim - 1 and B.shape == A.shape[:-1])


def _factored_transposed(A) -> bool:
    # PyTorch's det/slogdet factor A^T instead of A when A is real (and contiguous, as torchlax
    # Tensors report): LAPACK wants column-major input. The LU they return is then A^T's, and
    # their derivative formulas count on that, so torchlax does the same.
    return not jnp.iscomplexobj(A)


@lowering(aten._linalg_solve_ex.default)
def _linalg_solve_ex(A, B, *, left=True, check_errors=False):
    lu, pivots, permutation, info = _lu(A)
    vector = _is_vector_rhs(A, B)
    rhs = B[..., None] if vector else B
    if left:
        result = _lu_solve(lu, permutation, rhs)
    else:  # X A = B  <=>  A^H X^H = B^H
        result = _mH(_lu_solve(lu, permutation, _mH(rhs), adjoint=True))
    return (result[..., 0] if vector else result), lu, pivots, info


@lowering(aten.linalg_inv_ex.default)
def linalg_inv_ex(A, *, check_errors=False):
    lu, _, permutation, info = _lu(A)
    eye = jnp.broadcast_to(jnp.eye(A.shape[-1], dtype=A.dtype), A.shape)
    return _lu_solve(lu, permutation, eye), info


@lowering(aten._linalg_det.default)
def _linalg_det(A):
    lu, pivots, _, _ = _lu(_mT(A) if _factored_transposed(A) else A)
    diag, parity = _det_from_lu(lu, pivots)
    return parity * jnp.prod(diag, axis=-1), lu, pivots


@lowering(aten._linalg_slogdet.default)
def _linalg_slogdet(A):
    lu, pivots, _, _ = _lu(_mT(A) if _factored_transposed(A) else A)
    diag, parity = _det_from_lu(lu, pivots)
    magnitude = jnp.abs(diag)
    if jnp.iscomplexobj(diag):
        sign = parity * jnp.prod(diag / jnp.where(magnitude == 0, 1, magnitude), axis=-1)
        sign = jnp.where(jnp.any(magnitude == 0, axis=-1), 0, sign)
    else:
        sign = jnp.where(
            jnp.any(magnitude == 0, axis=-1), 0, parity * jnp.prod(jnp.sign(diag), axis=-1)
        )
    return sign.astype(A.dtype), jnp.sum(jnp.log(magnitude), axis=-1), lu, pivots


# -- triangular and Cholesky ----------------------------------------------------------------------


@lowering(aten.triangular_solve.default)
def triangular_solve(self, A, upper=True, transpose=False, unitriangular=False):
    solution = _triangular(A, self, lower=not upper, unit=unitriangular, transpose=transpose)
    return solution, jnp.broadcast_to(A, solution.shape[:-2] + A.shape[-2:])


@lowering(aten.linalg_solve_triangular.default)
def linalg_solve_triangular(self, B, *, upper, left=True, unitriangular=False):
    return _triangular(self, B, lower=not upper, left=left, unit=unitriangular)


@lowering(aten.linalg_cholesky_ex.default)
def linalg_cholesky_ex(self, *, upper=False, check_errors=False):
    L = jnp.linalg.cholesky(self, symmetrize_input=False)
    bad = jnp.isnan(jnp.diagonal(L, axis1=-2, axis2=-1).real)
    bad = jnp.concatenate([bad, jnp.zeros(bad.shape[:-1] + (1,), bool)], axis=-1)  # 0x0 safe
    info = jnp.where(jnp.any(bad, axis=-1), jnp.argmax(bad, axis=-1) + 1, 0).astype(jnp.int32)
    # JAX leaves a non-positive-definite factor full of NaN; PyTorch returns a partial factor.
    L = jnp.tril(L)
    return (_mH(L) if upper else L), info


@lowering(aten.cholesky_solve.default)
def cholesky_solve(self, input2, upper=False):
    # A = L L^H (or U^H U): solve with the factor, then with its adjoint.
    if upper:
        y = _triangular(input2, self, lower=False, transpose=True, conjugate=True)
        return _triangular(input2, y, lower=False)
    y = _triangular(input2, self, lower=True)
    return _triangular(input2, y, lower=True, transpose=True, conjugate=True)


@lowering(aten.cholesky_inverse.default)
def cholesky_inverse(self, upper=False):
    eye = jnp.broadcast_to(jnp.eye(self.shape[-1], dtype=self.dtype), self.shape)
    return cholesky_solve(eye, self, upper)


@lowering(aten._linalg_check_errors.default)
def _linalg_check_errors(info, api_name, *, is_matrix):
    # Errors need concrete values: checked eagerly, skipped under tracing (as on CUDA, where
    # PyTorch's checks would sync).
    if isinstance(info, jax.core.Tracer):
        return None
    cpu_info = torch.from_numpy(np.asarray(info, dtype=np.int32).copy())
    torch.ops.aten._linalg_check_errors(cpu_info, api_name, is_matrix=is_matrix)
    return None


# -- spectral -----------------------------------------------------------------------------------


def _empty(dtype):
    return jnp.zeros((0,), dtype)


@lowering(aten._linalg_svd.default)
def _linalg_svd(A, full_matrices=False, compute_uv=True, *, driver=None):
    if not compute_uv:
        S = jnp.linalg.svd(A, compute_uv=False)
        return _empty(A.dtype), S, _empty(A.dtype)
    U, S, Vh = jnp.linalg.svd(A, full_matrices=full_matrices)
    return U, S, Vh


@lowering(aten.linalg_qr.default)
def linalg_qr(A, mode="reduced"):
    if mode == "r":
        return _empty(A.dtype), jnp.linalg.qr(A, mode="r")
    Q, R = jnp.linalg.qr(A, mode=mode)
    return Q, R


@lowering(aten._linalg_eigh.default)
def _linalg_eigh(A, UPLO="L", compute_v=True):
    values, vectors = jnp.linalg.eigh(A, UPLO=UPLO, symmetrize_input=False)
    return values, (vectors if compute_v else _empty(A.dtype))


@lowering(aten.linalg_eig.default)
def linalg_eig(self):
    values, vectors = jnp.linalg.eig(self)
    complex_dtype = jnp.result_type(self.dtype, jnp.complex64)
    return values.astype(complex_dtype), vectors.astype(complex_dtype)


@lowering(aten.linalg_pinv.atol_rtol_tensor)
def linalg_pinv(self, *, atol=None, rtol=None, hermitian=False):
    m, n = self.shape[-2:]
    real = jnp.finfo(self.dtype).dtype
    if rtol is None:
        default = jnp.finfo(real).eps * max(m, n)
        rtol = jnp.where(atol > 0, 0.0, default) if atol is not None else default
    atol = jnp.asarray(0.0, real) if atol is None else atol
    if hermitian:
        values, vectors = jnp.linalg.eigh(self, UPLO="L", symmetrize_input=False)  # as LAPACK
        magnitude = jnp.abs(values)
        cutoff = jnp.maximum(
            atol[..., None] if jnp.ndim(atol) else atol,
            (rtol[..., None] if jnp.ndim(rtol) else rtol)
            * jnp.max(magnitude, axis=-1, keepdims=True, initial=0),
        )
        inverse = jnp.where(magnitude > cutoff, 1 / values, 0).astype(self.dtype)
        return matmul(vectors * inverse[..., None, :], _mH(vectors))
    U, S, Vh = jnp.linalg.svd(self, full_matrices=False)
    cutoff = jnp.maximum(
        atol[..., None] if jnp.ndim(atol) else atol,
        (rtol[..., None] if jnp.ndim(rtol) else rtol) * S[..., :1],
    )
    inverse = jnp.where(S > cutoff, 1 / S, 0).astype(self.dtype)
    return matmul(_mH(Vh) * inverse[..., None, :], _mH(U))


@lowering(aten.linalg_matrix_sqrth.default)
def linalg_matrix_sqrth(self):
    # Eigendecomposition of the lower triangle; PyTorch clamps negative eigenvalues to zero.
    values, vectors = jnp.linalg.eigh(self, UPLO="L", symmetrize_input=False)
    roots = jnp.sqrt(jnp.maximum(values, 0)).astype(self.dtype)
    return matmul(vectors * roots[..., None, :], _mH(vectors))


@lowering(aten.linalg_polar.default)
def linalg_polar(A):
    if A.shape[-2] < A.shape[-1]:
        raise RuntimeError(
            f"linalg.polar: input must have at least as many rows as columns, but got "
            f"{A.shape[-2]} by {A.shape[-1]} matrices; transpose A to decompose it."
        )
    # A = W S V^H  =>  U = W V^H, H = V S V^H (as PyTorch's CPU kernel, from the SVD).
    W, S, Vh = jnp.linalg.svd(A, full_matrices=False)
    U = matmul(W, Vh)
    H = matmul(_mH(Vh) * S.astype(A.dtype)[..., None, :], Vh)
    return U, (H + _mH(H)) / 2


# -- Householder QR (LAPACK layouts) --------------------------------------------------------------


@lowering(aten.geqrf.default)
def geqrf(self):
    # LAPACK's packed QR: R on and above the diagonal, the reflectors' tails below, and tau.
    packed, tau = jnp.linalg.qr(self, mode="raw")  # JAX returns the packed matrix transposed
    return _mT(packed), tau


@lowering(aten.linalg_householder_product.default)
def linalg_householder_product(input, tau):
    if tau.shape[-1] == 0:  # no reflectors: Q is the identity's leading columns
        eye = jnp.eye(*input.shape[-2:], dtype=input.dtype)
        return jnp.broadcast_to(eye, input.shape)
    return jax.lax.linalg.householder_product(input, tau)


@lowering(aten.ormqr.default)
def ormqr(self, input2, input3, left=True, transpose=False):
    if input2.shape[-1] == 0:
        return input3
    return jax.lax.linalg.ormqr(self, input2, input3, left=left, transpose=transpose)
