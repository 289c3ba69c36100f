"""Views alias their base as in PyTorch: writes through a view reach the base and back.

Each case runs the same function on a CPU tensor and on a torchlax Tensor and compares every
tensor it returns (values, dtype, shape).
"""

from __future__ import annotations

import pytest
import torch
import torchlax_core
from eager_compare import assert_same, to_jax


@pytest.fixture(autouse=True)
def _enabled():
    with torchlax_core.enable():
        yield


def _base():
    return torch.arange(24, dtype=torch.float32).reshape(4, 6)


def _check(fn, make=_base):
    cpu = make()
    jx = to_jax(cpu)
    expected = fn(cpu)
    actual = fn(jx)
    expected = expected if isinstance(expected, tuple) else (expected,)
    actual = actual if isinstance(actual, tuple) else (actual,)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        assert_same(a, e)


# Each view op, written through (the base changes) and read after a write to the base (the view
# changes): fn(base) -> (base, view).
VIEW_WRITES = {
    "view": lambda x: x.view(24),
    "view_3d": lambda x: x.view(2, 2, 6),
    "reshape_view": lambda x: x.reshape(6, 4),
    "flatten": lambda x: x.flatten(),
    "transpose": lambda x: x.transpose(0, 1),
    "permute": lambda x: x.view(2, 2, 6).permute(2, 0, 1),
    "t": lambda x: x.t(),
    "narrow": lambda x: x.narrow(1, 2, 3),
    "select": lambda x: x.select(0, 2),
    "select_neg": lambda x: x[:, -1],
    "diagonal": lambda x: x.diagonal(),
    "diagonal_offset": lambda x: x.diagonal(1),
    "unsqueeze": lambda x: x.unsqueeze(1),
    "squeeze": lambda x: x.view(4, 1, 6).squeeze(1),
    "unfold": lambda x: x[0].unfold(0, 2, 2),
    "slice_step": lambda x: x[1:, ::2],
    "basic_index": lambda x: x[1:3, 2:5],
    "ellipsis_none": lambda x: x[..., None, 1:4],
    "chunk": lambda x: x.chunk(2, dim=1)[1],
    "split": lambda x: x.split(2)[1],
    "unbind": lambda x: x.unbind(1)[3],
    "detach": lambda x: x.detach(),
}


@pytest.mark.parametrize("name", sorted(VIEW_WRITES))
def test_write_through_view_reaches_base(name):
    make_view = VIEW_WRITES[name]

    def fn(x):
        v = make_view(x)
        v.mul_(-1)
        return x, v

    _check(fn)


@pytest.mark.parametrize("name", sorted(VIEW_WRITES))
def test_write_to_base_shows_in_view(name):
    make_view = VIEW_WRITES[name]

    def fn(x):
        v = make_view(x)
        before = v.clone()
        x.add_(100)
        return v, before

    _check(fn)


def test_expand_reads_follow_base():
    def fn(x):
        v = x[0].expand(3, 6)
        x[0, 1] = 7.0
        return v

    _check(fn)


def test_view_of_a_view_chain():
    def fn(x):
        a = x.view(2, 12)
        b = a[1]  # a view of a view
        c = b.view(3, 4).t()  # and of that
        c[1].fill_(-5.0)
        b.add_(1)
        return x, a, b, c

    _check(fn)


def test_same_view_chain_of_different_bases_reads_each_its_own():
    # Deferred views with equal arguments share one recompute function (built once per
    # arguments and parent): each must still read, and write back to, its own base.
    def fn(x):
        y = x * 10
        views = [t.view(2, 12).t()[2:5].transpose(0, 1) for t in (x, y, x.t().contiguous())]
        views[1][0].fill_(-1.0)
        return x, y, *views

    _check(fn)


def test_view_then_inplace_updates_base():
    def fn(x):
        x.view(-1).add_(1)
        x.t().mul_(2)
        return x

    _check(fn)


