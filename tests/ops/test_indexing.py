"""Indexing, scatter/gather, sorting and data-dependent ops against eager PyTorch on the CPU."""

import jax
import pytest
import torch
import torchlax_core
from torch.utils import _pytree as pytree
from torchlax_core import Tensor
from torchlax_ops._lowerings.indexing import DataDependentShapeError


@pytest.fixture(autouse=True)
def _enabled():
    with torchlax_core.enable():  # device="jax" and JAX's 64-bit mode, as torchlax programs run
        yield


def to_jax(value):
    return pytree.tree_map(lambda t: t.to("jax") if isinstance(t, torch.Tensor) else t, value)


def to_cpu(value):
    return pytree.tree_map(lambda t: t.cpu() if isinstance(t, Tensor) else t, value)


def assert_same(got, expected, exact=True):
    got_flat, _ = pytree.tree_flatten(got)
    exp_flat, _ = pytree.tree_flatten(expected)
    assert len(got_flat) == len(exp_flat)
    for g, e in zip(got_flat, exp_flat, strict=True):
        if isinstance(e, torch.Tensor):
            assert g.dtype == e.dtype and g.shape == e.shape, (g.dtype, g.shape, e.dtype, e.shape)
            tol = {"rtol": 0, "atol": 0} if exact else {}
            torch.testing.assert_close(g, e, equal_nan=True, **tol)
        else:
            assert g == e


def run_jit(fn, *args):
    flat, spec = pytree.tree_flatten(args)
    positions = [i for i, a in enumerate(flat) if isinstance(a, torch.Tensor)]

    def traced(*arrays):
        values = list(flat)
        for i, a in zip(positions, arrays, strict=True):
            values[i] = torchlax_core.wrap(a)
        with torch.device("jax"):
            out = fn(*pytree.tree_unflatten(values, spec))
        out = tuple(out) if isinstance(out, tuple) else out  # torch.return_types are no JAX type
        return pytree.tree_map(lambda t: t.jax() if isinstance(t, Tensor) else t, out)

    out = jax.jit(traced)(*[flat[i].to("jax").jax() for i in positions])
    return pytree.tree_map(
        lambda a: torchlax_core.wrap(a).cpu() if isinstance(a, jax.Array) else a, out
    )


def check(fn, *args, jit=True, exact=True):
    """``fn(*args)`` on torchlax Tensors equals it on CPU tensors, eagerly and under jax.jit."""
    expected = fn(*args)
    with torch.device("jax"):  # tensors the function creates go where PyTorch's would
        got = fn(*to_jax(args))
    assert_same(to_cpu(got), expected, exact)
    if jit:
        assert_same(run_jit(fn, *args), expected, exact)


torch.manual_seed(0)
x = torch.randn(4, 5, 6)
G1 = torch.randint(0, 5, (4, 3, 2)).tolist()
G2 = torch.randint(0, 6, (2, 5, 6)).tolist()
xi = torch.arange(120).reshape(4, 5, 6)
mask = x > 0


def i():  # literals: on the CPU in the PyTorch run, on device jax in the torchlax run
    return torch.tensor([0, 3, -1])


def j():
    return torch.tensor([[1, 0], [3, 2]])


@pytest.mark.parametrize(
    "fn",
    [
        lambda a: a[i()],
        lambda a: a[:, i()],
        lambda a: a[i(), torch.tensor([1, 0, 4])],
        lambda a: a[j()],
        lambda a: a[:, j(), 1:3],
        lambda a: a[i(), :, i()],
        lambda a: a[None, i(), ..., i()],
        lambda a: a[1:, j(), j()],
        lambda a: a[..., i()],
        lambda a: a[i(), None],
        lambda a: a[j(), :, torch.tensor([2])],
        lambda a: a[i().int()],
        lambda a: a[:, torch.tensor([], dtype=torch.int64)],
        lambda a: torch.ops.aten.index.Tensor(a, [None, i()]),
        lambda a: torch.ops.aten.index.Tensor(a, [i(), None, j()[:, :1]]),
    ],
)
def test_advanced_indexing(fn):
    check(fn, x)
    check(fn, xi)


