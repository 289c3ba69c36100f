"""Views report PyTorch's strides, storage offsets and ``_base``, so that which call returns a
view and which a copy (``contiguous``, ``reshape``, ``flatten``) is PyTorch's answer.

Each case runs the same function on a CPU tensor and on a torchlax Tensor, then compares the
result's layout, whether it is a view of the input, and whether a write to it reaches the input.
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
    return torch.arange(24, dtype=torch.float32).reshape(4, 6).clone()  # a root, not a view


CASES = {
    "t": lambda x: x.t(),
    "transpose_3d": lambda x: x.view(2, 3, 4).transpose(0, 2),
    "permute": lambda x: x.view(2, 3, 4).permute(1, 2, 0),
    "select": lambda x: x[1],
    "select_col": lambda x: x[:, 2],
    "slice": lambda x: x[1:3, 2:],
    "slice_step": lambda x: x[::2, 1::3],
    "narrow": lambda x: x.narrow(1, 1, 4),
    "diagonal": lambda x: x.diagonal(1),
    "unfold": lambda x: x.unfold(1, 2, 2),
    "expand": lambda x: x[:, :1].expand(4, 5),
    "broadcast_to": lambda x: x[0].broadcast_to(3, 6),
    "split": lambda x: x.split(2, dim=1)[1],
    "tensor_split": lambda x: x.tensor_split(3, dim=1)[2],
    "hsplit": lambda x: x.hsplit(2)[1],
    "vsplit": lambda x: x.vsplit([1, 3])[1],
    "dsplit": lambda x: x.view(2, 3, 4).dsplit(2)[1],
    "unbind": lambda x: x.unbind(1)[4],
    "movedim": lambda x: x.view(2, 3, 4).movedim(0, -1),
    "contiguous_of_contiguous": lambda x: x.contiguous(),
    "contiguous_of_t": lambda x: x.t().contiguous(),
    "contiguous_of_slice": lambda x: x[:, 1:].contiguous(),
    "contiguous_of_rows": lambda x: x[1:3].contiguous(),
    "reshape_view": lambda x: x.reshape(3, 8),
    "reshape_of_t": lambda x: x.t().reshape(24),
    "reshape_of_t_viewable": lambda x: x.t().reshape(2, 3, 4),
    "reshape_of_slice": lambda x: x[:, ::2].reshape(-1),
    "reshape_of_rows": lambda x: x[1:3].reshape(-1),
    "flatten": lambda x: x.flatten(),
    "flatten_of_t": lambda x: x.t().flatten(),
    "flatten_of_permute": lambda x: x.view(2, 3, 4).permute(0, 2, 1).flatten(1),
    "view_of_select": lambda x: x[2].view(2, 3),
    "squeeze_unsqueeze": lambda x: x[:, 1:2].squeeze(1).unsqueeze(0),
    "t_of_t": lambda x: x.t().t(),
}


def _layout(t):
    return tuple(t.shape), t.stride(), t.storage_offset(), t.is_contiguous()


@pytest.mark.parametrize("name", sorted(CASES))
def test_layout_and_aliasing_match_pytorch(name):
    fn = CASES[name]
    cpu = _base()
    jx = to_jax(cpu)
    expected, actual = fn(cpu), fn(jx)
    assert _layout(actual) == _layout(expected)
    assert actual._base is (None if expected._base is None else jx)
    # A write to the result reaches the input exactly when it does in PyTorch.
    if 0 not in expected.stride():  # (PyTorch refuses to write to an expanded tensor)
        expected.mul_(-1)
        actual.mul_(-1)
        assert_same(jx, cpu)
        assert_same(actual, expected)


def test_transposed_contiguous_is_a_copy():
    # Attention code: transpose(...).contiguous() then in place must not change the source.
    x = to_jax(torch.arange(6.0).reshape(2, 3))
    y = x.t().contiguous()
    y.mul_(10)
    assert_same(x, torch.arange(6.0).reshape(2, 3))
    assert y.is_contiguous() and y.stride() == (2, 1)


def test_view_of_non_viewable_layout_raises_as_pytorch():
    x = to_jax(_base())
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        x.t().view(24)
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        _base().t().view(24)


def test_in_place_view_ops_update_strides():
    for op in (lambda t: t.t_(), lambda t: t.transpose_(0, 1), lambda t: t.unsqueeze_(1)):
        cpu = _base()
        jx = to_jax(cpu)
        op(cpu)
        op(jx)
        assert _layout(jx) == _layout(cpu)


def test_as_strided_of_a_view_counts_from_the_storage():
    cpu = torch.arange(20.0)
    jx = to_jax(cpu)
    expected = cpu[5:15].as_strided((2, 3), (3, 2))
    actual = jx[5:15].as_strided((2, 3), (3, 2))
    assert _layout(actual) == _layout(expected)
    assert_same(actual, expected)


COMPLEX_CASES = {
    "view_as_real": torch.view_as_real,
    "real": lambda z: z.real,
    "imag": lambda z: z.imag,
    "view_as_real_of_t": lambda z: torch.view_as_real(z.t()),
}


@pytest.mark.parametrize("name", sorted(COMPLEX_CASES))
def test_complex_view_layouts_match_pytorch(name):
    cpu = torch.arange(12, dtype=torch.float32).reshape(3, 4).to(torch.complex64)
    jx = to_jax(cpu)
    expected, actual = COMPLEX_CASES[name](cpu), COMPLEX_CASES[name](jx)
    assert _layout(actual) == _layout(expected)
    assert actual._base is jx
    assert_same(actual, expected)