def test_base_inplace_invalidates_every_view():
    def fn(x):
        views = [x.view(24), x[1], x.t(), x.diagonal()]
        x.zero_()
        x.add_(3)
        return tuple(views)

    _check(fn)


def test_multi_output_views_write_back():
    def fn(x):
        a, b, c = x.split([1, 2, 3], dim=1)
        a.fill_(1.0)
        c.mul_(10)
        return x, a, b, c

    _check(fn)


def test_sibling_views_see_each_other():
    def fn(x):
        row = x[2]
        col = x[:, 3]
        row.fill_(9.0)
        col.add_(1)
        return x, row, col

    _check(fn)


def test_slice_assignment():
    def fn(x):
        x[1:3] = 0.5
        x[:, 0] = torch.arange(4, dtype=torch.float32).to(x.device)
        x[0, 4:] = x[3, :2]
        return x

    _check(fn)


def test_mask_assignment():
    def fn(x):
        x[x > 10] = -1.0
        return x

    _check(fn)


def test_advanced_index_assignment():
    def fn(x):
        idx = torch.tensor([0, 2]).to(x.device)
        x[idx] = 4.0
        x[idx, idx] += 10
        x[1, idx] += 1
        return x

    _check(fn)


def test_index_put_accumulate():
    def fn(x):
        idx = torch.tensor([0, 0, 3]).to(x.device)
        vals = torch.tensor([1.0, 2.0, 3.0]).to(x.device)
        x.view(-1).index_put_((idx,), vals, accumulate=True)
        return x

    _check(fn)


def test_inplace_through_advanced_index_on_view():
    def fn(x):
        v = x[1:]
        idx = torch.tensor([0, 2]).to(x.device)
        v[idx] = -2.0
        return x, v

    _check(fn)


def test_view_shares_version_counter():
    x = to_jax(_base())
    v = x[1]
    before = x._version
    v.add_(1)
    assert x._version > before
    assert v._version == x._version


def test_view_of_dtype_reads_bits():
    def fn(x):
        return x.view(torch.int32)

    _check(fn)


def test_data_aliases_and_data_assignment_rebinds():
    def fn(x):
        x.data.add_(1)  # .data shares storage
        y = torch.zeros(4, 6).to(x.device)
        x.data = y  # x now shares y's storage
        y.add_(2)
        return x, y

    _check(fn)


# -- in-place view ops: the tensor object itself takes the view's shape ---------------------------

INPLACE_VIEWS = {
    "t_": lambda x: x.t_(),
    "transpose_": lambda x: x.transpose_(0, 1),
    "swapdims_": lambda x: x.swapdims_(1, 0),
    "squeeze_": lambda x: x.view(4, 1, 6).squeeze_(),
    "squeeze_dim_": lambda x: x.view(4, 1, 6).squeeze_(1),
    "unsqueeze_": lambda x: x.unsqueeze_(1),
    "as_strided_": lambda x: x.as_strided_((3, 2), (1, 6)),
    "resize_same_numel": lambda x: x.resize_(3, 8),
    "resize_smaller": lambda x: x.resize_(5),
    "resize_as_": lambda x: x.resize_as_(torch.zeros(2, 12)),
}


@pytest.mark.parametrize("name", sorted(INPLACE_VIEWS))
def test_inplace_view_op_changes_the_tensor_itself(name):
    op = INPLACE_VIEWS[name]

    def fn(base):
        alias = base.view(24)
        t = op(base if name not in ("squeeze_", "squeeze_dim_") else base)
        same = t is base or name.startswith("squeeze")
        assert same
        t.mul_(10)  # writes through the reshaped tensor reach every alias
        return t.clone(), base, alias

    _check(fn)


def test_inplace_view_op_keeps_object_and_feeds_autograd():
    cpu = torch.arange(6.0).reshape(2, 3).requires_grad_()
    jx = to_jax(cpu)
    results = []
    for leaf in (cpu, jx):
        y = leaf * 2
        obj = id(y)
        y.t_().unsqueeze_(0)
        assert id(y) == obj and tuple(y.shape) == (1, 3, 2)
        (y * torch.arange(6.0, device=leaf.device).reshape(1, 3, 2)).sum().backward()
        results.append((y, leaf.grad))
    assert_same(results[1][0], results[0][0])
    assert_same(results[1][1], results[0][1])


