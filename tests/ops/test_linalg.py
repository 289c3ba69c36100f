"""Matrix products and torch.linalg on torchlax Tensors against eager PyTorch on the CPU."""

from __future__ import annotations

import os
import sys

import pytest
import torch
import torchlax_core

sys.path.insert(0, os.path.dirname(__file__))
from _compare_cpu import check, grads_match, to_jax  # noqa: E402

torch.manual_seed(0)
F64 = torch.float64
A = torch.randn(4, 4, dtype=F64)
SPD = A @ A.T + 4 * torch.eye(4, dtype=F64)
B = torch.randn(4, 3, dtype=F64)
BATCH = torch.randn(2, 3, 3, dtype=F64)
RECT = torch.randn(4, 3, dtype=F64)


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


PRODUCTS = {
    "mm": (torch.mm, (randn(3, 4), randn(4, 5))),
    "bmm": (torch.bmm, (randn(2, 3, 4), randn(2, 4, 5))),
    "matmul_broadcast": (torch.matmul, (randn(2, 1, 3, 4), randn(3, 4, 2))),
    "matmul_vector": (torch.matmul, (randn(3, 4), randn(4))),
    "addmm": (
        lambda s, a, b: torch.addmm(s, a, b, beta=0.5, alpha=2),
        (randn(5), randn(3, 4), randn(4, 5)),
    ),
    "addmm_beta0_ignores_nan": (
        lambda s, a, b: torch.addmm(s, a, b, beta=0),
        (torch.full((3, 5), float("nan")), randn(3, 4), randn(4, 5)),
    ),
    "addmv": (torch.addmv, (randn(3), randn(3, 4), randn(4))),
    "addbmm": (torch.addbmm, (randn(3, 5), randn(2, 3, 4), randn(2, 4, 5))),
    "baddbmm": (
        lambda s, a, b: torch.baddbmm(s, a, b, alpha=0.3),
        (randn(3, 5), randn(2, 3, 4), randn(2, 4, 5)),
    ),
    "addr": (torch.addr, (randn(3, 4), randn(3), randn(4))),
    "mv": (torch.mv, (randn(3, 4), randn(4))),
    "dot": (torch.dot, (randn(5), randn(5))),
    "vdot_complex": (
        torch.vdot,
        (randn(5, dtype=torch.complex64), randn(5, dtype=torch.complex64)),
    ),
    "outer": (torch.outer, (randn(3), randn(4))),
    "einsum": (lambda a, b: torch.einsum("bij,bjk->bik", a, b), (randn(2, 3, 4), randn(2, 4, 2))),
    "tensordot": (
        lambda a, b: torch.tensordot(a, b, dims=([1, 2], [0, 1])),
        (randn(2, 3, 4), randn(3, 4, 5)),
    ),
    "mm_int64": (torch.mm, (torch.randint(-5, 5, (3, 4)), torch.randint(-5, 5, (4, 2)))),
    "mm_float64": (torch.mm, (randn(3, 4, dtype=F64), randn(4, 2, dtype=F64))),
    "cross": (torch.linalg.cross, (randn(2, 3), randn(2, 3))),
}


@pytest.mark.parametrize("name", PRODUCTS)
def test_product(name):
    fn, args = PRODUCTS[name]
    check(fn, *args, atol=1e-5, rtol=1e-5, jit=name in ("mm", "addmm", "matmul_broadcast"))


def test_float32_matmul_is_full_precision():
    a, b = randn(64, 256), randn(256, 64)
    check(torch.mm, a, b, atol=1e-4, rtol=1e-5)


def test_bfloat16_matmul_accumulates_in_float32():
    check(
        torch.mm, randn(8, 64).bfloat16(), randn(64, 8).bfloat16(), atol=1e-2, rtol=1e-2, jit=False
    )


def _recon_svd(x):
    u, s, vh = torch.linalg.svd(x, full_matrices=False)
    return u @ torch.diag_embed(s).to(u.dtype) @ vh


