"""``torch.linalg.lstsq``: LAPACK's four drivers (gels, gelsy, gelsd, gelss) in JAX."""

from __future__ import annotations

import functools

import jax
import jax.core
import jax.numpy as jnp

from .. import _aten
from .._table import lowering
from .linalg import _broadcast_batch, _empty, _mH, _mT, _triangular
from .matmul import matmul

aten = _aten.aten  # (an op this torch lacks: a Missing, skipped)


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