def test_resize_grows_as_pytorch():
    cpu, jx = torch.arange(6.0).reshape(2, 3), to_jax(torch.arange(6.0).reshape(2, 3))
    for t in (cpu, jx):
        obj_id = id(t)
        t.resize_(4, 4)
        assert id(t) == obj_id
        t[2:] = 1  # (the grown part: uninitialised in PyTorch)
    assert_same(jx, cpu)
    assert jx.stride() == cpu.stride() and jx.untyped_storage().nbytes() == 64


@pytest.mark.parametrize("offset", [None, 0, 10])
def test_as_strided_on_a_view_indexes_the_storage(offset):
    kwargs = {} if offset is None else {"storage_offset": offset}

    def fn(base):
        view = base[5:15].as_strided((2, 2), (1, 2), **kwargs)
        out = view.clone()
        view.mul_(-1)  # writes land where PyTorch's do
        return out, base

    _check(fn, lambda: torch.arange(20.0))


def test_inplace_view_ops_under_jit():
    import jax

    def program(array):
        t = torchlax_core.wrap(array)
        alias = t.view(-1)
        t.t_().unsqueeze_(0).resize_(6)
        t.add_(1)
        return t.jax(), alias.jax()

    cpu = torch.arange(6.0).reshape(2, 3)
    expected_alias = cpu.view(-1)
    expected = cpu.t_().unsqueeze_(0).resize_(6)
    expected.add_(1)
    out, alias = jax.jit(program)(to_jax(torch.arange(6.0).reshape(2, 3)).jax())
    assert_same(torchlax_core.wrap(out), expected)
    assert_same(torchlax_core.wrap(alias), expected_alias)


def _complex_base():
    return torch.arange(24, dtype=torch.float32).reshape(4, 6) * (1 - 2j)


# Views between complex and real dtypes (PyTorch's make_tensor fills complex tensors through
# view_as_real): fn(base) -> view, written through both ways as the views above.
COMPLEX_VIEW_WRITES = {
    "real": (lambda x: x.real, _complex_base),
    "imag": (lambda x: x.imag, _complex_base),
    "view_as_real": (torch.view_as_real, _complex_base),
    "view_as_real_column": (lambda x: torch.view_as_real(x)[:, 1:4, 1], _complex_base),
    "transposed_real": (lambda x: x.t()[2].real, _complex_base),
    "conj": (lambda x: x.conj(), _complex_base),
    "view_as_complex": (lambda x: torch.view_as_complex(x.view(4, 3, 2))[1:], _base),
}


@pytest.mark.parametrize("name", sorted(COMPLEX_VIEW_WRITES))
def test_write_through_complex_real_views_both_ways(name):
    make_view, make = COMPLEX_VIEW_WRITES[name]

    def fn(x):
        v = make_view(x)
        v.mul_(-3)
        v[0] = 5  # (a select of the view, written through twice)
        after_view_write = x.clone()
        x.add_(7)
        return after_view_write, x, v, v.resolve_conj()

    _check(fn, make)
    cpu, jx = make(), to_jax(make())
    expected, actual = make_view(cpu), make_view(jx)
    assert actual._base is (jx._base if jx._base is not None else jx)
    assert expected._base is (cpu._base if cpu._base is not None else cpu)
    assert actual.stride() == expected.stride()
    assert actual.storage_offset() == expected.storage_offset()


def test_make_tensor_of_complex_dtype_on_jax():
    for dtype in (torch.complex64, torch.complex128):
        t = torch.testing.make_tensor((3, 2), dtype=dtype, device="jax", low=-2, high=2)
        assert t.dtype == dtype and t.shape == (3, 2)
        assert bool((t.real.abs() <= 2).all()) and bool((t.imag != 0).any())