def test_bool_mask_indexing_is_eager_only():
    check(lambda a, m: a[m], x, mask, jit=False)
    check(lambda a, m: a[:, m[0, :, 0]], x, mask, jit=False)
    check(lambda a, m: a[m[..., 0], 2:], x, mask, jit=False)
    check(
        lambda a, m: a[m], x, torch.zeros(4, 5, 6, dtype=torch.bool), jit=False
    )  # selects nothing
    with pytest.raises(DataDependentShapeError, match="aten.index.Tensor"):
        run_jit(lambda a, m: a[m], x, mask)


@pytest.mark.parametrize(
    "fn",
    [
        lambda a, v, m: a.index_put((i(),), v[0, 0, 0]),
        lambda a, v, m: a.index_put((i(), j()[0, :1]), v[0, 0, 0]),
        lambda a, v, m: a.index_put((torch.tensor([1, 1, 2]),), v[:3], accumulate=True),
        lambda a, v, m: torch.ops.aten.index_put(
            a, [None, torch.tensor([0, 0])], v[:, :2], accumulate=True
        ),
        lambda a, v, m: torch.ops.aten.index_put(
            a, [None, None, torch.tensor([5, -6])], v[..., :2]
        ),
        lambda a, v, m: a.index_put((m,), v[0, 0, 0]),
        lambda a, v, m: a.index_put((m,), v[0, 0, :1], accumulate=True),
        lambda a, v, m: a.index_put((m[:, :, 0],), v[0, 0]),
        lambda a, v, m: torch.ops.aten.index_put(a, [None, m[0]], v[:, 0, :1]),
    ],
)
def test_index_put(fn):
    check(fn, x, -x, mask)


def test_index_put_with_per_element_mask_values_is_eager_only():
    values = torch.arange(float(mask.sum()))
    check(lambda a, m, v: a.index_put((m,), v), x, mask, values, jit=False)
    with pytest.raises(DataDependentShapeError):
        run_jit(lambda a, m, v: a.index_put((m,), v), x, mask, values)


def test_setitem_forms():
    def program(a, m, v):
        a = a.clone()
        a[i()] += 1
        a[torch.tensor([1, 1])] += v[0]  # duplicates: the last write wins, the same value here
        a[m] = 0.5
        a[:, 2][m[:, 2]] = -2.0
        a[1:3, [0, 4]] = v[1:3, :2]
        a.index_put_((i(), i()), v[0, 0, :1], accumulate=True)
        return a

    check(program, x, mask, -x)


@pytest.mark.parametrize(
    "fn",
    [
        lambda a: a.index_select(0, torch.tensor([0, 3, 1])),
        lambda a: a.index_select(-1, j()[0]),
        lambda a: a.index_select(1, torch.tensor(2)),
        lambda a: a.gather(1, torch.tensor(G1)),
        lambda a: a.gather(-1, torch.tensor(G2)),
        lambda a: torch.take_along_dim(a, torch.tensor([[[1], [0], [4]]]), 1),
        lambda a: a.take(j()),
        lambda a: a.take(torch.tensor([[0, -1], [7, 100]])),
        lambda a: a.scatter(0, torch.tensor([[[3, 1, 0]]]), a[:1, :1, :3] * 2),
        lambda a: a.scatter(2, torch.tensor([[[5], [0]]]), 9),
        lambda a: a.scatter(1, torch.tensor([[[4, 4]]]), a[:1, :1, :2], reduce="add"),
        lambda a: a.scatter(1, torch.tensor([[[4, 4]]]), 3, reduce="multiply"),
        lambda a: a.scatter_add(0, torch.tensor([[[1, 1, 2]], [[1, 0, 0]]]), a[:2, :1, :3]),
        lambda a: a.index_add(1, torch.tensor([0, 0, 4]), a[:, :3]),
        lambda a: a.index_add(0, torch.tensor([2]), a[:1], alpha=2),
        lambda a: a.index_copy(2, torch.tensor([5, 0]), a[:, :, :2] * 3),
        lambda a: a.index_fill(1, torch.tensor([0, -1]), -7),
        lambda a: a.index_fill(0, torch.tensor([1]), a[0, 0, 0]),
        lambda a: a.put(torch.tensor([0, 5, 0]), a[0, 0, :3], accumulate=True),
        lambda a: a.put(torch.tensor([7, -1]), a[1, 1, :2]),
    ],
)
def test_gather_scatter_family(fn):
    check(fn, x)
    check(fn, xi)


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_scatter_reduce(reduce, include_self, dtype):
    src = (torch.randn(3, 4) * 10).to(dtype)
    base = (torch.randn(3, 5) * 10).to(dtype)
    index = [[0, 0, 4, 1], [2, 2, 2, 2], [1, 3, 1, 3]]
    check(
        lambda a, s: a.scatter_reduce(1, torch.tensor(index), s, reduce, include_self=include_self),
        base,
        src,
        exact=False,
    )


