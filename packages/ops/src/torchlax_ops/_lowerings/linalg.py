"""Matrix products and ``torch.linalg``.

Products run at the precision ``torch.get_float32_matmul_precision()`` says (``_precision``:
``HIGHEST`` under the default "highest", so float32 results match PyTorch's CPU kernels);
half-precision inputs accumulate in float32 as PyTorch's do. Factorizations return PyTorch's
auxiliary outputs too (LU and 1-based int32 pivots, ``info``), since PyTorch's derivative
formulas and error checks consume them.
"""

from __future__ import annotations

import functools

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import torch
from torchlax_core import jax_dtype

from .. import _aten
from .._precision import product_precision
from .._promotion import accumulator, up
from .._table import lowering, named_decomposition
from ._common import _scalar_name

aten = _aten.aten  # (an op this torch lacks: a Missing, skipped)
HIGHEST = jax.lax.Precision.HIGHEST


def matmul(a, b, out_dtype=None):
    """``a @ b`` (with NumPy broadcasting) at full precision, in ``out_dtype`` (default a's)."""
    out_dtype = out_dtype or a.dtype
    acc = accumulator(a.dtype) if a.dtype == b.dtype else None
    result = jnp.matmul(a, b, precision=product_precision(a.dtype), preferred_element_type=acc)
    return result.astype(out_dtype)


def _scaled_sum(product, self, beta, alpha, dtype):
    """``beta * self + alpha * product`` as the addmm family computes it (self ignored if beta=0)."""
    acc = accumulator(dtype) or dtype
    out = product.astype(acc)
    if alpha != 1:
        out = out * jnp.asarray(alpha, acc)
    if beta != 0:
        scaled = self.astype(acc) if beta == 1 else self.astype(acc) * jnp.asarray(beta, acc)
        out = out + scaled
    return jnp.broadcast_to(out, product.shape).astype(dtype)


def _mT(x):
    return jnp.swapaxes(x, -1, -2)


def _mH(x):
    return jnp.conj(_mT(x)) if jnp.iscomplexobj(x) else _mT(x)


# -- products -----------------------------------------------------------------------------------

# How PyTorch names dtypes in the products' dtype errors: ScalarType names (`_scalar_name`), and
# C++ type names.
_C_NAMES = {
    "bool": "bool",
    "uint8": "unsigned char",
    "int8": "signed char",
    "int16": "short int",
    "int32": "int",
    "int64": "long int",
    "float16": "c10::Half",
    "bfloat16": "c10::BFloat16",
    "float32": "float",
    "float64": "double",
    "complex64": "c10::complex<float>",
    "complex128": "c10::complex<double>",
}


def _same_dtype(message, *arrays) -> None:
    """PyTorch's products take one dtype (no promotion): mixed dtypes raise its error, which
    ``message(*names)`` spells (``names`` are ScalarType names, or C++ names for mm)."""
    if len({a.dtype for a in arrays if hasattr(a, "dtype")}) > 1:
        raise RuntimeError(message(*arrays))


@lowering(aten.mm.default)
def mm(self, mat2):
    _same_dtype(
        lambda a, b: (
            "expected m1 and m2 to have the same dtype, but got: "
            f"{_C_NAMES.get(a.dtype.name, a.dtype.name)} != "
            f"{_C_NAMES.get(b.dtype.name, b.dtype.name)}"
        ),
        self,
        mat2,
    )
    return matmul(self, mat2)


@lowering(aten.bmm.default)
def bmm(self, mat2):
    _same_dtype(
        lambda a, b: f"expected scalar type {_scalar_name(a)} but found {_scalar_name(b)}",
        self,
        mat2,
    )
    return matmul(self, mat2)


@lowering(aten.mm.dtype, aten.bmm.dtype)
def mm_dtype(self, mat2, out_dtype):
    acc = accumulator(self.dtype)
    acc = None if acc is None else jnp.promote_types(jax_dtype(out_dtype), acc)
    precision = product_precision(self.dtype)
    result = jnp.matmul(self, mat2, precision=precision, preferred_element_type=acc)
    return result.astype(jax_dtype(out_dtype))


@lowering(aten.mv.default)
def mv(self, vec):
    _same_dtype(
        lambda a, b: (
            "addmv input tensors must have the same dtype, but got "
            f"{_scalar_name(b)}, {_scalar_name(a)}, and {_scalar_name(b)}"
        ),
        self,
        vec,
    )
    return matmul(self, vec)


@lowering(aten.dot.default)
def dot(self, tensor):
    _same_dtype(_dot_message, self, tensor)
    return matmul(self, tensor)


