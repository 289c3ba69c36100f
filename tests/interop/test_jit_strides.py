"""Under ``torchlax.jit`` results have the strides eager PyTorch gives them: a pointwise op on a
transposed, permuted or sliced input is laid out by TensorIterator's rule (its input's memory
order), as eagerly, and so is a transposed view returned by the function.

Each case runs the function eagerly on CPU tensors and jitted on torchlax Tensors (twice: the
traced call and a compiled one) and compares values, dtype, shape, strides and
``is_contiguous()``.
"""

from __future__ import annotations

import pytest
import torch
import torchlax_core
from torchlax_interop import jit


@pytest.fixture(autouse=True)
def _enabled():
    with torchlax_core.enable():
        yield


def _x():
    return torch.arange(12, dtype=torch.float32).reshape(4, 3) / 7


def _cube():
    return torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) / 5


def _bias(x):
    return torch.linspace(0, 1, 4, device=x.device)


# (function, inputs(on)): ``on`` puts the source tensors on the side under test (identity for
# the CPU, ``.to("jax")``), and the inputs are the same views of them on each side.
CASES = {
    "transposed_times_number": (lambda x: x * 2, lambda on: (on(_x()).t(),)),
    "transposed_plus_bias": (lambda x: x + _bias(x), lambda on: (on(_x()).t(),)),
    "unary_of_transposed": (torch.exp, lambda on: (on(_x()).t(),)),
    "chain_of_ops": (lambda x: torch.relu(x * 2) - 1, lambda on: (on(_x()).t(),)),
    "returns_a_transposed_view": (lambda x: x.t(), lambda on: (on(_x()),)),
    "transposes_inside": (lambda x: torch.sin(x.t()), lambda on: (on(_x()),)),
    "strided_slice_of_transposed": (lambda x: x * 2, lambda on: (on(_x()).t()[:, ::2],)),
    "permuted_3d": (torch.cos, lambda on: (on(_cube()).permute(2, 0, 1),)),
    "transposed_plus_row_major": (torch.add, lambda on: (on(_x()).t(), on(_x()).t().contiguous())),
    "row_major_plus_transposed": (torch.add, lambda on: (on(_x()).t().contiguous(), on(_x()).t())),
    "broadcast_plus_row_major": (torch.add, lambda on: (on(_x())[:, :1].expand(4, 3), on(_x()))),
    "row_major_stays_row_major": (lambda x: x * 2, lambda on: (on(_x()),)),
    # a broadcast input is traced with its stride-0 dimensions: they tell TensorIterator
    # nothing, so the transposed view's result is row-major, as eagerly
    "transposed_broadcast_plus_one": (lambda x: x.t() + 1, lambda on: (_expanded(on),)),
    "transposed_broadcast_3d": (
        lambda x: x.transpose(0, 2) - 1,
        lambda on: (on(_x()[:, :2]).t().unsqueeze(1).expand(2, 3, 4),),
    ),
}


def _expanded(on):
    return on(torch.arange(4, dtype=torch.float32).reshape(4, 1) / 3).expand(4, 3)


def _layout(t):
    return tuple(t.shape), t.stride(), t.is_contiguous(), t.dtype


@pytest.mark.parametrize("name", sorted(CASES))
def test_jit_results_have_eager_strides(name):
    fn, make = CASES[name]
    expected = fn(*make(lambda t: t))
    jitted = jit(fn)
    for _ in range(2):  # the traced call, then the compiled one
        got = jitted(*make(lambda t: t.to("jax")))
        assert isinstance(got, torchlax_core.Tensor)
        assert _layout(got) == _layout(expected)
        torch.testing.assert_close(got.cpu(), expected)


@pytest.mark.parametrize("name", ["returns_a_transposed_view", "transposed_times_number"])
def test_repeated_no_grad_calls_keep_eager_strides(name):
    """A repeated ``no_grad`` forward takes a shortcut past the general path: its results are
    laid out as the first call's, and another input layout is another program."""
    fn, make = CASES[name]
    expected = fn(*make(lambda t: t))
    jitted = jit(fn)
    with torch.no_grad():
        for _ in range(3):  # traced, compiled (recorded), repeated
            got = jitted(*make(lambda t: t.to("jax")))
            assert _layout(got) == _layout(expected)
            torch.testing.assert_close(got.cpu(), expected)


