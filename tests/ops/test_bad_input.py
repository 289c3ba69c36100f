"""Bad values and dtypes raise what PyTorch raises: eagerly always, compiled in checked mode.

Each case runs on eager PyTorch's CPU first; torchlax must raise the same exception type with
the same message (the indices are named as PyTorch names them).
"""

import fresh_python
import jax
import jax.numpy as jnp
import pytest
import torch
import torch.nn.functional as F
import torchlax
import torchlax_core
from torch.utils import _pytree as pytree
from torchlax_core import check, check_index, checked, raise_error


@pytest.fixture(autouse=True)
def _enabled():
    with torchlax_core.enable():
        yield


def to_jax(value):
    return pytree.tree_map(lambda t: t.to("jax") if isinstance(t, torch.Tensor) else t, value)


def _x():
    return torch.arange(12, dtype=torch.float32).reshape(3, 4)


# (id, function of the inputs, inputs): each raises on PyTorch's CPU.
BAD_VALUES = [
    ("index_select", lambda x, i: torch.index_select(x, 0, i), (_x(), torch.tensor([3]))),
    ("index_select_negative", lambda x, i: torch.index_select(x, 0, i), (_x(), torch.tensor([-1]))),
    ("gather", lambda x, i: torch.gather(x, 1, i), (_x(), torch.tensor([[4]]))),
    ("gather_negative", lambda x, i: torch.gather(x, 1, i), (_x(), torch.tensor([[-1]]))),
    ("take", lambda x, i: torch.take(x, i), (_x(), torch.tensor([12]))),
    ("take_negative", lambda x, i: torch.take(x, i), (_x(), torch.tensor([-13]))),
    ("getitem", lambda x, i: x[i], (_x(), torch.tensor([0, 3]))),
    ("getitem_negative", lambda x, i: x[i], (_x(), torch.tensor([-4]))),
    ("setitem", lambda x, i: x.clone().__setitem__(i, 1.0), (_x(), torch.tensor([3]))),
    (
        "index_put_",
        lambda x, i: x.clone().index_put_((i,), torch.tensor(1.0)),
        (_x(), torch.tensor([3])),
    ),
    (
        "index_put_accumulate",
        lambda x, i: x.clone().index_put_((i,), torch.tensor(1.0), accumulate=True),
        (_x(), torch.tensor([3])),
    ),
    (
        "index_add",
        lambda x, i: x.index_add(0, i, torch.ones(1, 4, device=x.device)),
        (_x(), torch.tensor([3])),
    ),
    (
        "index_copy",
        lambda x, i: x.index_copy(0, i, torch.ones(1, 4, device=x.device)),
        (_x(), torch.tensor([-1])),
    ),
    ("index_fill", lambda x, i: x.index_fill(0, i, 1.0), (_x(), torch.tensor([-4]))),
    (
        "scatter",
        lambda x, i: x.scatter(1, i, torch.ones(1, 1, device=x.device)),
        (_x(), torch.tensor([[4]])),
    ),
    ("scatter_value", lambda x, i: x.scatter(1, i, 1.0), (_x(), torch.tensor([[-1]]))),
    (
        "scatter_add",
        lambda x, i: x.scatter_add(1, i, torch.ones(1, 1, device=x.device)),
        (_x(), torch.tensor([[4]])),
    ),
    (
        "put_",
        lambda x, i: x.clone().put_(i, torch.ones(1, device=x.device)),
        (_x(), torch.tensor([12])),
    ),
    ("embedding", lambda w, i: F.embedding(i, w), (torch.randn(10, 3), torch.tensor([[1, 10]]))),
    (
        "embedding_negative",
        lambda w, i: F.embedding(i, w),
        (torch.randn(10, 3), torch.tensor([-1])),
    ),
    (
        "cross_entropy",
        lambda x, t: F.cross_entropy(x, t),
        (torch.randn(2, 3), torch.tensor([0, 3])),
    ),
    (
        "cross_entropy_negative",
        lambda x, t: F.cross_entropy(x, t),
        (torch.randn(2, 3), torch.tensor([0, -5])),
    ),
    (
        "cross_entropy_2d",
        lambda x, t: F.cross_entropy(x, t),
        (torch.randn(2, 3, 4), torch.full((2, 4), 3)),
    ),
    ("nll_loss", lambda x, t: F.nll_loss(x, t), (torch.randn(2, 3), torch.tensor([0, 3]))),
    (
        "nll_loss2d",
        lambda x, t: F.nll_loss(x, t),
        (torch.randn(2, 3, 2, 2), torch.full((2, 2, 2), 3)),
    ),
    ("one_hot", lambda t: F.one_hot(t, 3), (torch.tensor([0, 3]),)),
    ("one_hot_negative", lambda t: F.one_hot(t, 3), (torch.tensor([-1]),)),
    ("bincount", torch.bincount, (torch.tensor([-1, 2]),)),
    ("multinomial_negative", lambda p: torch.multinomial(p, 1), (torch.tensor([0.5, -0.1]),)),
    ("multinomial_nan", lambda p: torch.multinomial(p, 1), (torch.tensor([0.5, float("nan")]),)),
    ("multinomial_zero_sum", lambda p: torch.multinomial(p, 1), (torch.tensor([0.0, 0.0]),)),
    ("remainder", torch.remainder, (torch.tensor([1, 2]), torch.tensor([1, 0]))),
    ("remainder_scalar", lambda a: torch.remainder(a, 0), (torch.tensor([1, 2]),)),
    ("fmod", torch.fmod, (torch.tensor([1]), torch.tensor([0]))),
    ("floor_divide", torch.floor_divide, (torch.tensor([1]), torch.tensor([0]))),
    (
        "div_trunc",
        lambda a, b: torch.div(a, b, rounding_mode="trunc"),
        (torch.tensor([1]), torch.tensor([0])),
    ),
    ("mm_int_float", torch.mm, (torch.ones(2, 2, dtype=torch.int64), torch.ones(2, 2))),
    ("mm_double_float", torch.mm, (torch.ones(2, 2, dtype=torch.float64), torch.ones(2, 2))),
    ("matmul", torch.matmul, (torch.ones(2, 2, dtype=torch.int64), torch.ones(2, 2))),
    ("matmul_vectors", torch.matmul, (torch.ones(2, dtype=torch.int64), torch.ones(2))),
    ("matmul_matrix_vector", torch.matmul, (torch.ones(2, 2, dtype=torch.int64), torch.ones(2))),
    ("bmm", torch.bmm, (torch.ones(1, 2, 2, dtype=torch.int64), torch.ones(1, 2, 2))),
    (
        "addmm",
        torch.addmm,
        (torch.ones(2, 2), torch.ones(2, 2, dtype=torch.int64), torch.ones(2, 2)),
    ),
    (
        "addmm_self",
        torch.addmm,
        (torch.ones(2, 2, dtype=torch.float64), torch.ones(2, 2), torch.ones(2, 2)),
    ),
]

