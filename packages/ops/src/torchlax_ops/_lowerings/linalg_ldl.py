"""``torch.linalg.ldl_factor_ex`` and ``ldl_solve``: LDL^T with Bunch-Kaufman pivoting, as
LAPACK's sytrf/hetrf (lower) and sytrs lay out their results.
"""

from __future__ import annotations

import functools

import jax
import jax.core
import jax.numpy as jnp

from .. import _aten
from .._table import lowering
from .linalg import _linalg_check_errors, _mH, _mT

aten = _aten.aten  # (an op this torch lacks: a Missing, skipped)


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
