"""Shape/view ops against eager PyTorch on the CPU: values, dtype and shape, eager and under jit."""

import jax
import pytest
import torch
import torchlax_core
from torch.utils import _pytree as pytree
from torchlax_core import Tensor


@pytest.fixture(autouse=True)
def _enabled():
    with torchlax_core.enable():  # device="jax" and JAX's 64-bit mode, as torchlax programs run
        yield


def to_jax(value):
    return pytree.tree_map(lambda t: t.to("jax") if isinstance(t, torch.Tensor) else t, value)


def to_cpu(value):
    return pytree.tree_map(lambda t: t.cpu() if isinstance(t, Tensor) else t, value)


def assert_same(got, expected):
    got_flat, got_spec = pytree.tree_flatten(got)
    exp_flat, exp_spec = pytree.tree_flatten(expected)
    assert len(got_flat) == len(exp_flat), (got_spec, exp_spec)
    for g, e in zip(got_flat, exp_flat, strict=True):
        if isinstance(e, torch.Tensor):
            assert isinstance(g, torch.Tensor) and not isinstance(g, Tensor)
            assert g.dtype == e.dtype and g.shape == e.shape, (g.dtype, g.shape, e.dtype, e.shape)
            torch.testing.assert_close(g, e, rtol=0, atol=0, equal_nan=True)
        else:
            assert g == e


def check(fn, *args, jit=True):
    """``fn(*args)`` on torchlax Tensors equals it on CPU tensors, eagerly and under jax.jit."""
    expected = fn(*args)
    with torch.device("jax"):  # tensors the function creates go where PyTorch's would
        got = fn(*to_jax(args))
    assert_same(to_cpu(got), expected)
    if not jit:
        return
    flat, spec = pytree.tree_flatten(args)
    positions = [i for i, a in enumerate(flat) if isinstance(a, torch.Tensor)]

    def traced(*arrays):
        values = list(flat)
        for i, a in zip(positions, arrays, strict=True):
            values[i] = torchlax_core.wrap(a)
        with torch.device("jax"):
            out = fn(*pytree.tree_unflatten(values, spec))
        return pytree.tree_map(lambda t: t.jax() if isinstance(t, Tensor) else t, out)

    out = jax.jit(traced)(*[flat[i].to("jax").jax() for i in positions])
    assert_same(
        pytree.tree_map(
            lambda a: torchlax_core.wrap(a).cpu() if isinstance(a, jax.Array) else a, out
        ),
        expected,
    )


x = torch.arange(60, dtype=torch.float32).reshape(3, 4, 5)
xi = torch.arange(24, dtype=torch.int64).reshape(2, 3, 4)


@pytest.mark.parametrize(
    "fn",
    [
        lambda a: a.view(12, 5),
        lambda a: a.view(-1),
        lambda a: a.reshape(5, -1),
        lambda a: a.transpose(0, 1).reshape(-1),
        lambda a: a.flatten(1),
        lambda a: a.unflatten(2, (5, 1)),
        lambda a: a[None].expand(2, -1, -1, -1),
        lambda a: a[:, :1].expand(3, 4, 5),
        lambda a: a.permute(2, 0, 1),
        lambda a: a.permute(-1, 0, -2),
        lambda a: a.transpose(0, -1),
        lambda a: a[0].t(),
        lambda a: a[0, 0].t(),
        lambda a: a.mT,
        lambda a: a.movedim(0, -1),
        lambda a: a[:, :1].squeeze(),
        lambda a: a[:, :1].squeeze(1),
        lambda a: a[:, :1].squeeze(0),
        lambda a: a[:, :1, :1].squeeze((1, 2)),
        lambda a: a.unsqueeze(-1),
        lambda a: a.unsqueeze(0),
        lambda a: a[1:],
        lambda a: a[:, ::2],
        lambda a: a[:, -3:-1],
        lambda a: a[:, 10:],
        lambda a: a[-100:100],
        lambda a: a[:, 3:1],
        lambda a: a[1, -1],
        lambda a: a[..., 2],
        lambda a: a.narrow(2, 1, 3),
        lambda a: a.narrow(1, -2, 2),
        lambda a: torch.narrow_copy(a, 1, 1, 2),
        lambda a: a.diagonal(),
        lambda a: a.diagonal(1, 1, 2),
        lambda a: a.diagonal(-2, -1, -2),
        lambda a: a.unfold(2, 2, 1),
        lambda a: a.unfold(1, 3, 2),
        lambda a: a.unfold(0, 3, 3),
        lambda a: a.as_strided((2, 2), (1, 2)),
        lambda a: a.as_strided((3, 2), (5, 1), 7),
        lambda a: a.split(2),
        lambda a: a.split(2, dim=-1),
        lambda a: a.split([1, 3], 1),
        lambda a: a.chunk(2, 2),
        lambda a: a.unbind(1),
        lambda a: a.tensor_split(3, 2),
        lambda a: a.clone(),
        lambda a: a.mT.contiguous(),
        lambda a: a.flip(0, 2),
        lambda a: a.roll(2),
        lambda a: a.roll((1, -2), (0, 2)),
        lambda a: a.rot90(),
        lambda a: a.rot90(3, (1, 2)),
        lambda a: a.rot90(-1, (2, 0)),
        lambda a: a.repeat(2, 1, 1),
        lambda a: a.repeat(1, 2, 1, 3),
        lambda a: a.tile(2),
        lambda a: a[0].tile(2, 1, 1),
        lambda a: a.tril(),
        lambda a: a.triu(1),
        lambda a: a.tril(-2),
        lambda a: torch.nn.functional.pad(a, (1, 2)),
        lambda a: torch.nn.functional.pad(a, (1, 1, -1, 2), value=3.5),
        lambda a: torch.diag(a[0]),
        lambda a: torch.diag(a[0], 1),
        lambda a: torch.diag(a[0, 0], -2),
        lambda a: torch.diag_embed(a),
        lambda a: torch.diag_embed(a, 1, 0, 2),
        lambda a: torch.diag_embed(a, -1, 3, 1),
        lambda a: torch.diagflat(a[0, :2]),
        lambda a: torch.block_diag(a[0], a[1, 0], a[2, 0, 0]),
        lambda a: torch.meshgrid(a[0, 0], a[0, :, 0], indexing="ij"),
        lambda a: torch.meshgrid(a[0, 0], a[0, :, 0], indexing="xy"),
        lambda a: torch.broadcast_tensors(a, a[0, 0]),
        lambda a: torch.atleast_3d(a[0, 0]),
        lambda a: a.clone().fill_(2),
        lambda a: a.clone().zero_(),
        lambda a: torch.zeros_like(a).fill_(a[0, 0, 1]),
        lambda a: torch.ravel(a),
        lambda a: a.swapaxes(0, 2),
        lambda a: torch.hstack([a, a]),
        lambda a: torch.dstack([a, a]),
    ],
)
def test_float_views_and_copies(fn):
    check(fn, x)