@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_index_reduce(reduce, include_self, dtype):
    base = (torch.randn(3, 5) * 10).to(dtype)
    source = (torch.randn(4, 5) * 10).to(dtype)
    check(
        lambda a, s: a.index_reduce(
            0, torch.tensor([0, 2, 0, 0]), s, reduce, include_self=include_self
        ),
        base,
        source,
        exact=False,
    )


def test_scatter_reduce_amax_propagates_nan():
    base = torch.tensor([1.0, 2.0, 3.0])
    src = torch.tensor([float("nan"), 5.0])
    check(lambda a, s: a.scatter_reduce(0, torch.tensor([0, 1]), s, "amax"), base, src)


def test_masked_scatter_and_select():
    check(lambda a, m: a.masked_scatter(m, a.flip(0)), x, mask)
    check(lambda a, m: a.masked_select(m), x, mask, jit=False)
    check(lambda a, m: a.masked_select(m[0, 0]), x, mask, jit=False)
    with pytest.raises(DataDependentShapeError, match="masked_select"):
        run_jit(lambda a, m: a.masked_select(m), x, mask)


def test_nonzero_and_friends():
    t = torch.tensor([[0, 1, 0], [2, 0, 3]])
    check(lambda a: a.nonzero(), t, jit=False)
    check(lambda a: torch.argwhere(a), t, jit=False)
    check(lambda a: torch.where(a), t, jit=False)
    check(lambda a: a.nonzero(as_tuple=True), t, jit=False)
    check(lambda a: a[0, 1].nonzero(), t, jit=False)
    check(lambda a: torch.nonzero_static(a, size=5), t)
    check(lambda a: torch.nonzero_static(a, size=2, fill_value=-7), t)
    check(lambda a: torch.nonzero_static(a, size=1), t)
    with pytest.raises(DataDependentShapeError, match="nonzero_static"):
        run_jit(lambda a: a.nonzero(), t)


def test_unique_family_is_eager():
    t = torch.tensor([[3, 1, 3], [2, 1, 1], [3, 1, 3]])
    check(lambda a: torch.unique(a), t, jit=False)
    check(lambda a: torch.unique(a, return_inverse=True, return_counts=True), t, jit=False)
    check(lambda a: torch.unique(a, dim=0, return_inverse=True, return_counts=True), t, jit=False)
    check(lambda a: torch.unique(a, dim=1), t, jit=False)
    check(lambda a: torch.unique_consecutive(a), t, jit=False)
    check(
        lambda a: torch.unique_consecutive(a, return_inverse=True, return_counts=True), t, jit=False
    )
    check(
        lambda a: torch.unique_consecutive(a, return_inverse=True, return_counts=True, dim=0),
        t,
        jit=False,
    )
    check(lambda a: torch.unique(a.float()), t, jit=False)
    with pytest.raises(DataDependentShapeError):
        run_jit(lambda a: torch.unique(a), t)


