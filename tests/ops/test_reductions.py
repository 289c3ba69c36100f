"""Reduction semantics checked against eager PyTorch on CPU: dtypes, empty inputs, 0-d, NaN."""

from __future__ import annotations

import math

import pytest
import torch
import torchlax_core


def jx(t: torch.Tensor) -> torch.Tensor:
    with torchlax_core.enable():
        return t.to("jax")


def same(actual, expected, **kw):
    if isinstance(expected, tuple):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            same(a, e, **kw)
        return
    assert isinstance(actual, torchlax_core.Tensor), type(actual)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    torch.testing.assert_close(actual.cpu(), expected, equal_nan=True, **kw)


@pytest.mark.parametrize("dtype", [torch.bool, torch.int8, torch.int32, torch.int64])
def test_integer_and_bool_sums_and_products_are_int64(dtype):
    x = torch.tensor([[1, 0, 1], [1, 1, 0]]).to(dtype)
    for fn in (torch.sum, torch.prod):
        same(fn(jx(x)), fn(x))
        same(fn(jx(x), 1), fn(x, 1))
    same(torch.cumsum(jx(x), 0), torch.cumsum(x, 0))
    same(torch.sum(jx(x), dtype=torch.float32), torch.sum(x, dtype=torch.float32))


def test_mean_requires_floating_input():
    with pytest.raises(RuntimeError, match="floating point"):
        torch.mean(jx(torch.tensor([1, 2, 3])))
    x = torch.tensor([1, 2, 4])
    same(torch.mean(jx(x), dtype=torch.float64), torch.mean(x, dtype=torch.float64))


def test_empty_reductions():
    e = torch.empty(0, 3)
    same(torch.sum(jx(e)), torch.sum(e))
    same(torch.prod(jx(e), 0), torch.prod(e, 0))
    same(torch.mean(jx(e)), torch.mean(e))  # nan
    same(torch.sum(jx(e), 0), torch.sum(e, 0))
    same(torch.amax(jx(e), 1), torch.amax(e, 1))  # reduces the non-empty dim: fine
    with pytest.raises(IndexError):
        torch.amax(jx(e), 0)
    with pytest.raises(RuntimeError):
        torch.max(jx(e))
    with pytest.raises(IndexError):
        torch.argmax(jx(e), 0)


def test_zero_dim_inputs():
    s = torch.tensor(3.5)
    same(torch.sum(jx(s)), torch.sum(s))
    same(torch.sum(jx(s), 0), torch.sum(s, 0))
    same(torch.sum(jx(s), -1, keepdim=True), torch.sum(s, -1, keepdim=True))
    same(torch.max(jx(s), 0), tuple(torch.max(s, 0)))
    same(torch.argmax(jx(s)), torch.argmax(s))
    same(torch.cumsum(jx(s), 0), torch.cumsum(s, 0))
    same(torch.var(jx(s), correction=0), torch.var(s, correction=0))


@pytest.mark.parametrize("dim", [None, 0, -1, [0, 2], [], (1, -1)])
@pytest.mark.parametrize("keepdim", [False, True])
def test_dims_and_keepdim(dim, keepdim):
    x = torch.randn(2, 3, 4)
    kwargs = {"dim": dim} if dim is not None else {}
    same(
        torch.sum(jx(x), keepdim=keepdim, **kwargs) if kwargs else torch.sum(jx(x)),
        torch.sum(x, keepdim=keepdim, **kwargs) if kwargs else torch.sum(x),
    )
    same(
        torch.amax(jx(x), dim=[] if dim is None else dim, keepdim=keepdim),
        torch.amax(x, dim=[] if dim is None else dim, keepdim=keepdim),
    )
    same(torch.var(jx(x), dim=dim, keepdim=keepdim), torch.var(x, dim=dim, keepdim=keepdim))
    same(
        torch.linalg.vector_norm(jx(x), 3, dim=dim, keepdim=keepdim),
        torch.linalg.vector_norm(x, 3, dim=dim, keepdim=keepdim),
    )