DECOMPOSITIONS = {
    "cholesky": (torch.linalg.cholesky, (SPD,)),
    "cholesky_upper": (lambda x: torch.linalg.cholesky(x, upper=True), (SPD,)),
    "cholesky_ex": (torch.linalg.cholesky_ex, (SPD,)),
    "inv": (torch.linalg.inv, (A,)),
    "inv_batched": (torch.linalg.inv, (BATCH,)),
    "det": (torch.linalg.det, (BATCH,)),
    "slogdet": (torch.linalg.slogdet, (BATCH,)),
    "logdet": (torch.logdet, (SPD,)),
    "solve": (torch.linalg.solve, (A, B)),
    "solve_vector": (torch.linalg.solve, (A, B[:, 0])),
    "solve_right": (lambda a, b: torch.linalg.solve(a, b, left=False), (A, B.T)),
    "solve_batched_broadcast": (torch.linalg.solve, (BATCH, torch.randn(3, 2, dtype=F64))),
    "lu_factor": (torch.linalg.lu_factor, (A,)),
    "lu": (torch.linalg.lu, (RECT,)),
    "lu_wide": (torch.linalg.lu, (RECT.T,)),
    "lu_solve": (lambda a, b: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), b), (A, B)),
    "lu_solve_adjoint": (
        lambda a, b: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), b, adjoint=True),
        (A, B),
    ),
    "lu_solve_right": (
        lambda a, b: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), b, left=False),
        (A, B.T),
    ),
    "lu_unpack": (lambda a: torch.lu_unpack(*torch.linalg.lu_factor(a)), (A,)),
    "svdvals": (torch.linalg.svdvals, (BATCH,)),
    "svd_reconstructs": (_recon_svd, (RECT,)),
    "qr_reconstructs": (lambda x: torch.matmul(*torch.linalg.qr(x)), (RECT,)),
    "qr_complete_shapes": (
        lambda x: [t.shape for t in torch.linalg.qr(x, mode="complete")],
        (RECT,),
    ),
    "eigvalsh": (torch.linalg.eigvalsh, (SPD,)),
    "eigh_reconstructs": (
        lambda x: (lambda w, v: v @ torch.diag(w) @ v.T)(*torch.linalg.eigh(x)),
        (SPD,),
    ),
    "eigvals_sorted": (lambda x: torch.linalg.eigvals(x).abs().sort().values, (A,)),
    "eig_dtype": (lambda x: [t.dtype for t in torch.linalg.eig(x)], (A,)),
    "pinv": (torch.linalg.pinv, (RECT,)),
    "pinv_hermitian": (lambda x: torch.linalg.pinv(x, hermitian=True), (SPD,)),
    "matrix_exp": (torch.linalg.matrix_exp, (BATCH,)),
    "matrix_norm_fro": (torch.linalg.matrix_norm, (RECT,)),
    "matrix_norm_nuc": (lambda x: torch.linalg.matrix_norm(x, "nuc"), (RECT,)),
    "matrix_norm_2": (lambda x: torch.linalg.matrix_norm(x, 2), (RECT,)),
    "matrix_norm_inf": (lambda x: torch.linalg.matrix_norm(x, float("inf")), (RECT,)),
    "cond": (torch.linalg.cond, (A,)),
    "matrix_rank": (torch.linalg.matrix_rank, (RECT,)),
    "solve_triangular": (
        lambda a, b: torch.linalg.solve_triangular(a.triu(), b, upper=True),
        (A, B),
    ),
    "solve_triangular_right_unit": (
        lambda a, b: torch.linalg.solve_triangular(
            a.tril(), b, upper=False, left=False, unitriangular=True
        ),
        (A, B.T),
    ),
    "triangular_solve": (
        lambda a, b: torch.triangular_solve(b, a.tril(), upper=False, transpose=True),
        (A, B),
    ),
    "cholesky_solve": (
        lambda factor, b: torch.cholesky_solve(b, factor),
        (torch.linalg.cholesky(SPD), B),
    ),
    "cholesky_inverse": (torch.cholesky_inverse, (torch.linalg.cholesky(SPD),)),
}