def _dot_message(a, b):
    return (
        f"dot : expected both vectors to have same dtype, but found {_scalar_name(a)} and "
        f"{_scalar_name(b)}"
    )


@lowering(aten.vdot.default)
def vdot(self, other):
    _same_dtype(_dot_message, self, other)
    return matmul(jnp.conj(self), other)


@lowering(aten.addmm.default)
def addmm(self, mat1, mat2, *, beta=1, alpha=1):
    _same_dtype(
        lambda a, b: (
            f"mat1 and mat2 must have the same dtype, but got {_scalar_name(a)} "
            f"and {_scalar_name(b)}"
        ),
        mat1,
        mat2,
    )
    _same_dtype(
        lambda a, b: (
            f"self and mat2 must have the same dtype, but got {_scalar_name(a)} "
            f"and {_scalar_name(b)}"
        ),
        self,
        mat2,
    )
    return _scaled_sum(_raw_matmul(mat1, mat2), self, beta, alpha, mat1.dtype)


@lowering(aten.addmv.default)
def addmv(self, mat, vec, *, beta=1, alpha=1):
    _same_dtype(
        lambda a, b, c: (
            "addmv input tensors must have the same dtype, but got "
            f"{_scalar_name(a)}, {_scalar_name(b)}, and {_scalar_name(c)}"
        ),
        self,
        mat,
        vec,
    )
    return _scaled_sum(_raw_matmul(mat, vec), self, beta, alpha, mat.dtype)


@lowering(aten.baddbmm.default)
def baddbmm(self, batch1, batch2, *, beta=1, alpha=1):
    _same_dtype(
        lambda a, b: f"expected scalar type {_scalar_name(a)} but found {_scalar_name(b)}",
        batch1,
        batch2,
    )
    _same_dtype(
        lambda a, b, c: (
            f"Input dtypes must be the same, got: input "
            f"{_C_NAMES.get(a.dtype.name)}, batch1: {_C_NAMES.get(b.dtype.name)}, batch2: "
            f"{_C_NAMES.get(c.dtype.name)}"
        ),
        self,
        batch1,
        batch2,
    )
    return _scaled_sum(_raw_matmul(batch1, batch2), self, beta, alpha, batch1.dtype)


@lowering(aten.addbmm.default)
def addbmm(self, batch1, batch2, *, beta=1, alpha=1):
    _same_dtype(
        lambda a, b: (
            f"self and mat2 must have the same dtype, but got {_scalar_name(a)} "
            f"and {_scalar_name(b)}"
        ),
        batch1,
        batch2,
    )
    _same_dtype(
        lambda a, b: (
            f"self and mat2 must have the same dtype, but got {_scalar_name(a)} "
            f"and {_scalar_name(b)}"
        ),
        self,
        batch1,
    )
    acc = accumulator(batch1.dtype)
    precision = product_precision(batch1.dtype)
    product = jnp.einsum(
        "bij,bjk->ik", batch1, batch2, precision=precision, preferred_element_type=acc
    )
    return _scaled_sum(product, self, beta, alpha, batch1.dtype)


@lowering(aten.addr.default)
def addr(self, vec1, vec2, *, beta=1, alpha=1):
    return _scaled_sum(jnp.outer(vec1, vec2), self, beta, alpha, jnp.result_type(vec1, vec2))


def _raw_matmul(a, b):
    # Kept in the accumulator dtype so alpha/beta scaling rounds once, as PyTorch does.
    precision = product_precision(a.dtype)
    return jnp.matmul(a, b, precision=precision, preferred_element_type=accumulator(a.dtype))


# Grouped products (mixture-of-experts layers): ``offs`` holds each group's cumulative end along
# the grouped dimension (int32), so a group's rows, contraction slice or columns are static-shape
# masks of a traced ``offs``: the same program serves every routing. Positions past the last
# offset belong to no group and come out 0.
_GROUPED_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def _group_of(positions, offs):
    """The group index of each position (``len(offs)`` for positions past the last offset)."""
    return jnp.searchsorted(offs, positions, side="right")


