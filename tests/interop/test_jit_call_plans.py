"""``torchlax.jit``'s calls run the core's call plan (``torchlax_core._call_plan``): a step on
the general path and a repeated one run the same ``_StepPlan``, and its launch turns XLA's
refusal of a run into the core's ``ProgramFailedError`` with the state left as it was."""

from __future__ import annotations

import copy

import jax
import pytest
import torch
import torch.nn.functional as F
import torchlax
from torch import nn
from torchlax_core import ProgramFailedError, ProgramOutOfMemoryError
from torchlax_core.internal import CallPlan, array_of


def _setup():
    torch.manual_seed(0)
    with torchlax.enable():
        model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)).to("jax")
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        x, y = torch.randn(4, 6).to("jax"), torch.randint(0, 3, (4,)).to("jax")

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return model, opt, torchlax.jit(step), (x, y)


def _values(model, opt) -> list[torch.Tensor]:
    out = []
    for p in model.parameters():
        out += [p.detach().cpu().clone(), p.grad.cpu().clone()]
        out += [v.cpu().clone() for _, v in sorted(opt.state[p].items())]
    return out


def test_steps_run_one_plan_whose_refused_launch_leaves_the_state_as_it_was():
    model, opt, jstep, (x, y) = _setup()
    for _ in range(3):  # the first call creates the state, the next ones are compiled
        jstep(x, y)
    plan = jstep._last.plan  # pyright: ignore[reportFunctionMemberAccess]  (the jitted callable's)
    assert isinstance(plan, CallPlan)
    jstep._last.plan = None  # pyright: ignore[reportFunctionMemberAccess]  (the general path)
    jstep(x, y)
    assert jstep._last.plan is plan  # pyright: ignore[reportFunctionMemberAccess]  (the same plan)
    assert plan.plain is not None  # a deterministic step launches through JAX's launcher
    launcher, key = plan.plain

    def refused(*args):
        raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 64 bytes")

    for path in ("repeated", "general"):
        before = _values(model, opt)
        plan.plain = (refused, key)
        if path == "general":
            jstep._last.plan = None  # pyright: ignore[reportFunctionMemberAccess]  (the general path)
        with pytest.raises(ProgramOutOfMemoryError, match="ran out of memory"):
            jstep(x, y)
        # Nothing was launched: nothing written, nothing lost (the .grads left in place).
        assert all(map(torch.equal, _values(model, opt), before)), path
        plan.plain = (launcher, key)
        jstep(x, y)  # the next call works
        assert not all(map(torch.equal, _values(model, opt), before)), path


def test_a_repeated_forward_runs_its_plan():
    with torchlax.enable():
        forward = torchlax.jit(nn.Linear(6, 3).to("jax"))
        x = torch.randn(4, 6).to("jax")
    with torch.no_grad():
        want = forward(x)
        assert isinstance(forward._last.plan, CallPlan)  # pyright: ignore[reportFunctionMemberAccess]  (the jitted callable's)
        torch.testing.assert_close(forward(x).cpu(), want.cpu())


def test_every_forward_runs_the_plan_of_its_entry_which_a_repeat_takes(monkeypatch):
    """A forward on the general path, the first call's included, runs the plan of its entry
    (``_ForwardPlan.run_general``); one the next call may repeat is recorded, and the repeat
    runs that very plan (``call``) without the general path."""
    from torchlax_interop.jit import _repeated

    ran = []
    run_general = _repeated._ForwardPlan.run_general

    def counted(self, jitted, run):
        ran.append(self)
        return run_general(self, jitted, run)

    monkeypatch.setattr(_repeated._ForwardPlan, "run_general", counted)
    with torchlax.enable():
        layer = nn.Linear(6, 3).to("jax").requires_grad_(False)
        forward = torchlax.jit(layer)
        x = torch.randn(4, 6).to("jax")
        want = layer(x)
    # Grad mode on, nothing requiring grad: the forward program, not kept for a repeat.
    torch.testing.assert_close(forward(x).cpu(), want.cpu())
    assert len(ran) == 1
    assert forward._last.plan is None  # pyright: ignore[reportFunctionMemberAccess]  (the jitted callable's)
    with torch.no_grad():
        torch.testing.assert_close(forward(x).cpu(), want.cpu())  # another entry: its plan
        assert len(ran) == 2
        assert forward._last.plan is ran[1]  # pyright: ignore[reportFunctionMemberAccess]  (recorded)
        torch.testing.assert_close(forward(x).cpu(), want.cpu())  # the repeat: that plan
    assert len(ran) == 2


def test_a_steps_run_that_fails_while_it_runs_is_waited_for_and_written_nowhere():
    """XLA reports a run's failure when a result is waited for: a step's first runs are waited
    for (the core's ``failure_of``, inside jit's nested results) before the write-back."""
    model, opt, jstep, (x, y) = _setup()
    for _ in range(3):
        jstep(x, y)
    plan = jstep._last.plan  # pyright: ignore[reportFunctionMemberAccess]  (the jitted callable's)
    launcher, key = plan.plain
    ran = []

    def failing(*args):
        results = launcher(*args)
        ran.extend(jax.tree.leaves(results))
        for array in ran:
            array.delete()  # (such an array raises when waited for, as a failed run's do)
        return results

    plan.plain, plan.checked = (failing, key), 0
    with pytest.raises(ProgramFailedError, match="failed while it ran"):
        jstep(x, y)
    held = {id(array_of(p)) for p in model.parameters()}  # pyright: ignore[reportArgumentType]  (torchlax Tensors)
    assert ran and not any(id(a) in held for a in ran)  # no result became a parameter


