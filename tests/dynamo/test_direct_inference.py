"""An inference graph whose AOT autograd runtime wrapper has nothing to do is called directly
(``_direct_inference``); every other graph keeps the wrapper, and both behave as eagerly."""

import copy

import pytest
import torch
import torchlax_core
import torchlax_dynamo._backend as backend_module
from dynamo_helpers import assert_same, to_jax


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


@pytest.fixture
def direct(monkeypatch):
    """Per inference graph compiled: whether it is called directly."""
    decided: list[bool] = []
    decide = backend_module.direct_inference

    def recording(*args):
        call = decide(*args)
        decided.append(call is not None)
        return call

    monkeypatch.setattr(backend_module, "direct_inference", recording)
    return decided


def test_a_no_grad_forward_is_called_directly_and_matches_eager(direct):
    """Values as eagerly on new inputs, and with CPU parameters written in place between
    calls (the cached DLPack views share their memory)."""
    model = mlp()
    compiled = torch.compile(model, backend="torchlax")
    x = torch.randn(5, 8)
    changes = [lambda: None, lambda: None, lambda: model[0].weight.mul_(-2)]
    with torch.no_grad():
        for change in changes:  # the first call goes through AOT autograd's wrapper, no other
            change()
            out = compiled(x)
            assert type(out) is torch.Tensor and out._base is None and not out.requires_grad
            assert_same(out, model(x))
            x = x + 1
    assert direct == [True]


def test_a_no_grad_forward_on_torchlax_tensors_is_called_directly(direct):
    model = mlp()
    x = torch.randn(5, 8)
    with torch.no_grad():
        expected = model(x)
        compiled = torch.compile(to_jax(model), backend="torchlax")
        for _ in range(2):
            out = compiled(to_jax(x))
            assert isinstance(out, torchlax_core.Tensor)
            assert_same(out, expected)
    assert direct == [True]


def test_grad_mode_on_after_no_grad_calls_recompiles_and_gradients_flow(direct):
    """Dynamo guards grad mode: the directly called inference graph is never used with grad
    mode on; the call recompiles a graph with a backward, and the gradients are eager's."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)  # small: this test compiles a backward too
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend="torchlax")
    x = torch.randn(5, 8)
    with torch.no_grad():
        compiled(x)
        compiled(x)
    out = compiled(x)
    assert out.requires_grad
    out.square().sum().backward()
    reference(x).square().sum().backward()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert_same(p.grad, q.grad, rtol=1e-5, atol=1e-6)
    with torch.no_grad():  # back to the inference graph, still direct
        assert_same(compiled(x), reference(x))
    assert direct == [True]


def _returns_a_view(x):
    return x.t(), x * 2


def _writes_its_input(acc, x):
    acc.add_(x)
    return acc.sum()


@pytest.mark.parametrize("fn", [_returns_a_view, _writes_its_input], ids=lambda f: f.__name__)
def test_graphs_whose_wrapper_has_work_keep_it(direct, fn):
    """An output aliasing an input, or an input written in place: AOT autograd's wrapper
    rebuilds the view or writes the input back, so the graph is not called directly."""
    compiled = torch.compile(fn, backend="torchlax")
    with torch.no_grad():
        for _ in range(2):
            args = [torch.randn(2, 3) for _ in range(fn.__code__.co_argcount)]
            expected_args = [a.clone() for a in args]
            out, expected = compiled(*args), fn(*expected_args)
            for a, b in zip(args, expected_args, strict=True):
                assert_same(a, b)
            if fn is _returns_a_view:
                assert out[0]._base is args[0] and out[0].stride() == expected[0].stride()
            assert_same(out, expected)
    assert direct == [False]


def test_an_inference_graph_under_grad_mode_keeps_the_wrapper(direct):
    """No input requires grad but grad mode is on: AOT autograd's wrapper switches grad mode
    off around the call, so the graph keeps it."""
    compiled = torch.compile(lambda x: x.sin() * 2, backend="torchlax")
    x = torch.randn(4)
    out = compiled(x)
    assert not out.requires_grad
    assert_same(out, x.sin() * 2)
    assert direct == [False]