@pytest.mark.parametrize(
    "fn",
    [
        lambda a, m: a.masked_fill(m, -1.0),
        lambda a, m: a.masked_fill(m[0, 0], a[0, 0, 3]),
        lambda a, m: torch.where(m, a, 0.0),
        lambda a, m: torch.where(m, a, a.int()),
        lambda a, m: torch.where(m, 1, a.int()),
        lambda a, m: torch.where(m, a.half(), a.double()),
        lambda a, m: torch.where(m[0], a.bool(), False),
        lambda a, m: torch.where(m.byte(), a.long(), a.int()),
        lambda a, m: a.masked_scatter(m, a.flip(0)),
        lambda a, m: a.masked_scatter(m[0, 0], a.flip(1)),
        lambda a, m: a.int().masked_scatter(m, a.int().flip(2)),
        lambda a, m: a.masked_fill(m, float("nan")),
    ],
)
def test_masked_and_where(fn):
    check(fn, x, (x.long() % 7) > 3)


@pytest.mark.parametrize(
    "fn",
    [
        lambda a: a.view(torch.float64),
        lambda a: a.view(torch.int32),
        lambda a: a.view(torch.uint8),
        lambda a: a.view(torch.int16),
        lambda a: a.view(torch.complex64),
        lambda a: a.view(torch.complex128),
        lambda a: a.view(torch.float32).view(torch.complex64).view(torch.float64),
        lambda a: a[0, 0, 0].view(torch.float64),
        lambda a: a.view(torch.uint8).view(torch.int16),
    ],
)
def test_view_dtype_reinterprets_bits(fn):
    check(fn, xi)


def test_view_dtype_of_bool_and_complex():
    check(lambda a: a.view(torch.uint8), torch.tensor([[True, False], [False, True]]))
    check(lambda a: a.view(torch.bool), torch.tensor([[1, 0], [0, 1]], dtype=torch.uint8))
    c = torch.randn(3, 2, dtype=torch.complex64)
    check(lambda a: a.view(torch.float32), c)
    check(lambda a: a.view(torch.int64), c)
    check(lambda a: torch.view_as_real(a), c)
    check(lambda a: torch.view_as_complex(torch.view_as_real(a)), c)
    check(lambda a: (a.real, a.imag), c)
    check(lambda a: a.real, x)


@pytest.mark.parametrize(
    "fn",
    [
        lambda a: torch.cat([a, a]),
        lambda a: torch.cat([a, a[:, :2]], 1),
        lambda a: torch.cat([a, a.double()], -1),
        lambda a: torch.cat([a, a.int()]),
        lambda a: torch.cat([a.int(), a.bool()]),
        lambda a: torch.cat([torch.empty(0, dtype=torch.float64), a.int()], 2),
        lambda a: torch.cat([a[:, :0], a], 1),
        lambda a: torch.cat([a.int(), torch.empty(0, dtype=torch.int64)]),
        lambda a: torch.stack([a, a]),
        lambda a: torch.stack([a, a.long()], -1),
        lambda a: torch.stack([a[0], a[1]], 1),
        lambda a: torch.block_diag(a[0], a[1, :1].double()),
    ],
)
def test_cat_and_stack_promote(fn):
    check(fn, x)


