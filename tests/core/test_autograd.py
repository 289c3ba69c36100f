"""Autograd on torchlax Tensors: PyTorch's derivative formulas run on lowered ops.

Every case runs the same code on CPU tensors and on torchlax Tensors and compares values and
gradients (values, dtype, shape); gradients must be torchlax Tensors on the jax device.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import torchlax_core
from eager_compare import assert_same, to_jax


@pytest.fixture(autouse=True)
def _enabled():
    with torchlax_core.enable():
        yield


def _leaf(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    cpu = torch.randn(*shape, generator=g).requires_grad_()
    return cpu, to_jax(cpu)


def _assert_grad(jx, cpu, **tol):
    assert isinstance(jx.grad, torchlax_core.Tensor)
    assert jx.grad.device.type == "jax"
    assert_same(jx.grad, cpu.grad, **tol)


def test_backward_through_lowered_ops():
    x_cpu, x = _leaf(4, 3)
    w_cpu, w = _leaf(3, 5, seed=1)

    def loss(x, w):
        h = torch.relu(x @ w)
        return (h * h).sum() + torch.exp(x).mean() - torch.sin(w).sum()

    expected = loss(x_cpu, w_cpu)
    actual = loss(x, w)
    assert actual.requires_grad and actual.grad_fn is not None
    assert_same(actual, expected, atol=1e-5)
    expected.backward()
    actual.backward()
    _assert_grad(x, x_cpu, atol=1e-5)
    _assert_grad(w, w_cpu, atol=1e-5)


def test_requires_grad_and_grad_fn_follow_pytorch():
    x_cpu, x = _leaf(3)
    assert x.requires_grad and x.is_leaf and x.grad_fn is None
    y = x * 2
    y_cpu = x_cpu * 2
    assert type(y.grad_fn).__name__ == type(y_cpu.grad_fn).__name__ == "MulBackward0"
    assert not y.is_leaf
    plain = to_jax(torch.ones(3, dtype=torch.int64))
    assert not plain.requires_grad


def test_grad_accumulates_over_two_backward_calls():
    x_cpu, x = _leaf(5)
    for t in (x_cpu, x):
        (t * t).sum().backward()
        (3 * t).sum().backward()
    _assert_grad(x, x_cpu)
    grad = x.grad
    (x * 1).sum().backward()
    assert x.grad is grad  # accumulated in place, as PyTorch does


def test_no_grad_records_nothing():
    _, x = _leaf(3)
    with torch.no_grad():
        y = x * 2 + 1
    assert not y.requires_grad and y.grad_fn is None
    with torch.no_grad():
        x.mul_(2)  # allowed on a leaf under no_grad
    assert x.is_leaf and x.grad_fn is None


def test_detach_shares_data_and_stops_gradients():
    x_cpu, x = _leaf(4)
    for t in (x_cpu, x):
        d = t.detach()
        assert not d.requires_grad
        d.mul_(2)  # shares data with t
        (t * d).sum().backward()
    assert_same(x.detach(), x_cpu.detach())
    _assert_grad(x, x_cpu)


def test_tensor_hooks():
    x_cpu, x = _leaf(4)
    seen = {}
    for name, t in (("cpu", x_cpu), ("jax", x)):
        y = t * 3
        y.register_hook(lambda g, name=name: seen.setdefault(name, g.clone()) * 2)
        t.register_hook(lambda g: g + 1)
        (y * y).sum().backward()
    assert isinstance(seen["jax"], torchlax_core.Tensor)
    assert_same(seen["jax"], seen["cpu"])
    _assert_grad(x, x_cpu)


def test_autograd_grad():
    x_cpu, x = _leaf(3, 2)
    results = []
    for t in (x_cpu, x):
        y = (torch.tanh(t) * t).sum()
        (g,) = torch.autograd.grad(y, t)
        results.append(g)
    assert t.grad is None
    assert_same(results[1], results[0], atol=1e-6)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: torch.sin(x) * x,
        lambda x: torch.exp(x * 0.5) + x * x * x,
        lambda x: torch.tanh(x) / (x * x + 1),
    ],
    ids=["sin_mul", "exp_cube", "tanh_div"],
)
def test_higher_order_grads(fn):
    x_cpu, x = _leaf(5)
    out = []
    for t in (x_cpu, x):
        y = fn(t).sum()
        (g,) = torch.autograd.grad(y, t, create_graph=True)
        assert g.requires_grad
        (gg,) = torch.autograd.grad(g.sum(), t, create_graph=True)
        (ggg,) = torch.autograd.grad(gg.sum(), t)
        out.append((g, gg, ggg))
    for a, e in zip(out[1], out[0], strict=True):
        assert_same(a, e, atol=1e-5)


def test_inplace_on_view_of_nonleaf_is_differentiated():
    x_cpu, x = _leaf(6)
    for t in (x_cpu, x):
        y = t * 1
        y[1:4].mul_(3)  # autograd rebases y's history (CopySlices)
        y.view(2, 3)[:, 0].add_(t[:2])
        (y * y).sum().backward()
    _assert_grad(x, x_cpu)


def test_inplace_on_leaf_requiring_grad_raises():
    _, x = _leaf(3)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        x.add_(1)


def test_nn_functional_backward():
    x_cpu, x = _leaf(4, 8)
    w_cpu, w = _leaf(6, 8, seed=1)
    for t, wt in ((x_cpu, w_cpu), (x, w)):
        y = F.gelu(F.linear(t, wt))
        F.log_softmax(y, dim=-1).sum().backward()
    _assert_grad(x, x_cpu, atol=1e-5)
    _assert_grad(w, w_cpu, atol=1e-5)


# -- torch-level function overrides --------------------------------------------------------------


class _SoftsignOverride:
    """Overrides F.softsign with a function whose value is recognisably different."""

    @torchlax_core.hookimpl
    def torchlax_register_lowerings(self, registry):
        registry.register_function(F.softsign, lambda x: torch.full_like(x, 42.0))


def test_function_overrides_are_skipped_while_autograd_records():
    env = torchlax_core.Environment()
    env.register_plugin(_SoftsignOverride(), "softsign-override")
    # With an override registered, Tensor takes the __torch_function__ round trip...
    assert torchlax_core.Tensor.__torch_function__ is not torch._C._disabled_torch_function_impl
    try:
        x_cpu, x = _leaf(4)
        with torchlax_core.enable(env):
            with torch.no_grad():
                assert_same(F.softsign(x), torch.full((4,), 42.0))  # the override ran
            y = F.softsign(x)  # autograd records: PyTorch's own softsign runs
            y_cpu = F.softsign(x_cpu)
            assert_same(y, y_cpu)
            y.sum().backward()
            y_cpu.sum().backward()
            _assert_grad(x, x_cpu)
    finally:
        env.unregister_plugin("softsign-override")
    if not torchlax_core.default_env()._tables.functions:
        # ...and without any, PyTorch skips it (no cost on the eager hot path).
        assert torchlax_core.Tensor.__torch_function__ is torch._C._disabled_torch_function_impl


class _FailingTanhBackward:
    @torchlax_core.hookimpl
    def torchlax_register_lowerings(self, registry):
        def fail(grad_output, output):
            raise ValueError("deliberate failure in a backward lowering")

        registry.register_lowering(torch.ops.aten.tanh_backward.default, fail, override=True)


def test_error_in_backward_lowering_raises_instead_of_aborting():
    env = torchlax_core.Environment()
    env.register_plugin(_FailingTanhBackward(), "failing-tanh-backward")
    _, x = _leaf(3)
    with torchlax_core.enable(env):
        y = torch.tanh(x).sum()
        with pytest.raises(
            RuntimeError,
            match="aten.tanh_backward.default failed during backward "
            "with ValueError: deliberate failure",
        ):
            y.backward()
