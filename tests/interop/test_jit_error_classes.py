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


def test_a_tracer_jax_refuses_in_the_trace_is_a_jit_error_and_the_state_is_put_back():
    # JAX's UnexpectedTracerError raised while the step is traced (a value of another trace
    # it cannot take in as an input): a JitError naming the jitted function, raised after the
    # state the step changed was put back, and a later call that does not raise it compiles.
    import jax

    with torchlax.enable():
        model = nn.BatchNorm1d(3).to("jax")
        x = torch.randn(4, 3, device="jax")
    stats = model.running_mean
    assert stats is not None
    before = stats.cpu().clone()
    fail = [True]

    def forward(x):
        out = model(x)  # (writes the running statistics)
        if fail[0]:
            raise jax.errors.UnexpectedTracerError("Encountered an unexpected tracer.")
        return out

    compiled = torchlax.jit(forward)
    with pytest.raises(torchlax.JitError, match=r"torchlax.jit\(.*forward\): a tensor from"):
        compiled(x)
    assert torch.equal(stats.cpu(), before)
    fail[0] = False
    compiled(x)
    assert not torch.equal(stats.cpu(), before)


def test_refusals_of_what_the_state_walk_did_not_find_say_alike_where_it_looks():
    # An optimizer stepped, a module trained and a tensor written that the walk did not find
    # (deeper than it goes): each error says, in the same words, where torchlax.jit looks for
    # state and how far.
    with torchlax.enable():
        model, hidden = nn.Linear(3, 1).to("jax"), nn.Linear(3, 1).to("jax")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        buf = torch.zeros(3, device="jax")
        x = torch.randn(2, 3, device="jax")
    deep = [[[[{"opt": opt, "net": hidden, "buf": buf}]]]]

    def steps_an_optimizer(x):
        model(x).sum().backward()
        deep[0][0][0][0]["opt"].step()

    def trains_a_module(x):
        deep[0][0][0][0]["net"](x).sum().backward()

    def writes_a_tensor(x):
        deep[0][0][0][0]["buf"].add_(1)
        return model(x)

    said = {}
    for step, what in (
        (steps_an_optimizer, r"calls SGD\.step\(\) on an optimizer that is not"),
        (trains_a_module, r"Linear at deep\[0\]\[0\]\[0\]\[0\]\['net'\]"),
        (writes_a_tensor, r"writes into the float32 tensor of shape \(3,\) at deep"),
    ):
        with pytest.raises(torchlax.JitError, match=what) as caught:
            torchlax.jit(step)(x)
        message = str(caught.value)
        start = message.index("torchlax.jit makes state of")
        said[step.__name__] = message[start : message.index("docs/training.md)", start)]
    assert len(set(said.values())) == 1, said
    assert (
        "up to 4 levels deep, 64 items per container or object and 1024 in all"
        in said["steps_an_optimizer"]
    )
    assert buf.cpu().tolist() == [0.0, 0.0, 0.0]  # (put back)


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


def test_unfound_state_error_words_an_optimizer_and_a_module_each_their_own_way():
    # One builder for both (``_refusals.unfound_state_error``): each sentence names the object,
    # what the step did with it and what to do.
    from torchlax_interop.jit._refusals import _STATE_IS_FOUND, unfound_state_error

    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fix = "directly, or pass it as an argument of the jitted function."
    error = unfound_state_error("torchlax.jit(step)", opt)
    assert isinstance(error, torchlax.JitError)
    assert str(error) == (
        "torchlax.jit(step): the step calls SGD.step() on an optimizer that is not part of the "
        f"compiled step's state. {_STATE_IS_FOUND}. Close over the optimizer {fix}"
    )
    module_words = (
        "which is not part of the compiled step's state: its parameters would be constants of "
        "the program, and it would not train. "
        f"{_STATE_IS_FOUND}. Close over the module (or its optimizer) {fix}"
    )
    assert str(unfound_state_error("torchlax.jit(step)", model, "cfg.net")) == (
        "torchlax.jit(step): the step computes gradients for the parameters of the Linear at "
        f"cfg.net, {module_words}"
    )
    assert str(unfound_state_error("torchlax.jit(step)", model, None)) == (
        "torchlax.jit(step): the step computes gradients for the parameters of the Linear "
        "called inside the step (the function does not reach it within the search), " + module_words
    )


@pytest.mark.parametrize(
    ("kind", "cpu", "says", "then"),
    [
        ("write", False, "the step writes into the float32 tensor", "the write would happen once"),
        ("grad", False, "the step gives a .grad to the float32 tensor", "it would not train"),
        ("write", True, "the step writes into the CPU float32 tensor", "A plain CPU tensor"),
        ("grad", True, "the step gives a .grad to the CPU float32 tensor", "A plain CPU tensor"),
        ("backward", True, "the step's backward() gives a .grad to the CPU", "A plain CPU"),
        ("crossing", True, "the step's backward() would carry the gradient", "leave the"),
    ],
)
def test_each_kind_of_change_to_a_tensor_is_worded_with_the_tensor_and_what_to_do(
    kind, cpu, says, then
):
    # One builder (``_refusals.changed_tensor_error``), one row of its table per kind: the
    # tensor, where the function holds it, why the change cannot be compiled, and what to do.
    from torchlax_interop.jit._refusals import changed_tensor_error

    t = torch.ones(3)
    if not cpu:
        with torchlax.enable():
            t = t.to("jax")
    error = changed_tensor_error(
        "torchlax.jit(step)", kind, [(t, "cfg.w"), (t, None)], "backward()"
    )
    assert isinstance(error, torchlax.JitError)
    words = str(error)
    assert words.startswith(f"torchlax.jit(step): {says}")
    assert "of shape (3,) at cfg.w" in words and "(1 more such tensor too)" in words
    assert then in words
    assert "Move the tensor to the 'jax' device" in words if cpu else "Pass the tensor" in words