FULL = [
    ("full_nan_int64", (2,), float("nan"), torch.int64),
    ("full_inf_int32", (2,), float("inf"), torch.int32),
    ("full_300_uint8", (2,), 300, torch.uint8),
    ("full_1e39_float32", (2,), 1e39, torch.float32),
]


def _error(fn, *args):
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001 - the type is what is compared
        return type(exc), str(exc).splitlines()[0]
    return None


@pytest.mark.parametrize("fn,args", [c[1:] for c in BAD_VALUES], ids=[c[0] for c in BAD_VALUES])
def test_bad_value_raises_as_pytorch(fn, args):
    expected = _error(fn, *args)
    assert expected is not None, "PyTorch itself accepts this input: the case is wrong"
    assert _error(fn, *to_jax(args)) == expected


@pytest.mark.parametrize("size,value,dtype", [c[1:] for c in FULL], ids=[c[0] for c in FULL])
def test_full_with_a_value_the_dtype_cannot_hold(size, value, dtype):
    expected = _error(lambda: torch.full(size, value, dtype=dtype))
    assert expected is not None
    assert _error(lambda: torch.full(size, value, dtype=dtype, device="jax")) == expected


def test_valid_values_still_compute_as_pytorch():
    x, w = _x(), torch.randn(10, 3)
    cases = [
        (lambda x: torch.take(x, torch.tensor([-12, 11], device=x.device)), (x,)),
        (lambda x: x.index_fill(0, torch.tensor([-1], device=x.device), 5.0), (x,)),
        (lambda x: x[torch.tensor([-3, 2], device=x.device)], (x,)),
        (lambda w: F.embedding(torch.tensor([[0, 9]], device=w.device), w), (w,)),
        (
            lambda x: F.cross_entropy(x, torch.tensor([0, -100, 2], device=x.device)),
            (torch.randn(3, 3),),
        ),
        (
            lambda x: F.nll_loss(x, torch.tensor([1, 7], device=x.device), ignore_index=7),
            (torch.randn(2, 3),),
        ),
        (lambda t: F.one_hot(t, 4), (torch.tensor([0, 3]),)),
        (lambda t: torch.bincount(t, minlength=5), (torch.tensor([0, 2, 2]),)),
        (lambda a: torch.remainder(a, 0.0), (torch.tensor([1.0, -2.0]),)),
        (lambda a: torch.remainder(a, 0), (torch.tensor([1.0, -2.0]),)),
        (lambda a: a // 0, (torch.tensor([1.0, -1.0]),)),
        (lambda a: torch.full((2,), 2**40, dtype=torch.int64, device=a.device), (torch.ones(1),)),
        (lambda a: torch.full((2,), -1, dtype=torch.uint8, device=a.device), (torch.ones(1),)),
    ]
    for fn, args in cases:
        expected = fn(*args)
        got = fn(*to_jax(args)).cpu()
        assert got.dtype == expected.dtype and got.shape == expected.shape
        torch.testing.assert_close(got, expected, equal_nan=True)


def test_a_failed_check_is_not_compiled_away_by_the_op_cache():
    # The eager op cache compiles an op after a few calls of one signature; an op whose check
    # read a value (even one that raised) must stay uncompiled, or the next check would vanish.
    w = torch.randn(10, 3, device="jax")
    for _ in range(4):
        with pytest.raises(IndexError, match="index out of range in self"):
            F.embedding(torch.tensor([10], device="jax"), w)
    F.embedding(torch.tensor([9], device="jax"), w)
    with pytest.raises(IndexError):
        F.embedding(torch.tensor([-1], device="jax"), w)


# -- the checking primitive under jax.jit ---------------------------------------------------------


def _lookup(x, i):
    check_index(i, -3, 3, IndexError, "index {index} is out of bounds for dimension 0 with size 3")
    check(jnp.all(x > -100), ValueError, "x holds {value}", value=lambda: jnp.min(x))
    return x[i]


def test_checked_records_traced_checks_and_raise_error_raises_them():
    x = jnp.arange(3.0)
    program = jax.jit(checked(_lookup))
    error, out = program(x, jnp.array([2, -3]))
    raise_error(error)
    assert out.tolist() == [2.0, 0.0]
    error, _ = program(x, jnp.array([1, 7]))
    with pytest.raises(IndexError, match="^index 7 is out of bounds for dimension 0 with size 3$"):
        raise_error(error)
    error, _ = program(x - 1000, jnp.array([0]))
    with pytest.raises(ValueError, match="^x holds -1000.0$"):
        raise_error(error)


def test_unchecked_jit_records_nothing_and_returns_jax_semantics():
    x = jnp.arange(3.0)
    assert jax.jit(_lookup)(x, jnp.array([7])).tolist() == [2.0]  # XLA clamps the read
    with pytest.raises(IndexError, match="index 7 is out of bounds"):
        _lookup(x, jnp.array([7]))  # eagerly: raised at once


def test_torch_compile_in_checked_mode_raises_after_the_call():
    torch._dynamo.reset()
    env = torchlax_core.default_env()
    before = env.config.checked

    def f(w, i):
        return F.embedding(i, w).sum(0)

    w = torch.randn(10, 3, device="jax")
    try:
        env.config.checked = True
        compiled = torch.compile(f, backend="torchlax")
        torch.testing.assert_close(
            compiled(w, torch.tensor([1, 2], device="jax")).cpu(), f(w.cpu(), torch.tensor([1, 2]))
        )
        with pytest.raises(IndexError, match="index out of range in self"):
            compiled(w, torch.tensor([1, 12], device="jax"))
        env.config.checked = False
        torch._dynamo.reset()
        unchecked = torch.compile(f, backend="torchlax")
        out = unchecked(w, torch.tensor([1, 12], device="jax")).cpu()
        assert torch.isnan(out).all()  # XLA fills an out-of-range read of a float with NaN
    finally:
        env.config.checked = before
        torch._dynamo.reset()


# -- sizes XLA cannot hold: checked before XLA aborts the process ---------------------------------


_OVERFLOW = """
import torch, torchlax
with torchlax.enable():
    for make in (lambda: torch.empty(2**62, 4, device="jax"),
                 lambda: torch.zeros(2**32, 2**32, device="jax"),
                 lambda: torch.full((2**61, 8), 1.0, device="jax"),
                 lambda: torch.ones(-1, device="jax")):
        try:
            make()
        except RuntimeError as exc:
            print(type(exc).__name__, exc)
"""


def test_sizes_that_overflow_raise_instead_of_aborting():
    # A subprocess, so an abort in XLA fails this test rather than killing pytest.
    done = fresh_python.run(["-c", _OVERFLOW], timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [
        "RuntimeError Storage size calculation overflowed with sizes=[4611686018427387904, 4]",
        "RuntimeError Storage size calculation overflowed with sizes=[4294967296, 4294967296]",
        "RuntimeError Storage size calculation overflowed with sizes=[2305843009213693952, 8]",
        "RuntimeError Trying to create tensor with negative dimension -1: [-1]",
    ]


# -- dtypes PyTorch's CPU kernels do not implement -------------------------------------------------


def _c(*shape, dtype=torch.complex64):
    return torch.ones(*shape, dtype=dtype)


# Complex numbers have no order: every op that orders or clamps refuses them on PyTorch's CPU
# (entries of the generated dtype table, and checks in the lowerings where the second argument
# decides), where JAX would order them lexicographically. Each case also runs under
# torchlax.jit (test below): dtypes are known when a program is traced.
_ORDERLESS = [
    ("clamp_numbers", lambda x: torch.clamp(x, 0, 1), (_c(2),)),
    ("clamp_min_number", lambda x: torch.clamp(x, min=0), (_c(2),)),
    ("clip_numbers", lambda x: torch.clip(x, -1, 1), (_c(2),)),
    ("clamp_min_fn_number", lambda x: torch.clamp_min(x, 0), (_c(2),)),
    ("clamp_max_fn_number", lambda x: torch.clamp_max(x, 1), (_c(2, dtype=torch.complex128),)),
    ("clamp_inplace_numbers", lambda x: x.clamp_(0, 1), (_c(2),)),
    ("sign", torch.sign, (_c(2),)),
    ("sign_inplace", lambda x: x.sign_(), (_c(2),)),
    ("heaviside", torch.heaviside, (_c(2), _c(2))),
    ("sort", torch.sort, (_c(3),)),
    ("sort_stable_descending", lambda x: torch.sort(x, stable=True, descending=True), (_c(3),)),
    ("sort_empty", torch.sort, (_c(0),)),
    ("msort", torch.msort, (_c(3, 2),)),
    ("argsort", torch.argsort, (_c(3),)),
    ("argsort_stable", lambda x: torch.argsort(x, stable=True), (_c(3),)),
    ("topk", lambda x: torch.topk(x, 1), (_c(3),)),
    ("kthvalue", lambda x: torch.kthvalue(x, 1), (_c(3),)),
    ("median", torch.median, (_c(3),)),
    ("median_dim", lambda x: torch.median(x, 0), (_c(3, 2, dtype=torch.complex128),)),
    ("nanmedian", torch.nanmedian, (_c(3),)),
    ("nanmedian_dim", lambda x: torch.nanmedian(x, 0), (_c(3),)),
    ("mode", torch.mode, (_c(3),)),
    ("unique", torch.unique, (_c(3),)),
    ("unique_consecutive", torch.unique_consecutive, (_c(3),)),
    ("unique_dim", lambda x: torch.unique(x, dim=0), (_c(3, 2),)),
    ("searchsorted", torch.searchsorted, (_c(3), _c(3))),
    ("bucketize", torch.bucketize, (_c(3), torch.ones(2))),
    ("isin", torch.isin, (_c(3), _c(3))),
    ("aminmax", torch.aminmax, (_c(3),)),
]

BAD_DTYPES = [
    ("gelu_int", F.gelu, (torch.tensor([1, 2]),)),
    ("silu_int", F.silu, (torch.tensor([1, 2]),)),
    ("frac_int", torch.frac, (torch.tensor([1, 2]),)),
    ("abs_bool", torch.abs, (torch.tensor([True, False]),)),
    ("relu_bool", torch.relu, (torch.tensor([True, False]),)),
    ("floor_bool", torch.floor, (torch.tensor([True]),)),
    ("argmax_bool", torch.argmax, (torch.tensor([True, False]),)),
    ("topk_bool", lambda x: torch.topk(x, 1), (torch.tensor([True, False]),)),
    (
        "matmul_bool",
        torch.matmul,
        (torch.ones(2, 2, dtype=torch.bool), torch.ones(2, 2, dtype=torch.bool)),
    ),
    ("neg_bool", torch.neg, (torch.tensor([True]),)),
    # Complex numbers have no order: JAX's lexicographic one must not answer for PyTorch.
    ("maximum_complex", torch.maximum, (torch.ones(2, dtype=torch.complex64),) * 2),
    ("fmin_complex", torch.fmin, (torch.ones(2, dtype=torch.complex128),) * 2),
    ("clamp_tensor_bounds_complex", torch.clamp, (torch.ones(2, dtype=torch.complex64),) * 3),
    ("amax_complex", torch.amax, (torch.ones(2, dtype=torch.complex64),)),
    ("max_dim_complex", lambda x: torch.max(x, 0), (torch.ones(2, dtype=torch.complex64),)),
    ("cummax_complex", lambda x: torch.cummax(x, 0), (torch.ones(2, dtype=torch.complex64),)),
    ("lt_complex", torch.lt, (torch.ones(2, dtype=torch.complex64),) * 2),
    ("hardtanh_complex", F.hardtanh, (torch.ones(2, dtype=torch.complex64),)),
    *[(f"{name}_complex", fn, args) for name, fn, args in _ORDERLESS],
    ("heaviside_complex_values", torch.heaviside, (torch.ones(2), torch.ones(2) * 1j)),
    ("kthvalue_bool", lambda x: torch.kthvalue(x, 1), (torch.tensor([True]),)),
    ("median_dim_bool", lambda x: torch.median(x, 0), (torch.tensor([True]),)),
    # isin and searchsorted refuse a bool or complex argument in either place, after promotion
    # for searchsorted (bool with float boundaries computes: see the test below).
    ("isin_int_bool", torch.isin, (torch.tensor([1]), torch.tensor([True]))),
    ("isin_bool_number", torch.isin, (torch.tensor([True]), 1)),
    ("isin_number_bool", torch.isin, (1, torch.tensor([True]))),
    ("isin_int_complex_number", torch.isin, (torch.tensor([1]), 1j)),
    ("isin_float_complex", torch.isin, (torch.ones(2), torch.ones(2) * 1j)),
    ("searchsorted_float_complex", torch.searchsorted, (torch.ones(2), torch.ones(2) * 1j)),
    ("searchsorted_float_complex_number", torch.searchsorted, (torch.ones(2), 1j)),
    ("searchsorted_bool_bool", torch.searchsorted, (torch.tensor([True]), torch.tensor([True]))),
    ("bucketize_bool_bool", torch.bucketize, (torch.tensor([True]), torch.tensor([True]))),
]


@pytest.mark.parametrize("fn,args", [c[1:] for c in BAD_DTYPES], ids=[c[0] for c in BAD_DTYPES])
def test_unsupported_dtype_raises_as_pytorch(fn, args):
    expected = _error(fn, *args)
    assert expected is not None, "PyTorch itself accepts this dtype: the case is wrong"
    assert _error(fn, *to_jax(args)) == expected


@pytest.mark.parametrize("fn,args", [c[1:] for c in _ORDERLESS], ids=[c[0] for c in _ORDERLESS])
def test_orderless_complex_raises_as_pytorch_under_torchlax_jit(fn, args):
    expected = _error(fn, *args)
    assert expected is not None, "PyTorch itself accepts this dtype: the case is wrong"
    assert _error(torchlax.jit(fn), *to_jax(args)) == expected


def test_the_second_argument_decides_only_after_promotion():
    """bucketize/searchsorted run in the promoted dtype (bools against float boundaries
    compute); isin promotes after its check, so integers and floats still compare by value."""
    cases = [
        (torch.bucketize, (torch.tensor([True, False]), torch.tensor([0.5, 1.0]))),
        (torch.searchsorted, (torch.tensor([True, True]), torch.tensor([0.5, 2.0]))),
        (torch.searchsorted, (torch.tensor([0.0, 1.0]), 0.5)),
        (torch.isin, (torch.tensor([1, 2]), torch.tensor([1.0, 1.5]))),
        (torch.isin, (torch.tensor([1, 2]), 2.0)),
        (torch.heaviside, (torch.tensor([-1.0, 0.0, 2.0]), torch.tensor([0.5]))),
    ]
    for fn, args in cases:
        expected = fn(*args)
        got = fn(*to_jax(args))
        torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)


def test_bool_minus_one_raises_not_implemented():
    with pytest.raises(NotImplementedError, match="Subtraction, the `-` operator"):
        torch.tensor([True], device="jax") - 1


def test_the_guard_lets_supported_dtypes_through():
    for x in (torch.tensor([-1.5, 2.0]), torch.tensor([-1, 2]), torch.tensor([True, False])):
        for fn in (torch.abs, torch.relu, torch.floor, torch.argmax, torch.neg, F.gelu, torch.frac):
            expected = _error(fn, x)
            if expected is None:
                got = fn(x.to("jax")).cpu()
                torch.testing.assert_close(got, fn(x))


# (id, function, inputs, gist): argument errors PyTorch raises before computing anything; torchlax
# raises the same exception type with a message carrying the gist.
BAD_ARGUMENTS = [
    (
        "mask_too_long",
        lambda x, m: x[m],
        (_x(), torch.tensor([True, False, True, True])),
        "The shape of the mask [4] at index 0 does not match",
    ),
    (
        "mask_on_dim1",
        lambda x, m: x[:, m],
        (_x(), torch.tensor([True, False])),
        "The shape of the mask [2] at index 0 does not match the shape of the indexed tensor [3, 4] at index 1",
    ),
    (
        "mask_2d",
        lambda x, m: x[m],
        (_x(), torch.ones(3, 3, dtype=torch.bool)),
        "The shape of the mask [3, 3] at index 1 does not match",
    ),
    ("clamp_no_bounds", torch.clamp, (_x(),), "At least one of 'min' or 'max' must not be None"),
    # A real tensor promoted to complex by its bound is refused too.
    (
        "clamp_int_complex_bound",
        lambda x: torch.clamp(x, min=1j),
        (torch.tensor([1, 2]),),
        "clamp is not supported for complex types",
    ),
    (
        "clamp_min_float_complex_bound",
        lambda x: torch.clamp_min(x, 1j),
        (_x(),),
        "clamp is not supported for complex types",
    ),
    ("clip_no_bounds", torch.clip, (_x(),), "At least one of 'min' or 'max' must not be None"),
    (
        "flip_repeated_dim",
        lambda x: torch.flip(x, (0, -2)),
        (_x(),),
        "dim 0 appears multiple times in the list of dims",
    ),
    (
        "addcdiv_integers",
        torch.addcdiv,
        (torch.tensor([1]), torch.tensor([1]), torch.tensor([2])),
        "nteger division with addcdiv is no longer supported",
    ),
    (
        "addcdiv_integer_operands",
        torch.addcdiv,
        (torch.tensor([1.0]), torch.tensor([1]), torch.tensor([2])),
        "nteger division with addcdiv is no longer supported",
    ),
    (
        "unique_dim_other_empty_dim",
        lambda x: torch.unique(x, dim=1),
        (torch.empty(0, 3),),
        "There are 0 sized dimensions, and they aren't selected",
    ),
    (
        "unique_consecutive_two_empty_dims",
        lambda x: torch.unique_consecutive(x, dim=0),
        (torch.empty(0, 0, 3),),
        "Number of zero sized dimensions is more than one",
    ),
    (
        "unique_consecutive_unselected",
        lambda x: torch.unique_consecutive(x, dim=2),
        (torch.empty(0, 0, 3),),
        "There are 0 sized dimensions, and they aren't selected",
    ),
]


@pytest.mark.parametrize(
    "fn,args,gist", [c[1:] for c in BAD_ARGUMENTS], ids=[c[0] for c in BAD_ARGUMENTS]
)
def test_bad_argument_raises_as_pytorch(fn, args, gist):
    expected = _error(fn, *args)
    assert expected is not None and gist in expected[1], "PyTorch's own error changed: fix the case"
    got = _error(fn, *to_jax(args))
    assert got is not None and got[0] is expected[0] and gist in got[1], got


def test_valid_masks_and_empty_unique_compute_as_pytorch():
    x = _x()
    mask = torch.tensor([[True, False, True, True]] * 3)
    for fn, args in [
        (lambda x, m: x[m], (x, mask)),
        (lambda x, m: x[:, m], (x, torch.tensor([True, False, True, False]))),
        (lambda x: torch.flip(x, (0, -1)), (x,)),
        (lambda x: torch.clamp(x, max=3.0), (x,)),
        (
            lambda x: torch.unique(x, dim=0, return_inverse=True, return_counts=True),
            (torch.empty(0, 3),),
        ),
        (
            lambda x: torch.unique_consecutive(x, dim=1, return_inverse=True, return_counts=True),
            (torch.empty(2, 0),),
        ),
        (lambda x: torch.unique_consecutive(x, return_counts=True), (torch.empty(0, 0, 3),)),
    ]:
        expected = fn(*args)
        got = fn(*to_jax(args))
        for e, g in zip(pytree.tree_leaves(expected), pytree.tree_leaves(got), strict=True):
            assert g.shape == e.shape and g.dtype == e.dtype
            torch.testing.assert_close(g.cpu(), e)