@pytest.mark.parametrize("name", DECOMPOSITIONS)
def test_decomposition(name):
    fn, args = DECOMPOSITIONS[name]
    check(fn, *args, atol=1e-8, rtol=1e-7, jit=name in ("solve", "det", "cholesky", "inv"))


@pytest.mark.parametrize(
    "fn, match",
    [
        (torch.linalg.inv, "singular"),
        (torch.linalg.cholesky, "positive-definite"),
    ],
)
def test_errors_match_pytorch(fn, match):
    bad = torch.zeros(3, 3, dtype=F64) if fn is torch.linalg.inv else -SPD
    with pytest.raises(torch.linalg.LinAlgError, match=match):
        fn(bad)
    with torchlax_core.enable(), pytest.raises(torch.linalg.LinAlgError, match=match):
        fn(to_jax(bad))


GRADS = {
    "mm": (lambda a, b: (a @ b).sum(), (A, B)),
    "det": (lambda a: torch.linalg.det(a).sum(), (BATCH,)),
    "inv": (lambda a: torch.linalg.inv(a).sum(), (A,)),
    "solve": (lambda a, b: torch.linalg.solve(a, b).sum(), (A, B)),
    "cholesky": (lambda a: torch.linalg.cholesky(a).sum(), (SPD,)),
    "eigvalsh": (lambda a: torch.linalg.eigvalsh(a).pow(2).sum(), (SPD,)),
    "svdvals": (lambda a: torch.linalg.svdvals(a).sum(), (RECT,)),
    "slogdet": (lambda a: torch.linalg.slogdet(a)[1], (SPD,)),
}


@pytest.mark.parametrize("name", GRADS)
def test_gradients(name):
    fn, args = GRADS[name]
    grads_match(fn, list(args), atol=1e-8, rtol=1e-7)


def test_solve_left_false_grads():
    grads_match(
        lambda a, b: (torch.linalg.solve(a, b, left=False) ** 2).sum(),
        [A, B.T],
        atol=1e-8,
        rtol=1e-7,
    )


# -- LAPACK-layout factorizations, least squares, matrix functions ------------------------------


def _symmetric(n, *batch, dtype=F64, hermitian=False):
    x = torch.randn(*batch, n, n, dtype=dtype)
    return x + (x.mH if hermitian else x.mT)


def _with_zero_column(x):
    x = x.clone()
    x[..., 1:, 0] = 0
    x[..., 0, :] = 0
    return x