def test_max_min_with_nan_and_ties():
    x = torch.tensor([[1.0, math.nan, 3.0, math.nan], [2.0, 5.0, 5.0, 1.0]])
    same(torch.max(jx(x), 1), tuple(torch.max(x, 1)))
    same(torch.min(jx(x), 1), tuple(torch.min(x, 1)))
    same(torch.argmax(jx(x), 1), torch.argmax(x, 1))
    same(torch.argmin(jx(x)), torch.argmin(x))
    same(torch.amax(jx(x), 0), torch.amax(x, 0))
    same(torch.aminmax(jx(x), dim=1), tuple(torch.aminmax(x, dim=1)))


def test_argmax_keepdim_without_dim():
    x = torch.randn(2, 3)
    same(torch.argmax(jx(x), keepdim=True), torch.argmax(x, keepdim=True))


@pytest.mark.parametrize("correction", [0, 1, 2, 5])
def test_var_std_correction(correction):
    x = torch.randn(4, 5, dtype=torch.float64)
    same(torch.var(jx(x), 1, correction=correction), torch.var(x, 1, correction=correction))
    same(torch.std(jx(x), 0, correction=correction), torch.std(x, 0, correction=correction))
    same(
        torch.var_mean(jx(x), 1, correction=correction),
        tuple(torch.var_mean(x, 1, correction=correction)),
    )
    same(
        torch.std_mean(jx(x), correction=correction),
        tuple(torch.std_mean(x, correction=correction)),
    )


def test_bfloat16_accumulates_in_float32():
    x = torch.full((4096,), 1.0, dtype=torch.bfloat16)
    same(torch.sum(jx(x)), torch.sum(x))
    same(torch.mean(jx(x)), torch.mean(x))


def test_logsumexp_with_infinities():
    x = torch.tensor([[-math.inf, -math.inf], [math.inf, 1.0], [1000.0, 1000.0]])
    same(torch.logsumexp(jx(x), 1), torch.logsumexp(x, 1))
    i = torch.tensor([[1, 2], [3, 4]])
    same(torch.logsumexp(jx(i), 0), torch.logsumexp(i, 0))


def test_all_any():
    x = torch.tensor([[0.0, 1.0], [math.nan, 2.0]])
    for fn in (torch.all, torch.any):
        same(fn(jx(x)), fn(x))
        same(fn(jx(x), 1), fn(x, 1))
        same(fn(jx(x), dim=(0, 1)), fn(x, dim=(0, 1)))
    u = torch.tensor([0, 3], dtype=torch.uint8)
    same(torch.all(jx(u)), torch.all(u))


def test_cumulative_ops_with_nan_and_ties():
    x = torch.tensor([1.0, 3.0, 3.0, math.nan, 5.0, 0.0])
    same(torch.cummax(jx(x), 0), tuple(torch.cummax(x, 0)))
    same(torch.cummin(jx(x), 0), tuple(torch.cummin(x, 0)))
    same(torch.cumprod(jx(x), 0), torch.cumprod(x, 0))
    same(torch.logcumsumexp(jx(x), 0), torch.logcumsumexp(x, 0))
    i = torch.tensor([[2, 2, 1], [0, 4, 4]])
    same(torch.cummax(jx(i), 1), tuple(torch.cummax(i, 1)))
    same(torch.cummin(jx(i), 1), tuple(torch.cummin(i, 1)))


def test_norms():
    x = torch.randn(3, 4)
    for p in (0, 1, 2, 3.5, math.inf, -math.inf):
        same(torch.linalg.vector_norm(jx(x), p), torch.linalg.vector_norm(x, p))
    same(torch.norm(jx(x), dim=1), torch.norm(x, dim=1))
    same(torch.norm(jx(x), p=1, dim=0, keepdim=True), torch.norm(x, p=1, dim=0, keepdim=True))