@lowering(aten._grouped_mm.default)
def _grouped_mm(self, mat2, offs=None, bias=None, out_dtype=None):
    op = "aten._grouped_mm"
    for name, x in (("self", self), ("mat2", mat2)):
        if x.dtype not in _GROUPED_DTYPES:
            raise RuntimeError(
                f"{op}: expected {name} to be a float32, bfloat16 or float16 matrix, got {x.dtype}."
            )
        if x.ndim not in (2, 3):
            raise RuntimeError(f"{op}: {name} must be 2-d or 3-d, got {x.ndim}-d.")
    if self.dtype != mat2.dtype:
        raise RuntimeError(
            f"{op}: self ({self.dtype}) and mat2 ({mat2.dtype}) must have the same dtype."
        )
    if bias is not None:
        raise RuntimeError(
            f"{op}: bias is not supported (PyTorch does not support it yet); add "
            "it to the result instead."
        )
    if out_dtype is not None and jax_dtype(out_dtype) != self.dtype:
        raise RuntimeError(
            f"{op}: the output dtype must match self's dtype ({self.dtype}), got "
            f"{jax_dtype(out_dtype)}."
        )
    both_3d = self.ndim == 3 and mat2.ndim == 3
    if both_3d != (offs is None):
        raise RuntimeError(
            f"{op}: pass offs when either matrix is 2-d, and no offs when both are 3-d."
        )
    if offs is not None and (offs.ndim != 1 or offs.dtype != jnp.int32):
        raise RuntimeError(
            f"{op}: offs must be a 1-d int32 tensor of cumulative group ends, got "
            f"{offs.ndim}-d {offs.dtype}."
        )
    if self.shape[-1] != mat2.shape[-2]:
        raise RuntimeError(
            f"{op}: contraction sizes differ: self has {self.shape[-1]} columns, "
            f"mat2 has {mat2.shape[-2]} rows."
        )
    acc = accumulator(self.dtype)
    precision = product_precision(self.dtype)

    def dot(spec, *operands):
        return jnp.einsum(spec, *operands, precision=precision, preferred_element_type=acc)

    if both_3d:  # (G, M, K) @ (G, K, N): a batched product
        if self.shape[0] != mat2.shape[0]:
            raise RuntimeError(f"{op}: self has {self.shape[0]} groups, mat2 {mat2.shape[0]}.")
        out = dot("gmk,gkn->gmn", self, mat2)
    elif self.ndim == 2 and mat2.ndim == 3:  # rows of self grouped: row r uses mat2[group(r)]
        assert offs is not None  # checked above: given unless both are 3-d
        if offs.shape[0] != mat2.shape[0]:
            raise RuntimeError(f"{op}: offs has {offs.shape[0]} groups, mat2 {mat2.shape[0]}.")
        sizes = jnp.diff(offs, prepend=jnp.zeros((1,), offs.dtype))
        out = jax.lax.ragged_dot(self, mat2, sizes, precision=precision, preferred_element_type=acc)
        rows = jnp.arange(self.shape[0])
        out = jnp.where((rows < offs[-1])[:, None], out, 0)
    elif self.ndim == 2:  # the contraction grouped: one (M, N) product per slice of K
        assert offs is not None  # checked above: given unless both are 3-d
        k = jnp.arange(self.shape[1])
        member = _group_of(k, offs)[None, :] == jnp.arange(offs.shape[0])[:, None]  # (G, K)
        out = dot("mk,gk,kn->gmn", self, member.astype(self.dtype), mat2)
    else:  # (G, M, K) @ (K, N): columns of mat2 grouped, column n uses self[group(n)]
        assert offs is not None  # checked above: given unless both are 3-d
        if offs.shape[0] != self.shape[0]:
            raise RuntimeError(f"{op}: offs has {offs.shape[0]} groups, self {self.shape[0]}.")
        group = _group_of(jnp.arange(mat2.shape[1]), offs)  # (N,)
        full = dot("gmk,kn->gmn", self, mat2)
        columns = jnp.arange(mat2.shape[1])
        picked = full[jnp.minimum(group, self.shape[0] - 1), :, columns].T  # (M, N)
        out = jnp.where((group < self.shape[0])[None, :], picked, 0)
    return out.astype(self.dtype)


@named_decomposition("transformers::grouped_mm_fallback")
def _transformers_grouped_mm_fallback(input, weight, offs):
    # Hugging Face's MoE layers call this custom op under tracing (torch.compiler.is_compiling(),
    # as inside torchlax.jit) for non-bfloat16 weights; its CPU kernel loops over offs.tolist().
    # Rows past the last offset are 0 in both.
    return aten._grouped_mm(input, weight, offs)


@lowering(aten.linalg_cross.default)
def linalg_cross(self, other, *, dim=-1):
    shape = jnp.broadcast_shapes(self.shape, other.shape)
    return jnp.cross(jnp.broadcast_to(self, shape), jnp.broadcast_to(other, shape), axis=dim)


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


# -- least squares ------------------------------------------------------------------------------

