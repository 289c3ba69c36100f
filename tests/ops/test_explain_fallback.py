"""``torchlax.explain`` and the CPU fallback for an op nothing lowers (a custom op)."""

from __future__ import annotations

import os
import sys
import warnings

import jax
import pytest
import torch
import torchlax_core
import torchlax_ops
from torchlax_core import OpNotLoweredError

sys.path.insert(0, os.path.dirname(__file__))
from _compare_cpu import run_jit, to_jax  # noqa: E402


@torch.library.custom_op("torchlax_test::scaled_sin", mutates_args=())
def scaled_sin(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.sin(x) * scale


@scaled_sin.register_fake
def _(x, scale):
    return torch.empty_like(x)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.relu(scaled_sin(self.linear(x), 2.0))


OP = torch.ops.torchlax_test.scaled_sin.default


@pytest.fixture
def fallback():
    env = torchlax_core.default_env()
    before = env.config.fallback_to_torch
    env.config.fallback_to_torch = True
    env._resolved.clear()  # resolutions made with the old setting
    env._warned.discard(("fallback", OP))
    yield env
    env.config.fallback_to_torch = before
    env._resolved.clear()


def test_explain_names_the_missing_custom_op():
    report = torchlax_ops.explain(Model(), torch.randn(2, 4))
    names = [use.name for use in report.ops]
    assert "torchlax_test.scaled_sin.default" in names
    assert [use.name for use in report.missing] == ["torchlax_test.scaled_sin.default"]
    assert "aten.addmm.default" in names and "aten.relu.default" in names
    assert report.error is None and not report.ok
    text = str(report)
    assert "torchlax_test.scaled_sin.default" in text and "not lowered" in text
    addmm = next(u for u in report.ops if u.name == "aten.addmm.default")
    assert addmm.plugin == "ops" and addmm.how == "lowering"


def test_explain_follows_inplace_and_backward():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())

    def step(x):
        out = model(x) * 2
        out.add_(1)
        out.sum().backward()

    report = torchlax_ops.explain(step, torch.randn(2, 4))
    uses = {u.name: u for u in report.ops}
    assert uses["aten.add_.Tensor"].derived_from == torch.ops.aten.add.Tensor
    assert uses["aten.add_.Tensor"].lowered
    assert "aten.threshold_backward.default" in uses  # relu's backward was traced
    assert report.error is None, report.error
    assert model[0].weight.grad is None  # the real module was not touched


def test_explain_of_a_fully_lowered_program_is_ok():
    report = torchlax_ops.explain(
        lambda x: torch.nn.functional.softmax(x @ x.T, -1), torch.randn(3, 3)
    )
    assert report.ok, str(report)


def test_without_fallback_the_op_raises():
    model = Model()
    with torchlax_core.enable():
        on_jax = model.to("jax")
        with pytest.raises(OpNotLoweredError, match="torchlax_test.scaled_sin"):
            on_jax(torch.randn(2, 4).to("jax"))


def test_fallback_runs_on_cpu_eagerly_and_warns_once(fallback):
    torch.manual_seed(0)
    model = Model()
    x = torch.randn(2, 4)
    expected = model(x)
    with torchlax_core.enable():
        on_jax = model.to("jax")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            first = on_jax(x.to("jax"))
            second = on_jax(x.to("jax"))
    messages = [str(w.message) for w in caught if "scaled_sin" in str(w.message)]
    assert len(messages) == 1, messages
    assert isinstance(first, torchlax_core.Tensor)
    for out in (first, second):
        torch.testing.assert_close(out.detach().cpu(), expected.detach())


def test_fallback_under_jit(fallback):
    torch.manual_seed(0)
    x = torch.randn(3, 4)

    def fn(t):
        return scaled_sin(t * 2, 0.5) + 1

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = run_jit(fn, *to_jax((x,)))
    assert isinstance(jax.numpy.asarray(out.jax()), jax.Array)
    torch.testing.assert_close(out.cpu(), fn(x))