def test_count_nonzero_nansum_nanmean():
    x = torch.tensor([[0.0, math.nan, 2.0], [1.0, 0.0, math.nan]])
    same(torch.count_nonzero(jx(x)), torch.count_nonzero(x))
    same(torch.count_nonzero(jx(x), dim=1), torch.count_nonzero(x, dim=1))
    same(torch.nansum(jx(x), 1), torch.nansum(x, 1))
    same(torch.nanmean(jx(x), 0), torch.nanmean(x, 0))


def test_median_and_mode():
    x = torch.tensor([[3.0, 1.0, 2.0, 4.0], [math.nan, 1.0, 0.0, 2.0]])
    same(torch.median(jx(x[0])), torch.median(x[0]))  # lower of the two middles
    same(torch.median(jx(x)), torch.median(x))  # nan
    same(torch.median(jx(x), 1), tuple(torch.median(x, 1)))
    same(torch.nanmedian(jx(x), 1), tuple(torch.nanmedian(x, 1)))
    m = torch.tensor([[1, 2, 2, 3, 3], [5, 4, 4, 5, 0]])
    same(torch.mode(jx(m), 1), tuple(torch.mode(m, 1)))


def test_in_place_and_out_variants():
    x = torch.randn(3, 4)
    out = jx(torch.empty(4))
    assert torch.sum(jx(x), 0, out=out) is out
    same(out, torch.sum(x, 0))
    y = jx(x.clone())
    version = y._version
    assert y.cumsum_(1) is y
    assert y._version > version
    same(y, torch.cumsum(x, 1))


def test_reductions_under_jit():
    import jax

    x = torch.randn(3, 5)

    def program(a):
        t = torchlax_core.wrap(a)
        values, indices = torch.max(t, 1)
        return (
            t.sum(0).jax(),
            t.var(1).jax(),
            values.jax(),
            indices.jax(),
            torch.cummax(t, 1).indices.jax(),
        )

    with torchlax_core.enable():
        outs = jax.jit(program)(jx(x).jax())
    expected = (x.sum(0), x.var(1), *torch.max(x, 1), torch.cummax(x, 1).indices)
    for a, e in zip(outs, expected):
        same(torchlax_core.wrap(a), e)


def _jitted(fn, *tensors):
    """``fn`` run inside jax.jit on torchlax Tensors; the results come back as torchlax Tensors."""
    import jax
    from torch.utils import _pytree as pytree

    def program(*arrays):
        out = fn(*[torchlax_core.wrap(a) for a in arrays])
        return pytree.tree_map(lambda t: t.jax(), out)

    with torchlax_core.enable():
        out = jax.jit(program)(*[jx(t).jax() for t in tensors])
    return pytree.tree_map(torchlax_core.wrap, out)


COV_CASES = [
    lambda x, fw, aw: torch.cov(x),
    lambda x, fw, aw: torch.cov(x, correction=0),
    lambda x, fw, aw: torch.cov(x[0]),
    lambda x, fw, aw: torch.cov(x, fweights=fw),
    lambda x, fw, aw: torch.cov(x, aweights=aw),
    lambda x, fw, aw: torch.cov(x, correction=3, fweights=fw, aweights=aw),
    lambda x, fw, aw: torch.corrcoef(x),
]


@pytest.mark.parametrize("fn", COV_CASES)
def test_cov_and_corrcoef_eager_and_jit(fn):
    x = torch.randn(3, 6, dtype=torch.float64)
    fw = torch.tensor([1, 2, 0, 3, 1, 1])
    aw = torch.rand(6, dtype=torch.float64)
    expected = fn(x, fw, aw)
    same(fn(jx(x), jx(fw), jx(aw)), expected)
    same(_jitted(fn, x, fw, aw), expected)