_LSTSQ_DRIVERS = ("gels", "gelsy", "gelsd", "gelss")


@lowering(aten.linalg_lstsq.default)
def linalg_lstsq(self, b, rcond=None, *, driver=None):
    """(solution, residuals, rank, singular_values) as PyTorch's CPU kernel (LAPACK ``driver``).

    Which outputs are filled depends on the driver, as in PyTorch: ``rank`` for all but gels,
    ``singular_values`` for gelsd/gelss, ``residuals`` when m > n for all but gelsy (for
    gelsd/gelss only if every matrix has full rank); the others are empty.
    """
    driver = "gelsy" if driver is None else driver  # PyTorch's CPU default
    if driver not in _LSTSQ_DRIVERS:
        raise RuntimeError(
            f"torch.linalg.lstsq: parameter `driver` should be one of {_LSTSQ_DRIVERS}, but got "
            f"{driver!r}; pass one of those (or None for gelsy)."
        )
    vector = b.ndim == self.ndim - 1
    A, B = _broadcast_batch(self, b[..., None] if vector else b)
    m, n = A.shape[-2:]
    real = jnp.finfo(A.dtype).dtype
    if rcond is None:
        rcond = jnp.finfo(real).eps * max(m, n)
    elif rcond < 0 and driver in ("gelsd", "gelss"):  # as LAPACK: machine precision instead
        rcond = jnp.finfo(real).eps
    solution, residuals, rank, singular_values = _lstsq_kernel(A, B, float(rcond), driver)
    if m > n and driver != "gelsy":
        if driver != "gels":  # PyTorch reports them only if every matrix has full rank
            full = jnp.all(rank == n)
            if not isinstance(full, jax.core.Tracer):
                residuals = residuals if bool(full) else _empty(real)
            else:  # the shape cannot depend on data under tracing: NaN marks "not full rank"
                residuals = jnp.where(full, residuals, jnp.nan)
    if vector:
        solution = solution[..., 0]
    return solution, residuals, rank, singular_values


@functools.partial(jax.jit, static_argnums=(2, 3))
def _lstsq_kernel(A, B, rcond, driver):
    m, n = A.shape[-2:]
    real = jnp.finfo(A.dtype).dtype
    rank, singular_values = jnp.zeros((0,), jnp.int64), _empty(real)
    if driver == "gels":
        solution = _lstsq_gels(A, B)
    elif driver == "gelsy":
        solution, rank = _lstsq_gelsy(A, B, rcond)
    else:
        solution, rank, singular_values = _lstsq_svd(A, B, rcond)
    if driver != "gels":
        rank = jnp.broadcast_to(rank, A.shape[:-2])
    residuals = _lstsq_residuals(A, B) if m > n and driver != "gelsy" else _empty(real)
    return solution, residuals, rank, singular_values


def _lstsq_gels(A, B):
    """Full-rank QR (m >= n) or LQ (m < n) solve, the minimum-norm solution when m < n."""
    m, n = A.shape[-2:]
    if m == 0 or n == 0:
        return jnp.zeros(A.shape[:-2] + (n, B.shape[-1]), A.dtype)
    if m >= n:
        Q, R = jnp.linalg.qr(A)
        return _triangular(R, matmul(_mH(Q), B), lower=False)
    Q, R = jnp.linalg.qr(_mH(A))  # A = R^H Q^H
    y = _triangular(R, B, lower=False, transpose=True, conjugate=True)
    return matmul(Q, y)


def _lstsq_gelsy(A, B, rcond):
    """QR with column pivoting; the rank is where the leading triangle's condition number
    reaches 1/rcond, and the solution is the minimum-norm one of the truncated system."""
    m, n = A.shape[-2:]
    k = min(m, n)
    if k == 0:
        return jnp.zeros(A.shape[:-2] + (n, B.shape[-1]), A.dtype), jnp.zeros(
            A.shape[:-2], jnp.int64
        )
    Q, R, perm = jax.lax.linalg.qr(A, pivoting=True, full_matrices=False)
    rank = _leading_rank(R[..., :k, :k], rcond)
    kept = jnp.arange(k) < rank[..., None]  # rows of R (and of Q^H B) kept
    T = jnp.where(kept[..., :, None], R[..., :k, :], 0)
    c = jnp.where(kept[..., :, None], matmul(_mH(Q[..., :, :k]), B), 0)
    # Minimum-norm y with T y = c through T^H = Q2 R2; R2's dropped columns are zero, so unit
    # diagonal entries there make it invertible without touching the kept block.
    Q2, R2 = jnp.linalg.qr(_mH(T))
    R2 = R2 + jnp.where(kept, 0, 1).astype(R2.dtype)[..., None, :] * jnp.eye(k, dtype=R2.dtype)
    y = matmul(Q2, _triangular(R2, c, lower=False, transpose=True, conjugate=True))
    inverse = jnp.argsort(perm, axis=-1)  # undo the column pivoting: x[perm] = y
    return jnp.take_along_axis(y, inverse[..., :, None], axis=-2), rank.astype(jnp.int64)