# Views that reinterpret bits (view(dtype)), to the same and to other element sizes, of slices
# and transposes: fn(base) -> view. Compared bit for bit (through integer views of both).
BIT_VIEW_WRITES = {
    "same_size": (lambda x: x.view(torch.int32), _base),
    "same_size_of_slice": (lambda x: x[1:, ::2].view(torch.int32), _base),
    "same_size_of_transpose": (lambda x: x.t().view(torch.int32), _base),
    "smaller": (lambda x: x[:, 1:4].view(torch.int16), _base),
    "bytes": (lambda x: x[2].view(torch.uint8), _base),
    "bools": (lambda x: x[2:9].view(torch.bool), lambda: torch.arange(24, dtype=torch.uint8) % 2),
    "larger": (lambda x: x[1:, 2:6].view(torch.float64), _base),
    "larger_then_slice": (lambda x: x.view(torch.int64)[1:, 1], _base),
    "complex_as_float64": (lambda x: x[1:].view(torch.float64), _complex_base),
    "float_as_complex": (lambda x: x.view(torch.complex64)[:, 1:], _base),
}


def _bits(t):
    size = t.element_size()
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size])


@pytest.mark.parametrize("name", sorted(BIT_VIEW_WRITES))
def test_write_through_view_dtype_both_ways(name):
    make_view, make = BIT_VIEW_WRITES[name]

    def fn(x):
        v = make_view(x)
        v[..., :1] = 3  # (a slice of the view, written through)
        v.copy_(v.flip(-1))
        after_view_write = _bits(x).clone()
        x.copy_(x.flip(0))  # (moves bits: arithmetic on them could flush denormals)
        return after_view_write, _bits(x), _bits(v)

    _check(fn, make)
    cpu, jx = make(), to_jax(make())
    expected, actual = make_view(cpu), make_view(jx)
    # (PyTorch's view(dtype) is no view to autograd: its _base is None, a later slice's the root)
    assert (actual._base is None, actual._base is jx) == (
        expected._base is None,
        expected._base is cpu,
    )
    assert (actual.shape, actual.stride(), actual.storage_offset()) == (
        expected.shape,
        expected.stride(),
        expected.storage_offset(),
    )


def test_view_dtype_size_errors_as_pytorch():
    cases = (
        lambda x: x.t().view(torch.int16),  # stride(-1) must be 1
        lambda x: x[:, :3].view(torch.float64),  # size(-1) must be divisible by 2
        lambda x: x[0, 0].view(torch.float64),  # a 0-d tensor to another size
        lambda x: x[:, 1:4].view(torch.float64),  # storage_offset must be divisible by 2
    )
    for case in cases:
        with pytest.raises(RuntimeError) as expected:
            case(_base())
        with pytest.raises(RuntimeError) as actual:
            case(to_jax(_base()))
        assert str(actual.value).split(",")[0] == str(expected.value).split(",")[0]


def test_write_through_a_negated_bit_view_raises():
    x = to_jax(_complex_base())
    with pytest.raises(NotImplementedError, match=r"view\(dtype\)"):
        x.conj().view(torch.float64).add_(1)
    assert_same(x, _complex_base())


def test_view_dtype_writes_under_jit():
    import jax

    def fn(x):
        x[1:].view(torch.int16)[:, 1::2] = 0  # the high half of each float32: zero
        return x

    def program(array):
        return fn(torchlax_core.wrap(array)).jax()

    out = jax.jit(program)(to_jax(_base()).jax())
    assert_same(torchlax_core.wrap(out), fn(_base()), atol=0, rtol=0)


def test_complex_real_view_writes_under_jit():
    import jax

    def fn(c):
        torch.view_as_real(c)[:, 0].mul_(2)
        c.imag.add_(1)
        return c

    def program(array):
        return fn(torchlax_core.wrap(array)).jax()

    cpu = torch.randn(4, dtype=torch.complex64)
    out = jax.jit(program)(to_jax(cpu).jax())
    assert_same(torchlax_core.wrap(out), fn(cpu.clone()))