def test_unique_keeps_nan_apart_as_pytorch():
    # NaN != NaN: PyTorch keeps every NaN (every row holding one) a unique value of its own.
    flat = torch.tensor([float("nan"), 1.0, float("nan"), 0.0, 1.0, -0.0])
    check(lambda a: torch.unique(a, return_inverse=True, return_counts=True), flat, jit=False)
    rows = torch.tensor([[1.0, float("nan")], [0.0, 2.0], [1.0, float("nan")], [0.0, 2.0]])
    for dim in (0, 1):
        check(
            lambda a, d=dim: torch.unique(a, dim=d, return_inverse=True, return_counts=True),
            rows,
            jit=False,
        )
    # Where NaN leaves PyTorch's row order undefined (its comparator skips NaN), the rows,
    # counts and inverse still agree: each NaN row is its own group.
    mixed = torch.tensor([[float("nan"), 1.0], [0.0, 2.0], [float("nan"), 1.0], [-1.0, 3.0]])
    cpu = torch.unique(mixed, dim=0, return_inverse=True, return_counts=True)
    got = to_cpu(torch.unique(mixed.to("jax"), dim=0, return_inverse=True, return_counts=True))
    assert got[0].shape == cpu[0].shape == (4, 2) and got[2].tolist() == [1, 1, 1, 1]
    torch.testing.assert_close(got[0][got[1]], mixed, equal_nan=True, rtol=0, atol=0)


def test_bincount_and_histc():
    t = torch.tensor([1, 4, 1, 0, 4, 4])
    check(lambda a: torch.bincount(a), t, jit=False)
    check(lambda a: torch.bincount(a, minlength=8), t, jit=False)
    check(lambda a: torch.bincount(a, a.float()), t, jit=False)
    check(lambda a: torch.bincount(a, a.double()), t, jit=False)
    check(lambda a: torch.bincount(a[:0]), t, jit=False)
    with pytest.raises(DataDependentShapeError):
        run_jit(lambda a: torch.bincount(a), t)
    check(lambda a: torch.histc(a), x)
    check(lambda a: torch.histc(a, bins=7, min=-1, max=1), x)
    check(
        lambda a: torch.histc(a, bins=4, min=0, max=3),
        torch.tensor([0.0, 1.0, 1.5, 3.0, 3.5, -1.0]),
    )
    check(lambda a: torch.histc(a, bins=3), torch.tensor([2.0, 2.0]))


nan_data = torch.tensor(
    [
        [3.0, float("nan"), 1.0, 1.5, -2.0, float("nan"), 7.0],
        [0.5, 0.25, -1.0, float("inf"), 2.0, -float("inf"), 0.0],
    ]
)


@pytest.mark.parametrize(
    "fn",
    [
        lambda a: a.sort(),
        lambda a: a.sort(descending=True),
        lambda a: a.sort(0),
        lambda a: a.sort(stable=True),
        lambda a: a.sort(dim=0, descending=True, stable=True),
        lambda a: a.argsort(),
        lambda a: a.argsort(descending=True),
        lambda a: a.argsort(dim=0, stable=True),
        lambda a: a.msort(),
        lambda a: a.topk(3),
        lambda a: a.topk(2, largest=False),
        lambda a: a.topk(1, dim=0),
        lambda a: a.kthvalue(2),
        lambda a: a.kthvalue(7),
        lambda a: a.kthvalue(1, 0, keepdim=True),
        lambda a: a[0, 0].sort(),
        lambda a: a[0, 0].topk(1),
        lambda a: a[:, :0].sort(),
    ],
)
def test_sort_family_nan_is_largest(fn):
    check(fn, nan_data)


def test_stable_sort_keeps_order_of_ties():
    check(lambda a: a.sort(stable=True), torch.tensor([True, False, True, False, False]))
    ties = torch.tensor([[3, 1, 3, -2, 1, 3], [0, 0, 5, 5, 0, -7]])
    check(lambda a: a.sort(stable=True), ties)
    check(lambda a: a.sort(descending=True, stable=True), ties)
    check(lambda a: a.sort(dim=0, descending=True, stable=True), ties)
    check(lambda a: a.argsort(stable=True, descending=True), ties.double())


def test_zero_dim_tensor_index_is_eager():
    # PyTorch turns a 0-d integer index into a Python int (item()), so it cannot be traced.
    check(lambda a: a[torch.tensor(1)], x, jit=False)