def test_cov_integer_input_and_too_few_observations():
    x = torch.tensor([[1, 2, 4], [0, 3, 3]])
    same(torch.cov(jx(x)), torch.cov(x))
    one = torch.tensor([[2.0], [3.0]])
    with pytest.warns(UserWarning):
        expected = torch.cov(one)
    with pytest.warns(UserWarning, match="degrees of freedom"):
        same(torch.cov(jx(one)), expected)
    with pytest.raises(RuntimeError, match="negative"):
        torch.cov(jx(x), fweights=jx(torch.tensor([1, -1, 2])))


def test_cov_gradient():
    x = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
    aw = torch.rand(5, dtype=torch.float64)
    (torch.cov(x, aweights=aw) ** 2).sum().backward()
    xj = jx(x.detach()).requires_grad_()
    (torch.cov(xj, aweights=jx(aw)) ** 2).sum().backward()
    same(xj.grad, x.grad)


@pytest.mark.parametrize("p", [0.0, 1.0, 2.0, 3.5, math.inf])
@pytest.mark.parametrize(
    "mode",
    [
        "use_mm_for_euclid_dist_if_necessary",
        "use_mm_for_euclid_dist",
        "donot_use_mm_for_euclid_dist",
    ],
)
def test_cdist(p, mode):
    a, b = torch.randn(2, 30, 4, dtype=torch.float64), torch.randn(1, 7, 4, dtype=torch.float64)
    same(torch.cdist(jx(a), jx(b), p, compute_mode=mode), torch.cdist(a, b, p, compute_mode=mode))


@pytest.mark.parametrize("p", [0.0, 1.0, 2.0, 0.5, math.inf])
def test_pdist_dist_renorm_trace(p):
    x = torch.randn(6, 3)
    same(torch.nn.functional.pdist(jx(x), p), torch.nn.functional.pdist(x, p))
    same(torch.dist(jx(x), jx(x[:1]), p), torch.dist(x, x[:1], p))
    if p > 0:
        same(torch.renorm(jx(x), p, 0, 1.0), torch.renorm(x, p, 0, 1.0))
        same(torch.renorm(jx(x), p, 1, 0.5), torch.renorm(x, p, 1, 0.5))
    same(torch.trace(jx(x)), torch.trace(x))
    same(
        torch.trace(jx(torch.arange(12).reshape(3, 4))), torch.trace(torch.arange(12).reshape(3, 4))
    )


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize("initial", [None, 2.0])
def test_segment_reduce(reduce, initial):
    data = torch.randn(3, 5, 2)
    data[0, 1, 0] = math.nan
    lengths = torch.tensor([[2, 0, 3], [1, 1, 3], [5, 0, 0]])
    offsets = torch.cat([torch.zeros(3, 1, dtype=torch.long), lengths.cumsum(1)], 1)
    for name, bounds in (("lengths", lengths), ("offsets", offsets)):
        expected = torch.segment_reduce(data, reduce, axis=1, initial=initial, **{name: bounds})
        got = torch.segment_reduce(jx(data), reduce, axis=1, initial=initial, **{name: jx(bounds)})
        same(got, expected)
        jitted = _jitted(
            lambda d, s, name=name: torch.segment_reduce(
                d, reduce, axis=1, initial=initial, unsafe=True, **{name: s}
            ),
            data,
            bounds,
        )
        same(jitted, expected)


def test_segment_reduce_checks_lengths_eagerly():
    with pytest.raises(RuntimeError, match="sum"):
        torch.segment_reduce(jx(torch.randn(5)), "sum", lengths=jx(torch.tensor([1, 2])))


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.bool]
)
def test_hash_tensor(dtype):
    x = (torch.randn(3, 4) * 10).to(dtype)
    for kwargs in ({}, {"dim": 1}, {"dim": 0, "keepdim": True}):
        same(torch.hash_tensor(jx(x), **kwargs), torch.hash_tensor(x, **kwargs))