_EXACT_RANK_LIMIT = 48  # leading triangles up to this size get exact singular values


def _leading_rank(R, rcond):
    """Largest r with smax(R[:r, :r]) * rcond <= smin(R[:r, :r]), gelsy's criterion.

    LAPACK estimates both incrementally; here they are exact for small R (one SVD per leading
    triangle) and, beyond ``_EXACT_RANK_LIMIT``, estimated from Frobenius norms of the leading
    triangles of R and of R^-1 (O(k^3) in all, where exact values would cost O(k^4)).
    """
    k = R.shape[-1]
    if k > _EXACT_RANK_LIMIT:
        return _leading_rank_estimate(R, rcond)
    scale = jnp.abs(R[..., :1, :1])  # |R00| >= every diagonal entry: leaves smin, smax alone
    index = jnp.arange(k)
    inside = index[:, None, None] >= jnp.maximum(index[None, :, None], index[None, None, :])
    pad = (index[:, None] < index[None, :])[..., None] * jnp.eye(k)  # [r, i, j]: i >= r+1 on diag
    blocks = jnp.where(inside, R[..., None, :, :], 0) + pad * scale[..., None, :, :]
    values = jnp.linalg.svd(blocks, compute_uv=False)
    ok = values[..., -1] >= values[..., 0] * rcond
    ok = ok & (scale[..., 0] > 0)  # a zero matrix has rank 0
    return jnp.sum(jnp.cumprod(ok, axis=-1), axis=-1)


def _leading_rank_estimate(R, rcond):
    k = R.shape[-1]
    diag = jnp.diagonal(R, axis1=-2, axis2=-1)
    safe = R + jnp.where(diag == 0, 1, 0).astype(R.dtype)[..., None, :] * jnp.eye(k, dtype=R.dtype)
    eye = jnp.broadcast_to(jnp.eye(k, dtype=R.dtype), R.shape)
    inverse = _triangular(safe, eye, lower=False)  # leading blocks of R^-1 invert R's

    def leading_norms(M):  # ||M[:r, :r]||_F for r = 1..k (upper triangular M)
        squares = jnp.abs(M) ** 2
        per_column = jnp.cumsum(squares, axis=-2)  # rows 0..r of each column
        return jnp.sqrt(jnp.cumsum(jnp.diagonal(per_column, axis1=-2, axis2=-1), axis=-1))

    smax, smin = leading_norms(R), 1 / leading_norms(inverse)
    ok = (smax * rcond <= smin) & (jnp.cumsum(diag == 0, axis=-1) == 0)
    return jnp.sum(jnp.cumprod(ok, axis=-1), axis=-1)


def _lstsq_svd(A, B, rcond):
    """gelsd/gelss: singular values below rcond * the largest count as zero."""
    m, n = A.shape[-2:]
    real = jnp.finfo(A.dtype).dtype
    if min(m, n) == 0:
        return (
            jnp.zeros(A.shape[:-2] + (n, B.shape[-1]), A.dtype),
            jnp.zeros(A.shape[:-2], jnp.int64),
            jnp.zeros(A.shape[:-2] + (0,), real),
        )
    U, S, Vh = jnp.linalg.svd(A, full_matrices=False)
    kept = S > rcond * S[..., :1]
    inverse = jnp.where(kept, 1 / jnp.where(kept, S, 1), 0).astype(A.dtype)
    solution = matmul(_mH(Vh), inverse[..., :, None] * matmul(_mH(U), B))
    return solution, jnp.sum(kept, axis=-1).astype(jnp.int64), S


def _lstsq_residuals(A, B):
    # Squared norms of the last m - n rows of Q^H B, as LAPACK leaves them in B.
    packed, tau = jnp.linalg.qr(A, mode="raw")
    rotated = jax.lax.linalg.ormqr(_mT(packed), tau, B, transpose=True)
    tail = rotated[..., A.shape[-1] :, :]
    return jnp.sum(
        jnp.real(tail * jnp.conj(tail)) if jnp.iscomplexobj(tail) else tail * tail, axis=-2
    )