def test_a_state_array_of_another_dtype_is_another_signature():
    # The state's signature is kept while its arrays' avals are the very ones it was made for
    # (_Jitted._state_signature): a state array of another dtype, its count unchanged, is
    # another entry.
    with torchlax.enable():
        w = torch.ones(3, device="jax")
        x = torch.full((3,), 2.0, device="jax")
    f = torchlax.jit(lambda x, *, k: x * w + k)  # (a keyword call: the general path each time)
    for _ in range(2):
        assert f(x, k=1.0).dtype == torch.float32
    with torchlax.enable():
        w.data = torch.ones(3, dtype=torch.float64, device="jax")
    out = f(x, k=1.0)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out.cpu(), torch.full((3,), 3.0, dtype=torch.float64))
    assert f.compilations == 2


def _counted_repeats(monkeypatch) -> list[bool]:
    """Per call that had a last plan: whether its guard held (``_JitPlan.call``)."""
    from torchlax_interop.jit import _repeated

    taken: list[bool] = []
    original = _repeated._JitPlan.call

    def counted(self, jitted, args):
        out = original(self, jitted, args)
        taken.append(out is not _repeated._MISSED)
        return out

    monkeypatch.setattr(_repeated._JitPlan, "call", counted)
    return taken


def test_one_guard_repeats_a_forward_and_a_step_over_a_contiguous_view_argument(monkeypatch):
    """The repeat's guard takes an argument that is a contiguous view (``rows[2:4]``), as the
    general path would, and leaves a transposed one to the general path (another program), for
    a forward and a training step alike; the values are eager PyTorch's."""
    taken = _counted_repeats(monkeypatch)
    torch.manual_seed(0)
    square, rows = torch.randn(4, 4), torch.randn(8, 4)
    layer = nn.Linear(4, 4)
    with torchlax.enable():
        jlayer = copy.deepcopy(layer).to("jax")
        jsquare, jrows = square.to("jax"), rows.to("jax")
    forward = torchlax.jit(jlayer)
    with torch.no_grad():
        for _ in range(2):
            forward(jrows[:4].contiguous())
        taken.clear()
        torch.testing.assert_close(forward(jrows[4:]).cpu(), layer(rows[4:]))
        torch.testing.assert_close(forward(jsquare.t()).cpu(), layer(square.t()))
    assert taken == [True, False]

    taken.clear()
    opt = torch.optim.AdamW(layer.parameters(), lr=0.01)
    jopt = torch.optim.AdamW(jlayer.parameters(), lr=0.01)

    def step_of(model, optimizer):
        def step(x):
            optimizer.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            optimizer.step()
            return loss

        return step

    eager, jstep = step_of(layer, opt), torchlax.jit(step_of(jlayer, jopt))
    for i in range(5):
        got = jstep(jrows[i : i + 4])  # a contiguous view each call
        torch.testing.assert_close(got.cpu(), eager(rows[i : i + 4]))
    assert taken[-2:] == [True, True]
    taken.clear()
    torch.testing.assert_close(jstep(jsquare.t()).cpu(), eager(square.t()))
    assert taken == [False]
    for p, q in zip(jlayer.parameters(), layer.parameters(), strict=True):
        torch.testing.assert_close(p.cpu(), q.detach())
        torch.testing.assert_close(_grad(p).cpu(), q.grad)


def test_a_repeated_step_gives_new_grads_as_eagerly(monkeypatch):
    """A step whose ``zero_grad()`` discards the ``.grad``s gives each parameter a new
    ``.grad`` on every call, as eager PyTorch does (made by the first one's shape, dtype and
    device: ``_repeated._new_tensors``): one held from an earlier step keeps its values."""
    taken = _counted_repeats(monkeypatch)
    model, opt, jstep, (x, y) = _setup()
    for _ in range(3):
        jstep(x, y)
    held = [_grad(p) for p in model.parameters()]
    values = [g.cpu().clone() for g in held]
    x2 = x * 2
    jstep(x2, y)
    assert taken[-1]  # (repeated)
    for p, old, value in zip(model.parameters(), held, values, strict=True):
        grad = _grad(p)
        assert grad is not old and type(grad) is type(old)
        assert (grad.shape, grad.dtype, grad.device) == (p.shape, p.dtype, p.device)
        assert not grad.requires_grad and grad.grad_fn is None
        torch.testing.assert_close(old.cpu(), value)  # untouched
    # The new .grads are eager's for these parameters and inputs.
    with torchlax.enable():
        params = [p.detach().clone().requires_grad_() for p in model.parameters()]
    model_cpu = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    jstep(x, y)
    assert taken[-1]
    with torch.no_grad():
        for q, p in zip(model_cpu.parameters(), params, strict=True):
            q.copy_(p.cpu())
    F.cross_entropy(model_cpu(x.cpu()), y.cpu()).backward()
    for p, q in zip(model.parameters(), model_cpu.parameters(), strict=True):
        torch.testing.assert_close(_grad(p).cpu(), q.grad)


def _grad(p: torch.Tensor) -> torch.Tensor:
    assert p.grad is not None
    return p.grad