def test_searchsorted_and_bucketize():
    seq = torch.tensor([1.0, 2.0, 2.0, 5.0])
    values = torch.tensor([[0.0, 2.0], [5.0, 9.0]])
    check(lambda s, v: torch.searchsorted(s, v), seq, values)
    check(lambda s, v: torch.searchsorted(s, v, right=True, out_int32=True), seq, values)
    check(lambda s, v: torch.searchsorted(s, v, side="right"), seq, values)
    check(lambda s, v: torch.searchsorted(s, 2.0), seq, values)
    check(
        lambda s, v: torch.searchsorted(s.flip(0), v, sorter=torch.tensor([3, 2, 1, 0])),
        seq,
        values,
    )
    rows = torch.tensor([[1.0, 3.0, 5.0], [0.0, 10.0, 20.0]])
    check(lambda s, v: torch.searchsorted(s, v), rows, values)
    check(lambda s, v: torch.bucketize(v, s), seq, values)
    check(lambda s, v: torch.bucketize(v, s, right=True, out_int32=True), seq, values)
    check(lambda s, v: torch.bucketize(3, s), seq, values)


def test_int64_indices_stay_int64_and_empty_indices_work():
    check(lambda a: (a.argsort(), a.topk(2)[1], a.sort()[1]), x)
    check(lambda a: a[torch.empty(0, dtype=torch.int64)], x)
    check(lambda a: a.index_select(0, torch.empty(0, dtype=torch.int64)), x)
    check(lambda a: a[:0].gather(1, torch.empty(0, 5, 6, dtype=torch.int64)), x)


def test_writes_through_index_ops_reach_base():
    def program(a, m):
        a = a.clone()
        view = a[1:]
        view.index_add_(0, torch.tensor([0, 0]), torch.ones(2, 5, 6))
        view[:, 0].scatter_(1, torch.tensor([[0, 1]] * 3), 5.0)
        a[0].masked_fill_(m[0], 0.0)
        return a

    check(program, x, mask)


def test_bool_accumulation_is_logical():
    base = torch.tensor([[True, False, False], [False, False, True]])
    src = torch.tensor([[True, False, True], [False, True, False]])
    check(lambda a, s: a.index_add(1, torch.tensor([2, 0, 2]), s), base, src)
    check(lambda a, s: a.scatter_add(1, torch.tensor([[1, 1, 0], [2, 2, 2]]), s), base, src)
    check(
        lambda a, s: a.scatter(1, torch.tensor([[1, 1, 0], [2, 2, 2]]), s, reduce="multiply"),
        base,
        src,
    )
    check(lambda a, s: a.put(torch.tensor([1, 1, 4]), s[0], accumulate=True), base, src)
    check(lambda a, s: a.index_put((torch.tensor([0, 0]),), s, accumulate=True), base, src)


def test_one_hot_with_class_count():
    check(lambda a: torch.nn.functional.one_hot(a, 5), torch.tensor([[0, 3], [4, 1]]))


def test_kthvalue_picks_the_same_tie_as_pytorch():
    # Rows of random ties and NaN rows: the k-th value is unique, among tied values or among NaNs
    # at every position. k is traced, so one compile per rows shape and dtype serves every k;
    # jit is checked in test_sort_family_nan_is_largest.
    torch.manual_seed(1)
    ties = torch.randint(-3, 4, (66, 7))
    nan = float("nan")
    row = [1.0, nan, 1.0, 0.0, nan, 1.0, 1.0]
    nan_rows = [row[r:] + row[:r] for r in range(7)]
    nan_rows += [
        [nan] * 5 + [0.0, 1.0],
        [0.0, 0.0, 0.0, 1.0, 1.0, 1.0, nan],
        [2.0, 1, nan, 1, 0, nan, 1],
    ]
    rows = torch.cat([ties.double(), torch.tensor(nan_rows)])
    for k in range(1, 8):
        check(lambda a, k=k: a.kthvalue(k), rows, jit=False)
    # Another dim of a strided tensor, moved to the same (76, 7) rows: no new compile.
    check(
        lambda a: a.kthvalue(5, 1, keepdim=True), rows.reshape(4, 19, 7).transpose(1, 2), jit=False
    )
    check(lambda a: a.kthvalue(3, 0), ties.t(), jit=False)
    check(lambda a: a.kthvalue(4), rows.to(torch.bfloat16), jit=False)