# -- LDL^T with Bunch-Kaufman pivoting (LAPACK's sytrf/hetrf, lower) -----------------------------

_BUNCH_KAUFMAN_ALPHA = (1 + 17**0.5) / 8


def _batched(fn, batch_ndim_from, *arrays):
    """Run ``fn`` on each matrix of a batch (flattened, vmapped); ``batch_ndim_from`` is the
    array whose leading dims are the batch."""
    batch = batch_ndim_from.shape[:-2]
    flat = [a.reshape((-1,) + a.shape[len(batch) :]) for a in arrays]
    outs = jax.vmap(fn)(*flat)
    return tuple(o.reshape(batch + o.shape[1:]) for o in outs)


def _abs1(x):
    # LAPACK's pivot magnitude: |re| + |im| for complex entries.
    return jnp.abs(x.real) + jnp.abs(x.imag) if jnp.iscomplexobj(x) else jnp.abs(x)


def _mirror_lower(W, hermitian):
    """The symmetric (Hermitian) matrix whose lower triangle is W's."""
    lower = jnp.tril(W, -1)
    return lower + (_mH if hermitian else _mT)(lower) + jnp.diag(jnp.diagonal(W))


def _sytf2(A, hermitian):
    """One matrix's Bunch-Kaufman factorization: LAPACK's sytf2/hetf2 with uplo='L'.

    The trailing matrix is kept full (symmetric), so LAPACK's row/column interchanges within it
    are a symmetric permutation; factored columns are written to LD and never swapped again.
    """
    n = A.shape[-1]
    conj = jnp.conj if hermitian and jnp.iscomplexobj(A) else (lambda x: x)
    idx = jnp.arange(n)

    def diag_abs(x):
        return jnp.abs(x.real) if hermitian else _abs1(x)

    def step(state):
        k, W, LD, pivots, info = state
        column = W[:, k]
        absakk = diag_abs(W[k, k])
        below = idx > k
        column_abs = jnp.where(below, _abs1(column), -1)
        imax = jnp.argmax(column_abs)
        colmax = jnp.maximum(column_abs[imax], 0)
        row_abs = jnp.where((idx >= k) & (idx != imax), _abs1(W[imax]), -1)
        rowmax = jnp.max(row_abs)
        zero = (jnp.maximum(absakk, colmax) == 0) | jnp.isnan(absakk)
        alpha = _BUNCH_KAUFMAN_ALPHA
        keep_k = (
            zero
            | (absakk >= alpha * colmax)
            | (absakk >= alpha * colmax * (colmax / jnp.where(rowmax > 0, rowmax, 1)))
        )
        one_by_one = keep_k | (diag_abs(W[imax, imax]) >= alpha * rowmax)
        kp = jnp.where(keep_k, k, imax)
        kstep = jnp.where(one_by_one, 1, 2)
        kk = k + kstep - 1
        perm = idx.at[kk].set(kp).at[kp].set(kk)
        W = W[perm][:, perm]

        # 1x1 pivot: d = W[k, k], l = W[k+1:, k] / d.
        d = W[k, k].real if hermitian else W[k, k]
        x = jnp.where(below, W[:, k], 0)
        r1 = 1 / d
        update1 = x[:, None] * (-r1 * conj(x))[None, :]
        col1 = jnp.where(below, x * r1, jnp.where(idx == k, W[k, k], 0))

        # 2x2 pivot on (k, k+1): LAPACK's formulas for the two multiplier columns.
        after = idx > k + 1
        d21 = W[k + 1, k]
        if hermitian:
            dabs = jnp.abs(d21)
            d11, d22 = W[k + 1, k + 1].real / dabs, W[k, k].real / dabs
            unit21 = d21 / dabs
            scale = (1 / (d11 * d22 - 1)) / dabs
            wk = scale * (d11 * W[:, k] - unit21 * W[:, k + 1])
            wkp1 = scale * (d22 * W[:, k + 1] - jnp.conj(unit21) * W[:, k])
        else:
            d11, d22 = W[k + 1, k + 1] / d21, W[k, k] / d21
            scale = (1 / (d11 * d22 - 1)) / d21
            wk = scale * (d11 * W[:, k] - W[:, k + 1])
            wkp1 = scale * (d22 * W[:, k + 1] - W[:, k])
        wk, wkp1 = jnp.where(after, wk, 0), jnp.where(after, wkp1, 0)
        xk, xk1 = jnp.where(after, W[:, k], 0), jnp.where(after, W[:, k + 1], 0)
        update2 = -(xk[:, None] * conj(wk)[None, :] + xk1[:, None] * conj(wkp1)[None, :])
        col2a = jnp.where(after, wk, jnp.where(idx == k, W[k, k], jnp.where(idx == k + 1, d21, 0)))
        col2b = jnp.where(after, wkp1, jnp.where(idx == k + 1, W[k + 1, k + 1], 0))

        two = kstep == 2
        update = jnp.where(zero, 0, jnp.where(two, update2, update1))
        W = _mirror_lower(W + update, hermitian)
        if hermitian:  # hetf2 keeps the diagonal real
            W = W - 1j * jnp.diag(jnp.diagonal(W).imag)
        col_k = jnp.where(zero, jnp.where(idx >= k, column, 0), jnp.where(two, col2a, col1))
        LD = LD.at[:, k].set(col_k)
        LD = LD.at[:, jnp.minimum(k + 1, n - 1)].set(
            jnp.where(two, col2b, LD[:, jnp.minimum(k + 1, n - 1)])
        )
        pivot = jnp.where(two, -(kp + 1), kp + 1).astype(jnp.int32)
        pivots = pivots.at[k].set(pivot)
        pivots = pivots.at[jnp.minimum(k + 1, n - 1)].set(
            jnp.where(two, pivot, pivots[jnp.minimum(k + 1, n - 1)])
        )
        info = jnp.where((info == 0) & zero, k + 1, info).astype(jnp.int32)
        return k + kstep, W, LD, pivots, info

    start = (
        jnp.asarray(0),
        A,
        jnp.zeros_like(A),
        jnp.zeros((n,), jnp.int32),
        jnp.asarray(0, jnp.int32),
    )
    _, _, LD, pivots, info = jax.lax.while_loop(lambda s: s[0] < n, step, start)
    return LD, pivots, info


