"""torchlax.jit's refusals are ``torchlax.JitError``s (a ``TorchlaxError`` and the
``RuntimeError`` they were), an argument it cannot take a ``JitArgumentError`` (also a
``TypeError``), and neither jit nor the Dynamo backend raises a plain built-in error of its
own (a ``RuntimeError`` that is no ``TorchlaxError``)."""

import ast
import importlib.util
from pathlib import Path

import pytest
import torch
import torchlax
from torch import nn


def test_a_step_assigning_a_learning_rate_is_a_jit_error():
    with torchlax.enable():
        model = nn.Linear(3, 2).to("jax")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(4, 3, device="jax")

    def step(x):
        opt.param_groups[0]["lr"] = 0.5  # would be a constant of the program
        opt.zero_grad()
        loss = model(x).sum()
        loss.backward()
        opt.step()
        return loss

    compiled = torchlax.jit(step)
    compiled(x)  # (the first call creates the optimizer's state eagerly)
    with pytest.raises(torchlax.JitError, match=r"param_group\['lr'\]") as caught:
        compiled(x)
    assert isinstance(caught.value, torchlax.TorchlaxError)
    assert isinstance(caught.value, RuntimeError)


def test_an_unhashable_static_argument_is_a_jit_argument_error():
    with torchlax.enable():
        x = torch.randn(2, device="jax")
    with pytest.raises(torchlax.JitArgumentError, match="hashable") as caught:
        torchlax.jit(lambda x, opts: x * 2)(x, {1, 2})  # a set: no pytree node, unhashable
    assert isinstance(caught.value, TypeError)
    assert isinstance(caught.value, torchlax.JitError)


def test_a_value_kept_from_an_earlier_trace_is_a_jit_error():
    # A value of the first trace stored on an object that is no state, read by the next
    # signature's trace: the compiled-program core refuses it, as a JitError (it was a plain
    # RuntimeError).
    class Holder:
        box: dict

    holder = Holder()
    holder.box = {}

    def f(x):
        if "v" in holder.box:
            return x + holder.box["v"]
        holder.box["v"] = x.sum()
        return x

    compiled = torchlax.jit(f)
    with torchlax.enable():
        compiled(torch.ones(3, device="jax"))
        with pytest.raises(torchlax.JitError, match=r"torchlax.jit\(.*f\): the traced function"):
            compiled(torch.ones(4, device="jax"))


def _sources(package: str) -> list[Path]:
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin is not None
    return sorted(Path(spec.origin).parent.rglob("*.py"))


@pytest.mark.parametrize("package", ["torchlax_interop", "torchlax_dynamo"])
def test_jit_and_the_backend_raise_no_plain_builtin_errors(package):
    builtins = {"RuntimeError"}  # (a bad torch.compile option is PyTorch's ValueError)
    plain = []
    for path in _sources(package):
        jit_module = path.parent.name == "jit" or path.name.startswith("_jit")
        if package == "torchlax_interop" and not jit_module:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            value = node.exc if isinstance(node, ast.Raise) else None
            if isinstance(node, ast.Return) and isinstance(node.value, ast.Call):
                value = node.value  # (an error built by a function, raised by its caller)
            if (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Name)
                and value.func.id in builtins
            ):
                plain.append(f"{path.name}:{value.lineno}")
    assert plain == []
