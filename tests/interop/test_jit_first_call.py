"""torchlax.jit's first call of a training step is compiled: at most 5 XLA compilations (its
program, the steady step's compiled ahead, tiny helpers), none on later calls, and the
values of eager PyTorch on the CPU.

Compilations are counted with JAX's public monitoring events (every backend compilation in
the process, torchlax's own programs, op executables and JAX's helpers alike)."""

import copy

import jax.monitoring
import pytest
import torch
import torch.nn.functional as F
import torchlax
from torch import nn
from torch.utils._pytree import tree_map_only
from torchlax_interop.jit import _first_call

pytestmark = pytest.mark.usefixtures("float64_default")

_compiles = [0]


def _count(event: str, duration_secs: float, **_) -> None:  # noqa: ARG001
    if event == "/jax/core/compile/backend_compile_duration":
        _compiles[0] += 1


jax.monitoring.register_event_duration_secs_listener(_count)

OPTIMIZERS = {
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
    "sgd-momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
}


def _model(batchnorm: bool) -> nn.Module:
    torch.manual_seed(0)
    # No bias before BatchNorm: its gradient would be rounding noise (BatchNorm takes the mean
    # out), which AdamW scales to a visible update, unlike from one CPU to another.
    layers = [nn.Linear(6, 8, bias=not batchnorm)] + ([nn.BatchNorm1d(8)] if batchnorm else [])
    return nn.Sequential(*layers, nn.ReLU(), nn.Linear(8, 3))


def _step_fn(model, opt):
    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    return step


@pytest.mark.parametrize(
    ("name", "batchnorm"), [("adamw", False), ("sgd-momentum", False), ("adamw", True)]
)
def test_first_call_compiles_at_most_5_programs_and_later_calls_none(name, batchnorm):
    ref = _model(batchnorm)
    ref_opt = OPTIMIZERS[name](ref.parameters())
    with torchlax.enable():
        model = copy.deepcopy(ref).to("jax")
        opt = OPTIMIZERS[name](model.parameters())
    reference, compiled = _step_fn(ref, ref_opt), torchlax.jit(_step_fn(model, opt))
    g = torch.Generator().manual_seed(1)
    per_call = []
    for _ in range(3):
        x, y = torch.randn(4, 6, generator=g), torch.randint(0, 3, (4,), generator=g)
        want = reference(x, y)
        x_jax, y_jax = torchlax.from_torch(x), torchlax.from_torch(y)
        before = _compiles[0]
        got = compiled(x_jax, y_jax)
        per_call.append(_compiles[0] - before)
        torch.testing.assert_close(got.cpu(), want, rtol=1e-10, atol=1e-10)
    assert per_call[0] <= 5 and per_call[1:] == [0, 0], per_call
    # the first call's program and the steady one, ahead
    assert compiled.compilations == 2  # pyright: ignore[reportFunctionMemberAccess]  (jit returns a Callable)
    for (key, w), got in zip(ref.state_dict().items(), model.state_dict().values(), strict=True):
        torch.testing.assert_close(got.cpu(), w, rtol=1e-10, atol=1e-10, msg=key)
    for p_ref, p in zip(ref.parameters(), model.parameters(), strict=True):
        assert p.grad is not None
        torch.testing.assert_close(p.grad.cpu(), p_ref.grad, rtol=1e-10, atol=1e-10)
        state, ref_state = opt.state[p], ref_opt.state[p_ref]
        assert list(state) == list(ref_state)  # the entries PyTorch creates, in its order
        for key, w in ref_state.items():
            torch.testing.assert_close(state[key].cpu(), w, rtol=1e-10, atol=1e-10, msg=key)


def test_a_resumed_step_compiles_one_program_and_goes_on_bit_for_bit():
    # A process resuming from a checkpoint: optimizer state restored, no .grads. Its first
    # call's program (no .grads in) is the steady step's too (which discards the .grads the
    # first call left, zero_grad setting them to None first): one program, not two.
    g = torch.Generator().manual_seed(1)
    data = [
        (torch.randn(4, 6, generator=g), torch.randint(0, 3, (4,), generator=g)) for _ in range(4)
    ]
    data = [(torchlax.from_torch(x), torchlax.from_torch(y)) for x, y in data]

    def build():
        with torchlax.enable():
            model = _model(False).to("jax")
        opt = OPTIMIZERS["adamw"](model.parameters())
        return model, opt, torchlax.jit(_step_fn(model, opt))

    model, opt, step = build()
    losses = [step(*batch) for batch in data[:2]]
    with torchlax.enable():  # (saved through the CPU, restored onto the jax device)
        checkpoint = tree_map_only(
            torch.Tensor, lambda t: t.cpu().to("jax"), (model.state_dict(), opt.state_dict())
        )
    losses += [step(*batch) for batch in data[2:]]

    model, opt, step = build()  # another process, restored
    with torchlax.enable():
        model.load_state_dict(checkpoint[0])
        opt.load_state_dict(checkpoint[1])
    assert all(p.grad is None for p in model.parameters())
    per_call, resumed = [], []
    for batch in data[2:]:
        before = _compiles[0]
        resumed.append(step(*batch))
        per_call.append(_compiles[0] - before)
    assert step.compilations == 1, step.compilations  # pyright: ignore[reportFunctionMemberAccess]  (jit returns a Callable)
    assert per_call[1] == 0, per_call
    for got, want in zip(resumed, losses[2:], strict=True):
        assert torch.equal(got.cpu(), want.cpu()), (got, want)  # bit for bit


@pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError])
def test_a_first_call_interrupted_while_the_steady_step_is_traced_leaves_the_state_as_before(
    exc, monkeypatch
):
    # The steady step is traced over stand-ins of the state the first call creates: an
    # interruption there puts everything back (an error too, and the call then runs
    # eagerly), and the next calls run as eager PyTorch's.
    ref = _model(False)
    ref_opt = OPTIMIZERS["adamw"](ref.parameters())
    with torchlax.enable():
        model = copy.deepcopy(ref).to("jax")
        opt = OPTIMIZERS["adamw"](model.parameters())
    reference, compiled = _step_fn(ref, ref_opt), torchlax.jit(_step_fn(model, opt))
    before = [p.detach().cpu().clone() for p in model.parameters()]
    compile_ahead = _first_call._compile_ahead
    seen = []

    def interrupted(jitted, args, kwargs, mode):
        if mode is _first_call.FIRST:
            return compile_ahead(jitted, args, kwargs, mode)
        seen.append([sorted(opt.state[p]) for p in model.parameters()])  # the stand-ins
        raise exc("interrupted")

    monkeypatch.setattr(_first_call, "_compile_ahead", interrupted)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 6, generator=g), torch.randint(0, 3, (4,), generator=g)
    if exc is KeyboardInterrupt:
        with pytest.raises(exc, match="interrupted"):
            compiled(torchlax.from_torch(x), torchlax.from_torch(y))
    else:  # an error: put back, then the first call runs eagerly (as a refused trace does)
        want = reference(x, y)
        got = compiled(torchlax.from_torch(x), torchlax.from_torch(y))
        torch.testing.assert_close(got.cpu(), want, rtol=1e-10, atol=1e-10)
    monkeypatch.undo()
    assert seen == [[["exp_avg", "exp_avg_sq", "step"]] * 4]
    if exc is KeyboardInterrupt:
        assert all(not opt.state[p] and p.grad is None for p in model.parameters())
        for p, b in zip(model.parameters(), before, strict=True):
            assert torch.equal(p.detach().cpu(), b)
    for _ in range(3):
        x, y = torch.randn(4, 6, generator=g), torch.randint(0, 3, (4,), generator=g)
        want = reference(x, y)
        got = compiled(torchlax.from_torch(x), torchlax.from_torch(y))
        torch.testing.assert_close(got.cpu(), want, rtol=1e-10, atol=1e-10)
    for p_ref, p in zip(ref.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(p.detach().cpu(), p_ref.detach(), rtol=1e-10, atol=1e-10)


def test_a_resumed_step_that_branches_on_a_grad_being_none_keeps_two_programs():
    # Before zero_grad, this step reads whether a .grad is None (not its value): with the
    # .grads the first call left it computes another program than without them.
    torch.manual_seed(0)
    ref = nn.Linear(3, 2)
    ref_opt = OPTIMIZERS["sgd-momentum"](ref.parameters())
    ref_opt.step()  # (no .grads: a momentum-less no-op; the state is created below)
    with torchlax.enable():
        model = copy.deepcopy(ref).to("jax")
        opt = OPTIMIZERS["sgd-momentum"](model.parameters())
    for o, params in ((ref_opt, ref.parameters()), (opt, model.parameters())):
        for p in params:  # resumed: momentum buffers restored, no .grads
            o.state[p]["momentum_buffer"] = torch.ones_like(p)

    def step_fn(model, opt):
        def step(x):
            scale = 0.5 if model.weight.grad is None else 2.0
            opt.zero_grad()
            (model(x).square().sum() * scale).backward()
            opt.step()
            return model.weight.detach().sum()

        return step

    reference, compiled = step_fn(ref, ref_opt), torchlax.jit(step_fn(model, opt))
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        x = torch.randn(4, 3, generator=g)
        want = reference(x)
        got = compiled(torchlax.from_torch(x))
        torch.testing.assert_close(got.cpu(), want, rtol=1e-10, atol=1e-10)
    assert compiled.compilations == 2  # pyright: ignore[reportFunctionMemberAccess]  (jit returns a Callable)


def test_the_steady_step_is_traced_once_with_the_grads_it_discards_left_out():
    # The first layer's .grads are set to None before they are read (not inputs of the steady
    # step), the last layer's accumulate (read): the steady program comes from one trace of
    # the step, those .grads' inputs and outputs left out of it, the positions of the others
    # renumbered; the step's Python runs twice on the first call (its own program, the
    # steady one ahead), then only for a new batch size.
    ref = _model(False)
    ref_opt = OPTIMIZERS["adamw"](ref.parameters())
    with torchlax.enable():
        model = copy.deepcopy(ref).to("jax")
        opt = OPTIMIZERS["adamw"](model.parameters())

    def step_fn(model, opt, runs):
        def step(x, y):
            runs[0] += 1
            model[0].zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss.detach()

        return step

    runs = [0]
    reference, compiled = step_fn(ref, ref_opt, [0]), torchlax.jit(step_fn(model, opt, runs))
    g = torch.Generator().manual_seed(1)
    per_call = []
    for batch in (4, 4, 4, 4, 5, 5):
        x, y = torch.randn(batch, 6, generator=g), torch.randint(0, 3, (batch,), generator=g)
        want = reference(x, y)
        before = runs[0]
        got = compiled(torchlax.from_torch(x), torchlax.from_torch(y))
        per_call.append(runs[0] - before)
        torch.testing.assert_close(got.cpu(), want, rtol=1e-10, atol=1e-10)
    # (another batch size: the program without those .grads traced for it, once)
    assert per_call == [2, 0, 0, 0, 1, 0]
    assert compiled.compilations == 3  # pyright: ignore[reportFunctionMemberAccess]  (jit returns a Callable)
    for p_ref, p in zip(ref.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(p.detach().cpu(), p_ref.detach(), rtol=1e-10, atol=1e-10)
        assert p.grad is not None
        torch.testing.assert_close(p.grad.cpu(), p_ref.grad, rtol=1e-10, atol=1e-10)
        for key, w in ref_opt.state[p_ref].items():
            torch.testing.assert_close(opt.state[p][key].cpu(), w, rtol=1e-10, atol=1e-10)


def test_the_dead_grad_match_compares_equations_not_unread_inputs_or_rule_objects():
    # A resumed step's first program is the steady one where the two traces' equations match
    # (_program._equations): an input the trace never reads, and a custom rule made anew in
    # each trace (another function object), change nothing; another constant, or another
    # value read where the other read one already used, is another program.
    from jax import numpy as jnp
    from torchlax_interop.jit._program import _equations

    def sine():
        @jax.custom_vjp
        def f(x):
            return jnp.sin(x)

        f.defvjp(lambda x: (f(x), x), lambda r, g: (g * jnp.cos(r),))
        return f

    def equations(fn, *args):
        return _equations(jax.make_jaxpr(fn)(*args).jaxpr)

    steady = equations(lambda a, b: sine()(a) * b * 2.0, 1.0, 3.0)
    assert equations(lambda a, unread, b: sine()(a) * b * 2.0, 1.0, 2.0, 3.0) == steady
    assert equations(lambda a, b: sine()(a) * b * 3.0, 1.0, 3.0) != steady
    assert equations(lambda a, b: sine()(a) * a * 2.0, 1.0, 3.0) != steady


def test_compiling_a_call_ahead_runs_nothing_and_the_call_then_launches_that_entry():
    """``_first_call._compile_ahead`` traces and compiles the entry a call would run without
    launching it: the parameters, ``.grad``s and optimizer state stay as they were, and the
    call that follows runs that very entry (nothing compiled again) with eager's values."""
    ref, model = _model(False), _model(False)  # (seeded: the same initial values)
    with torchlax.enable():
        model.to("jax")
        opt = OPTIMIZERS["adamw"](model.parameters())
    compiled = torchlax.jit(_step_fn(model, opt))
    reference = _step_fn(ref, OPTIMIZERS["adamw"](ref.parameters()))
    compiled._first_call = False  # pyright: ignore[reportFunctionMemberAccess]  (the general path)
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(4, 6, generator=g), torch.randint(0, 3, (4,), generator=g)
    args = (torchlax.from_torch(x), torchlax.from_torch(y))
    before = [p.detach().cpu().clone() for p in model.parameters()]
    run = _first_call._compile_ahead(compiled, args, {}, _first_call.FIRST)
    assert run.entry.wait_compiled() is None
    assert all(not opt.state[p] and p.grad is None for p in model.parameters())
    for p, b in zip(model.parameters(), before, strict=True):
        assert torch.equal(p.detach().cpu(), b)
    compilations = compiled.compilations  # pyright: ignore[reportFunctionMemberAccess]  (jit returns a Callable)
    assert compilations == 1
    want = reference(x, y)
    torch.testing.assert_close(compiled(*args).cpu(), want, rtol=1e-10, atol=1e-10)
    assert compiled.compilations == compilations  # pyright: ignore[reportFunctionMemberAccess]  (jit returns a Callable)
    for p_ref, p in zip(ref.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(p.detach().cpu(), p_ref.detach(), rtol=1e-10, atol=1e-10)