@lowering(aten.linalg_ldl_factor_ex.default)
def linalg_ldl_factor_ex(self, *, hermitian=False, check_errors=False):
    n = self.shape[-1]
    hermitian = hermitian and jnp.iscomplexobj(self)  # a real symmetric matrix is Hermitian
    if n == 0 or self.size == 0:
        batch = self.shape[:-2]
        return self, jnp.zeros(batch + (n,), jnp.int32), jnp.zeros(batch, jnp.int32)
    LD, pivots, info = _ldl_factor_kernel(self, hermitian)
    if check_errors:
        _linalg_check_errors(info, "torch.linalg.ldl_factor_ex", is_matrix=self.ndim == 2)
    return LD, pivots, info


@functools.partial(jax.jit, static_argnums=1)  # one XLA program per shape, eagerly too
def _ldl_factor_kernel(A, hermitian):
    n = A.shape[-1]
    # LAPACK reads only the lower triangle.
    A = jax.vmap(lambda a: _mirror_lower(a, hermitian))(A.reshape(-1, n, n)).reshape(A.shape)
    return _batched(lambda a: _sytf2(a, hermitian), A, A)


def _sytrs(LD, pivots, B, hermitian):
    """One system A X = B from sytf2's factors: LAPACK's sytrs/hetrs with uplo='L'."""
    n = LD.shape[-1]
    conj = jnp.conj if hermitian and jnp.iscomplexobj(LD) else (lambda x: x)
    L = jnp.tril(LD)
    idx = jnp.arange(n)

    def swap(B, i, j):
        perm = idx.at[i].set(j).at[j].set(i)
        return B[perm]

    def forward(state):  # solve L D Y = B, pivot block by pivot block
        k, B = state
        two = pivots[k] < 0
        kp = jnp.where(two, -pivots[k], pivots[k]) - 1
        B = swap(B, jnp.where(two, k + 1, k), kp)
        k1 = jnp.minimum(k + 1, n - 1)
        # 1x1: eliminate below k, then divide by d.
        below = jnp.where((idx > k)[:, None], L[:, k][:, None] * B[k][None, :], 0)
        d = L[k, k].real if hermitian else L[k, k]
        one = (B - below).at[k].set(B[k] / d)
        # 2x2: eliminate below k+1 with both columns, then solve with the 2x2 block of D.
        after = (idx > k + 1)[:, None]
        elim = jnp.where(
            after, L[:, k][:, None] * B[k][None, :] + L[:, k1][:, None] * B[k1][None, :], 0
        )
        akm1k = L[k1, k]
        akm1 = L[k, k] / conj(akm1k)
        ak = L[k1, k1] / akm1k
        denom = akm1 * ak - 1
        bkm1, bk = B[k] / conj(akm1k), B[k1] / akm1k
        two_by_two = (
            (B - elim).at[k].set((ak * bkm1 - bk) / denom).at[k1].set((akm1 * bk - bkm1) / denom)
        )
        return k + jnp.where(two, 2, 1), jnp.where(two, two_by_two, one)

    def backward(state):  # solve L^T X = Y (L^H when Hermitian), last block first
        k, B = state
        two = pivots[k] < 0
        kp = jnp.where(two, -pivots[k], pivots[k]) - 1
        below = (idx > k)[:, None]
        tail = jnp.where(below, B, 0)
        B = B.at[k].add(-jnp.sum(conj(L[:, k])[:, None] * tail, axis=0))
        km1 = jnp.maximum(k - 1, 0)
        B = B.at[km1].add(jnp.where(two, -jnp.sum(conj(L[:, km1])[:, None] * tail, axis=0), 0))
        B = swap(B, k, kp)
        return k - jnp.where(two, 2, 1), B

    _, B = jax.lax.while_loop(lambda s: s[0] < n, forward, (jnp.asarray(0), B))
    _, B = jax.lax.while_loop(lambda s: s[0] >= 0, backward, (jnp.asarray(n - 1), B))
    return (B,)