def test_cat_of_only_legacy_empty_tensors():
    check(lambda a, b: torch.cat([a, b]), torch.empty(0), torch.empty(0, dtype=torch.float64))


@pytest.mark.parametrize(
    "fn",
    [
        lambda a: a.clone().fill_(2.7),
        lambda a: a.clone().fill_(True),
        lambda a: a.masked_fill(a.bool(), 2.9),
        lambda a: a.bool().masked_fill(a.bool(), 0),
        lambda a: a.bool().clone().fill_(5),
        lambda a: torch.nn.functional.pad(a, (2, 0), value=-7),
        lambda a: a.view(torch.float64).view(torch.int64),
        lambda a: a.flip(-1),
        lambda a: a.repeat(1, 1, 2),
        lambda a: a.tril(1),
        lambda a: a.roll(-1, 1),
    ],
)
def test_integer_and_bool_inputs(fn):
    check(fn, xi)


@pytest.mark.parametrize(
    "fn",
    [
        lambda a: a.view(1),
        lambda a: a.unsqueeze(0),
        lambda a: a.unsqueeze(-1),
        lambda a: a.squeeze(),
        lambda a: a.squeeze(0),
        lambda a: a.squeeze(-1),
        lambda a: a.expand(2, 3),
        lambda a: a.t(),
        lambda a: a.permute([]),
        lambda a: a.flip(0),
        lambda a: a.clone().fill_(3),
        lambda a: a.repeat(2),
        lambda a: torch.stack([a, a]),
        lambda a: a.unfold(0, 1, 1),
        lambda a: a.reshape(()),
    ],
)
def test_zero_dim_inputs(fn):
    check(fn, torch.tensor(4.5))


@pytest.mark.parametrize(
    "fn",
    [
        lambda a: a.view(0, 3),
        lambda a: a.split(1),
        lambda a: a.unbind(0),
        lambda a: a.flip(0),
        lambda a: torch.cat([a, a]),
        lambda a: a.expand(2, 0, 3),
        lambda a: a.T,
        lambda a: a[1:],
        lambda a: torch.nn.functional.pad(a, (1, 1)),
        lambda a: a.repeat(2, 2),
        lambda a: a.tril(),
    ],
)
def test_empty_inputs(fn):
    check(fn, torch.empty(0, 3))


def test_errors_match_pytorch_kinds():
    t = to_jax(x)
    with pytest.raises(IndexError):
        t.select(1, 4)
    with pytest.raises(IndexError):
        t.transpose(0, 3)
    with pytest.raises(RuntimeError):
        t.split([1, 1], 0)
    with pytest.raises(RuntimeError):
        t.view(torch.complex128)  # last dim 5 is not divisible by 4


def test_writes_through_views_reach_the_base():
    def program(a):
        a = a.clone()
        a[1:].add_(1)
        a[:, 0].mul_(-1)
        a.transpose(0, 2)[0].fill_(7)
        a.diagonal(0, 1, 2).zero_()
        a.view(-1)[::7].sub_(100)
        a.unfold(2, 2, 2)[..., 0].add_(0.5)
        first, _ = a.split(2, 1)
        first.mul_(2)
        a.unsqueeze(0).squeeze(0).narrow(0, 2, 1).mul_(3)
        return a

    check(program, x, jit=False)


def test_writes_through_views_under_jit():
    def program(a):
        a = a.clone()
        a[1:].add_(1)
        a[:, 2].fill_(0)
        return a

    check(program, x)


def test_writes_through_view_chain_into_root():
    t = to_jax(x.clone())
    y = t[1:]
    z = y.permute(2, 0, 1)[0]
    z.add_(10)
    expected = x.clone()
    expected[1:].permute(2, 0, 1)[0].add_(10)
    assert_same(to_cpu(t), expected)
    assert_same(to_cpu(y), expected[1:])


def test_inplace_view_ops_change_shape_and_keep_aliasing():
    def program(a):
        a = a.clone()
        row = a[1]
        row.unsqueeze_(0)  # a view of a view, reshaped in place
        row.add_(1)
        a.transpose_(0, 2)
        a[0].mul_(2)
        first = a[:1, :1]
        first.squeeze_()
        first.sub_(3)
        a.t_() if a.ndim == 2 else a.swapdims_(0, 1)
        return a, row, first, a[..., :1].squeeze_(-1)

    check(program, x)


def test_quantile_of_scalar_q_is_0d():
    check(
        lambda a: (
            torch.quantile(a, 0.3),
            torch.nanquantile(a, 0.5, dim=1, keepdim=True),
            torch.quantile(a.flatten(), torch.tensor([0.2, 0.9]), interpolation="midpoint"),
        ),
        x,
    )


@pytest.mark.parametrize("dim, chunks", [(0, 2), (1, 3), (-1, 4), (2, 1)])
def test_chunk_cat_pads_uneven_chunks(dim, chunks):
    tensors = (torch.arange(30.0).reshape(2, 3, 5), torch.arange(12.0).reshape(2, 3, 2))
    check(lambda a, b: torch.ops.aten._chunk_cat([a, b], dim, chunks), *tensors)