@pytest.mark.parametrize(
    "fn",
    [
        lambda a: torch.histogram(a, 5),
        lambda a: torch.histogram(a, 4, range=(-1.0, 0.5)),
        lambda a: torch.histogram(a, 3, density=True),
        lambda a: torch.histogram(a, 6, weight=a.abs()),
        lambda a: torch.histogram(a, torch.tensor([-2.0, -0.5, 0.0, 0.1, 3.0], dtype=a.dtype)),
        lambda a: torch.histogram(a[:0], 3),
        lambda a: torch.histogram(torch.ones(4, dtype=a.dtype), 2),
        lambda a: torch.histogramdd(a.reshape(-1, 3), [2, 3, 4]),
        lambda a: torch.histogramdd(a.reshape(-1, 2), 3, range=[-1.0, 1.0, 0.0, 2.0], density=True),
        lambda a: torch.histogramdd(
            a.reshape(-1, 2),
            [
                torch.tensor([-1.0, 0.0, 1.0], dtype=a.dtype),
                torch.tensor([-3.0, 3.0], dtype=a.dtype),
            ],
        ),
    ],
)
def test_histogram_and_histogramdd(fn):
    check(lambda a: tuple(fn(a)), x.double(), exact=False)  # edges: XLA may round an ulp apart


def test_unsafe_masked_index_ops_clamp_masked_off_indices():
    idx = torch.tensor([[0, 7], [-9, 2]])
    keep = torch.tensor([[True, False], [False, True]])
    check(
        lambda a, m, i: torch.ops.aten._unsafe_masked_index(a, m, [None, i], -1.5), x[0], keep, idx
    )
    values = torch.arange(4.0).reshape(2, 2) + 1
    check(
        lambda a, m, i, v: torch.ops.aten._unsafe_masked_index_put_accumulate(a, m, [i], v),
        torch.zeros(5),
        keep,
        idx,
        values,
    )
    check(
        lambda a, m, i: torch.ops.aten._unsafe_masked_index(a, m, [i], 3),
        torch.zeros(0, 2),
        keep,
        idx,
    )


def test_index_fill_with_a_cpu_index_as_pytorch_devices():
    from torchlax_core import DeviceMismatchError

    x = torch.zeros(3, 4)
    expected = x.index_fill(1, torch.tensor(2), 5.0)
    # A 0-d CPU index acts as a scalar, as next to CUDA tensors; a 1-d one raises as CUDA does.
    assert_same(to_cpu(to_jax(x).index_fill(1, torch.tensor(2), 5.0)), expected)
    with pytest.raises(DeviceMismatchError, match="index_fill.*'index'"):
        to_jax(x).index_fill(1, torch.tensor([2]), 5.0)


def _raised(fn, device):
    try:
        fn(device)
    except Exception as e:  # noqa: BLE001  the exception itself is what is compared
        return type(e), str(e)
    raise AssertionError(f"no exception on {device}")


@pytest.mark.parametrize(
    "fn",
    [
        lambda d: torch.empty(10, 0, device=d)[:, [0, 1]],  # a zero-size dimension
        lambda d: torch.empty(0, 3, device=d)[[0]],
        lambda d: torch.empty(0, 3, device=d).index_put_(
            (torch.tensor([0], device=d),), torch.tensor(1.0, device=d)
        ),
        lambda d: torch.empty(3, 4, 5, device=d)[:, :, [7]],  # numbered among indexed dims
        lambda d: torch.empty(3, 4, 5, device=d)[[0], :, [-7]],
        lambda d: torch.empty(10, 3, device=d).__setitem__((slice(None), [4]), 1.0),
    ],
)
def test_out_of_bounds_index_messages_as_pytorch(fn):
    assert _raised(fn, "jax") == _raised(fn, "cpu")


def test_empty_index_of_a_zero_size_dimension_is_fine():
    check(lambda t: (t[:, torch.tensor([], dtype=torch.long)], t[[1, 2]]), torch.empty(10, 0))