@lowering(aten.linalg_ldl_solve.default)
def linalg_ldl_solve(LD, pivots, B, *, hermitian=False):
    hermitian = hermitian and jnp.iscomplexobj(LD)
    batch = jnp.broadcast_shapes(LD.shape[:-2], B.shape[:-2])
    LD = jnp.broadcast_to(LD, batch + LD.shape[-2:])
    pivots = jnp.broadcast_to(pivots, batch + pivots.shape[-1:])
    B = jnp.broadcast_to(B, batch + B.shape[-2:]).astype(jnp.result_type(LD, B))
    if B.size == 0:
        return B
    return _ldl_solve_kernel(LD, pivots, B, hermitian)


@functools.partial(jax.jit, static_argnums=3)
def _ldl_solve_kernel(LD, pivots, B, hermitian):
    pivots_matrix = pivots[..., None]  # give pivots two trailing dims so _batched can split them
    (X,) = _batched(lambda ld, p, b: _sytrs(ld, p[:, 0], b, hermitian), B, LD, pivots_matrix, B)
    return X


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


# -- bilinear -------------------------------------------------------------------------------------


@lowering(aten._trilinear.default)
def _trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    # sum over ``sumdim`` of i1 * i2 * i3, each unsqueezed at its ``expand`` dims. As PyTorch
    # does, i1 * i2 is contracted first over the summed dims i3 lacks and rounded to the result
    # dtype, then contracted with i3; an operand's size-1 dim that broadcasts carries no index.
    dtype = jnp.result_type(i1.dtype, i2.dtype, i3.dtype)
    operands = [up(i1), up(i2), up(i3)]
    total = i1.ndim + len(expand1)
    letters = [chr(ord("a") + d) for d in range(total)]
    shapes = []
    for x, expand in zip(operands, (expand1, expand2, expand3), strict=True):
        dims = iter(x.shape)
        shapes.append([1 if d in expand else next(dims) for d in range(total)])
    sizes = [next((s[d] for s in shapes if s[d] != 1), 1) for d in range(total)]  # broadcast
    specs, squeezed = [], []
    for x, expand, shape in zip(operands, (expand1, expand2, expand3), shapes, strict=True):
        kept = [d for d in range(total) if d not in expand]
        broadcast = [i for i, d in enumerate(kept) if shape[d] == 1 and sizes[d] != 1]
        squeezed.append(jnp.squeeze(x, axis=tuple(broadcast)) if broadcast else x)
        specs.append("".join(letters[d] for d in kept if not (shape[d] == 1 and sizes[d] != 1)))
    first_sums = {letters[d] for d in sumdim if letters[d] not in specs[2]}
    pair = "".join(c for c in letters if c in specs[0] + specs[1] and c not in first_sums)
    partial = jnp.einsum(
        f"{specs[0]},{specs[1]}->{pair}", squeezed[0], squeezed[1], precision=HIGHEST
    )
    partial = up(partial.astype(dtype))
    kept = [d for d in range(total) if d not in sumdim]
    output = "".join(letters[d] for d in kept if letters[d] in pair + specs[2])
    out = jnp.einsum(f"{pair},{specs[2]}->{output}", partial, squeezed[2], precision=HIGHEST)
    out = out.reshape([sizes[d] for d in kept])  # dims of size 1 everywhere come back
    return out.astype(dtype)