C128 = torch.complex128
LAPACK_LAYOUTS = {
    "geqrf_tall": (torch.geqrf, (torch.randn(2, 5, 3, dtype=F64),)),
    "geqrf_wide": (torch.geqrf, (torch.randn(3, 5, dtype=torch.float32),)),
    "geqrf_complex": (torch.geqrf, (torch.randn(4, 4, dtype=C128),)),
    "householder_product": (
        torch.linalg.householder_product,
        (torch.randn(2, 6, 4, dtype=F64), torch.randn(2, 3, dtype=F64)),
    ),
    "householder_product_no_reflectors": (
        torch.linalg.householder_product,
        (torch.randn(5, 4, dtype=F64), torch.randn(0, dtype=F64)),
    ),
    "ormqr_left_transpose": (
        lambda a, t, c: torch.ormqr(a, t, c, left=True, transpose=True),
        (torch.randn(5, 3, dtype=F64), torch.randn(3, dtype=F64), torch.randn(5, 2, dtype=F64)),
    ),
    "ormqr_right": (
        lambda a, t, c: torch.ormqr(a, t, c, left=False),
        (torch.randn(4, 4, dtype=F64), torch.randn(4, dtype=F64), torch.randn(3, 4, dtype=F64)),
    ),
    "ormqr_complex": (
        lambda a, t, c: torch.ormqr(a, t, c, transpose=True),
        (torch.randn(4, 2, dtype=C128), torch.randn(2, dtype=C128), torch.randn(4, 3, dtype=C128)),
    ),
    # Symmetric indefinite matrices need interchanges and 2x2 pivot blocks.
    "ldl_factor_indefinite": (torch.linalg.ldl_factor_ex, (_symmetric(8, 3),)),
    "ldl_factor_float32": (torch.linalg.ldl_factor, (_symmetric(6, 2, dtype=torch.float32),)),
    "ldl_factor_spd": (torch.linalg.ldl_factor_ex, (SPD,)),
    "ldl_factor_singular_info": (torch.linalg.ldl_factor_ex, (_with_zero_column(_symmetric(4)),)),
    "ldl_factor_complex_symmetric": (torch.linalg.ldl_factor_ex, (_symmetric(6, 2, dtype=C128),)),
    "ldl_factor_hermitian": (
        lambda a: torch.linalg.ldl_factor_ex(a, hermitian=True),
        (_symmetric(6, 2, dtype=C128, hermitian=True),),
    ),
    "ldl_factor_empty_batch": (torch.linalg.ldl_factor_ex, (torch.zeros(0, 2, 2, dtype=F64),)),
    "ldl_solve": (
        lambda a, b: torch.linalg.ldl_solve(*torch.linalg.ldl_factor(a), b),
        (_symmetric(7, 2), torch.randn(7, 3, dtype=F64)),
    ),
    "ldl_solve_hermitian": (
        lambda a, b: torch.linalg.ldl_solve(
            *torch.linalg.ldl_factor(a, hermitian=True), b, hermitian=True
        ),
        (_symmetric(5, dtype=C128, hermitian=True), torch.randn(5, 2, dtype=C128)),
    ),
    "polar_tall": (torch.linalg.polar, (torch.randn(2, 5, 3, dtype=F64),)),
    "polar_complex": (torch.linalg.polar, (torch.randn(4, 4, dtype=C128),)),
    "matrix_sqrth": (torch.linalg.matrix_sqrth, (SPD,)),
    # Only the lower triangle is read, and negative eigenvalues are clamped to zero.
    "matrix_sqrth_lower_clamped": (
        torch.linalg.matrix_sqrth,
        (torch.tensor([[1.0, 9.0], [2.0, -4.0]], dtype=F64),),
    ),
}


@pytest.mark.parametrize("name", LAPACK_LAYOUTS)
def test_lapack_layout(name):
    fn, args = LAPACK_LAYOUTS[name]
    check(fn, *args, atol=1e-6, rtol=1e-6)


def test_ldl_pivots_include_two_by_two_blocks():
    # The indefinite sample above must exercise the 2x2 branch, or the test proves little.
    pivots = torch.linalg.ldl_factor_ex(LAPACK_LAYOUTS["ldl_factor_indefinite"][1][0]).pivots
    assert (pivots < 0).any() and (pivots > 0).any()


def _rank_deficient(m, n):
    x = torch.randn(m, n, dtype=F64)
    x[:, -1] = x[:, 0] + x[:, 1]
    return x


LSTSQ_SHAPES = {"tall": (6, 4), "wide": (3, 5), "square": (4, 4)}


@pytest.mark.parametrize("driver", [None, "gels", "gelsy", "gelsd", "gelss"])
@pytest.mark.parametrize("shape", LSTSQ_SHAPES)
def test_lstsq(driver, shape):
    m, n = LSTSQ_SHAPES[shape]
    A = torch.randn(2, m, n, dtype=F64)
    B = torch.randn(1, m, 3, dtype=F64)  # batch dims broadcast
    check(lambda a, b: torch.linalg.lstsq(a, b, driver=driver), A, B, atol=1e-8, rtol=1e-7)


