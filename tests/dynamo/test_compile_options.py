"""torch.compile(backend="torchlax") as users call it: modes, options, ops without tensor
outputs, and indexing that PyTorch tags as possibly data-dependent."""

import logging

import pytest
import torch
import torchlax_core
import torchlax_dynamo
from dynamo_helpers import assert_same, to_jax
from torchlax_dynamo import _backend


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


@pytest.mark.parametrize("mode", ["max-autotune", "reduce-overhead"])
def test_modes_compile_the_same_program_and_say_so_once(mode, caplog, monkeypatch):
    monkeypatch.setattr(_backend, "_noted_modes", set())
    model, x = _mlp(), torch.randn(4, 8)
    with caplog.at_level(logging.INFO, logger="torchlax"):
        out = torch.compile(model, backend="torchlax", mode=mode)(x)
        torch._dynamo.reset()
        torch.compile(model, backend="torchlax", mode=mode)(x)
    assert_same(out, model(x))
    assert torchlax_dynamo.counters["eager_nodes"] == 0
    notes = [r.getMessage() for r in caplog.records if f"mode={mode!r}" in r.getMessage()]
    assert len(notes) == 1 and "same XLA program" in notes[0]


def test_unknown_mode_and_options_are_rejected():
    with pytest.raises(Exception, match="got mode='fastest'; it takes one of 'default'"):
        torch.compile(lambda x: x + 1, backend="torchlax", mode="fastest")(torch.ones(2))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="unknown options"):
        torch.compile(lambda x: x + 1, backend="torchlax", options={"nonsense": 1})(torch.ones(2))


def test_compilation_is_logged(caplog):
    with caplog.at_level(logging.INFO, logger="torchlax"):
        torch.compile(lambda x: (x * 2).sum(), backend="torchlax")(torch.ones(3))
    messages = " | ".join(r.getMessage() for r in caplog.records)
    assert "Dynamo graph with" in messages
    assert "XLA program" in messages and " ms" in messages


# -- ops without a tensor output ----------------------------------------------------------------

_recorded = []


@torch.library.custom_op("torchlax_test::record_value", mutates_args=())
def _record_value(x: torch.Tensor) -> None:
    _recorded.append(x.clone())


@_record_value.register_fake
def _(x):
    return None


# A side effect, as print or logging is: Dynamo and AOT autograd must keep it.
torch.fx.node.has_side_effect(torch.ops.torchlax_test.record_value.default)


@pytest.mark.parametrize("on_jax", [False, True], ids=["cpu", "jax"])
def test_unlowered_op_without_tensor_output_runs_eagerly(on_jax):
    def f(x):
        y = x * 2
        _record_value(y)
        return y + 1

    _recorded.clear()
    x = torch.arange(3.0)
    with torchlax_core.enable(torchlax_core.Environment()):  # its own warn-once memory
        with pytest.warns(UserWarning, match="no JAX lowering for torchlax_test.record_value"):
            out = torch.compile(f, backend="torchlax")(to_jax(x) if on_jax else x)
    assert_same(out, f(x.clone()))
    assert torchlax_dynamo.counters["eager_nodes"] == 1
    torch.testing.assert_close(_recorded[0], x * 2)


def test_assert_async_under_compile():
    def f(x):
        torch._assert_async((x > 0).all())
        torch._assert_async(x.sum() > 0, "the sum must be positive")
        return x * 2

    x = torch.ones(3, requires_grad=True)
    out = torch.compile(f, backend="torchlax")(x)
    assert_same(out, f(x))
    out.sum().backward()
    assert_same(x.grad, torch.full((3,), 2.0))
    assert torchlax_dynamo.counters["eager_nodes"] == 0  # lowered: inside the XLA program


# -- indexing PyTorch tags dynamic_output_shape ---------------------------------------------


class _RelativeBias(torch.nn.Module):
    """Swin's relative position bias: a table gathered with a fixed integer index."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.table = torch.nn.Parameter(torch.randn(9, 2))
        self.register_buffer("index", torch.randint(0, 9, (4, 4)))

    def forward(self, x):
        bias = self.table[self.index.view(-1)].view(4, 4, 2).permute(2, 0, 1)
        return x.softmax(-1) + bias + x[:, :, torch.tensor([0, 2]), :].sum()


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_integer_indexing_stays_in_the_xla_program(train):
    model = _RelativeBias()
    x = torch.randn(3, 2, 4, 4)
    compiled_model = _RelativeBias()
    xc = x.clone().requires_grad_(train)
    out = torch.compile(compiled_model, backend="torchlax")(xc)
    xe = x.clone().requires_grad_(train)
    expected = model(xe)
    assert_same(out, expected)
    if train:
        out.square().sum().backward()
        expected.square().sum().backward()
        # Gradients of ~100 summed over 96 elements: float32 summation order differs.
        assert_same(xc.grad, xe.grad, rtol=1e-5, atol=1e-3)
        assert_same(compiled_model.table.grad, model.table.grad, rtol=1e-5, atol=1e-3)
    # One forward program (and one backward program), nothing eager between.
    assert torchlax_dynamo.counters["eager_nodes"] == 0
    assert torchlax_dynamo.counters["xla_programs"] == (2 if train else 1)


def test_boolean_mask_indexing_runs_eagerly():
    def f(x):
        return x[x > 0].sum() + 1

    x = torch.randn(3, 4)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        out = torch.compile(f, backend="torchlax")(x)
    assert_same(out, f(x))
    assert torchlax_dynamo.counters["eager_nodes"] == 1