def test_repeated_no_grad_call_with_another_input_layout():
    square = torch.arange(16, dtype=torch.float32).reshape(4, 4)
    jitted = jit(lambda x: x * 2)
    with torch.no_grad():
        jitted(square.to("jax"))
        jitted(square.to("jax"))  # recorded for repeats: row-major input
        got = jitted(square.to("jax").t())  # the same shape and dtype, transposed
    assert _layout(got) == _layout(square.t() * 2)
    torch.testing.assert_close(got.cpu(), square.t() * 2)


def test_a_laid_out_result_is_an_ordinary_tensor():
    """Written to, viewed and made contiguous, it behaves as eager PyTorch's result does."""
    jitted = jit(lambda x: x * 2)
    expected = _x().t() * 2
    got = jitted(_x().to("jax").t())
    assert got._base is None and expected._base is None
    contiguous = got.contiguous()
    assert contiguous.is_contiguous() and contiguous.stride() == expected.contiguous().stride()
    got.add_(1)
    got[0, 1] = -5.0
    expected.add_(1)
    expected[0, 1] = -5.0
    assert _layout(got) == _layout(expected)
    torch.testing.assert_close(got.cpu(), expected)
    torch.testing.assert_close(contiguous.cpu(), _x().t() * 2)  # a copy: not written


def test_gradients_through_a_laid_out_result():
    w = torch.randn(4, 3, requires_grad=True)
    weights = torch.arange(12.0).reshape(3, 4)
    (expected,) = torch.autograd.grad((torch.exp(w.t()) * weights).sum(), w)
    wj = w.detach().to("jax").requires_grad_()
    out = jit(lambda a: torch.exp(a.t()))(wj)
    assert out.stride() == torch.exp(w.t()).stride()
    (got,) = torch.autograd.grad((out * weights.to("jax")).sum(), wj)
    torch.testing.assert_close(got.cpu(), expected)


def test_cpu_tensors_in_and_out_keep_eager_strides():
    jitted = jit(lambda x: x * 2)
    expected = _x().t() * 2
    got = jitted(_x().t())
    assert type(got) is torch.Tensor and got.device.type == "cpu"
    assert _layout(got) == _layout(expected)
    torch.testing.assert_close(got, expected)


def test_gradients_of_a_transposed_input():
    """A transposed input is passed as its storage (in memory order): its gradient comes back
    in the input's own shape, on the traced call and on compiled ones."""
    w = torch.randn(4, 3, requires_grad=True)
    weights = torch.arange(12.0).reshape(3, 4)
    (expected,) = torch.autograd.grad((torch.exp(w.t()) * weights).sum(), w)
    wj = w.detach().to("jax").requires_grad_()
    jitted = jit(torch.exp)
    for _ in range(2):
        out = jitted(wj.t())
        assert out.stride() == (1, 3)
        (got,) = torch.autograd.grad((out * weights.to("jax")).sum(), wj)
        torch.testing.assert_close(got.cpu(), expected)


def test_a_broadcast_input_is_laid_out_as_eagerly_on_torchlax_tensors_too():
    """``x.t() + 1`` of an ``expand()``ed torchlax Tensor: the strides eager code gives it on
    torchlax Tensors and on CPU tensors, traced and compiled; its gradient per element, and an
    in-place write into it refused, as eagerly."""

    def fn(x):
        return x.t() + 1

    cpu = _expanded(lambda t: t.requires_grad_())
    expected = fn(cpu)
    eager = fn(_expanded(lambda t: t.to("jax")))
    assert _layout(eager) == _layout(expected)
    weights = torch.arange(12.0).reshape(3, 4)
    (grad,) = torch.autograd.grad((expected * weights).sum(), cpu)
    jitted = jit(fn)
    for _ in range(2):
        x = _expanded(lambda t: t.to("jax").requires_grad_())
        got = jitted(x)
        assert _layout(got) == _layout(expected)
        torch.testing.assert_close(got.detach().cpu(), expected.detach())
        (got_grad,) = torch.autograd.grad((got * weights.to("jax")).sum(), x)
        torch.testing.assert_close(got_grad.cpu(), grad)
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        jit(lambda x: x.add_(1))(_expanded(lambda t: t.to("jax")))