def test_lstsq_vector_rhs_float32():
    A, b = torch.randn(6, 3), torch.randn(6)
    check(lambda a, b: torch.linalg.lstsq(a, b, driver="gelsd"), A, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("driver", ["gelsy", "gelsd", "gelss"])
def test_lstsq_rank_deficient(driver):
    # Rank 3 of 4: the rank, the minimum-norm solution, and (eagerly) no residuals.
    fn = lambda a, b: torch.linalg.lstsq(a, b, driver=driver)  # noqa: E731
    check(fn, _rank_deficient(6, 4), torch.randn(6, 2, dtype=F64), atol=1e-8, rtol=1e-7, jit=False)
    check(fn, _rank_deficient(6, 4).T, torch.randn(4, 2, dtype=F64), atol=1e-8, rtol=1e-7)


def test_lstsq_rejects_unknown_driver():
    with torchlax_core.enable(), pytest.raises(RuntimeError, match="driver"):
        torch.linalg.lstsq(to_jax(A), to_jax(B), driver="gelsx")


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("norm", [1e-6, 3e-4, 0.03, 0.5, 1.2, 2.5, 30.0])
def test_matrix_exp_taylor_degrees(dtype, norm):
    # One matrix per 1-norm band of PyTorch's degree choice (and scaling and squaring beyond).
    # Seeded: the input must not depend on which tests ran before it in the worker.
    x = torch.randn(2, 5, 5, dtype=dtype, generator=torch.Generator().manual_seed(0))
    x = x / torch.linalg.matrix_norm(x, 1)[..., None, None] * norm
    if dtype == torch.float32 and norm > 5.4:
        # Scaling and squaring in float32: PyTorch's result and ours are each ~1e-5 (relative
        # to the largest entry) from the float64 truth, so they can differ from each other by
        # more than either errs (11 of 60 random inputs did at rtol 1e-5). Judged against the
        # truth instead: no worse than three times PyTorch's own error.
        truth = torch.linalg.matrix_exp(x.double())
        scale = truth.abs().amax(dim=(-1, -2), keepdim=True)
        with torchlax_core.enable():
            ours = torch.linalg.matrix_exp(to_jax(x)).cpu().double()
        theirs = torch.linalg.matrix_exp(x).double()
        our_error = ((ours - truth).abs() / scale).max().item()
        their_error = ((theirs - truth).abs() / scale).max().item()
        assert our_error <= 3 * max(their_error, 1e-7), (our_error, their_error)
        return
    rtol = 1e-5 if dtype == torch.float32 else 1e-10
    check(torch.linalg.matrix_exp, x, atol=rtol * max(1.0, norm), rtol=rtol)


def test_matrix_exp_bfloat16_is_rounded_float32():
    # PyTorch's CPU kernel is broken for bfloat16 (it misreads its coefficient tables), so the
    # reference is the float32 exponential rounded once.
    x = torch.randn(2, 4, 4) * 0.5
    expected = torch.linalg.matrix_exp(x.bfloat16().float()).bfloat16()
    with torchlax_core.enable():
        actual = torch.linalg.matrix_exp(to_jax(x.bfloat16()))
    assert actual.dtype == torch.bfloat16 and actual.shape == expected.shape
    torch.testing.assert_close(actual.cpu(), expected, atol=1e-2, rtol=1.6e-2)


def test_lstsq_gelsy_rank_of_a_large_matrix():
    # Past 48 columns the rank comes from norm estimates, not one SVD per leading triangle.
    x = torch.randn(70, 56, dtype=F64)
    x[:, -4:] = x[:, :4] @ torch.randn(4, 4, dtype=F64)
    check(torch.linalg.lstsq, x, torch.randn(70, 2, dtype=F64), atol=1e-8, rtol=1e-7)
