"""A warm call of ``torchlax.jit(step)`` interrupted anywhere (an exception or a
``KeyboardInterrupt`` at any line of torchlax.jit's code, or a Ctrl-C during the launch and
write-back) leaves the model and optimizer with the values before the call or after it, and
the next call works (#37, item 2).

Two identical setups run in lockstep: ``b`` steps normally and gives the values after each
call; ``a``'s call is interrupted at its n-th executed line of the jit modules, for every n
until a call runs to its end.
"""

import os
import signal
import sys

import pytest
import torch
import torch.nn.functional as F
import torchlax
from torch import nn
from torchlax_interop.jit import _call, _repeated


def _setup():
    torch.manual_seed(0)
    with torchlax.enable():
        model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)).to("jax")
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        sched.step()
        return loss

    return model, opt, sched, torchlax.jit(step)


def _snapshot(model, opt, sched) -> list:
    """Every value the step changes, as CPU tensors and numbers."""
    values: list = []
    for p in model.parameters():
        values.append(p.detach().cpu().clone())
        values.append(None if p.grad is None else p.grad.cpu().clone())
    for p in model.parameters():
        for name, v in sorted(opt.state[p].items()):
            values.append((name, v.cpu().clone() if isinstance(v, torch.Tensor) else v))
    values.extend(g["lr"] for g in opt.param_groups)
    values.append(sched.last_epoch)
    return values


def _same(a: list, b: list) -> bool:
    def eq(x, y):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            return x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
        if isinstance(x, tuple) and isinstance(y, tuple):
            return len(x) == len(y) and all(map(eq, x, y))
        return type(x) is type(y) and x == y

    return len(a) == len(b) and all(map(eq, a, b))


_JIT_MODULES = os.path.join("torchlax_interop", "jit", "")  # torchlax.jit's subpackage


class _Injector:
    """Raises ``exc`` at the ``n``-th line executed in torchlax.jit's modules (once)."""

    def __init__(self, n: int, exc: type[BaseException]):
        self.n = n
        self.exc = exc
        self.count = 0

    def __call__(self, frame, event, arg):
        if _JIT_MODULES not in frame.f_code.co_filename:
            return None
        return self._line

    def _line(self, frame, event, arg):
        if event == "line":
            self.count += 1
            if self.count == self.n:
                raise self.exc("injected")
        return self._line


def _data():
    g = torch.Generator().manual_seed(1)
    with torchlax.enable():
        return torch.randn(4, 6, generator=g).to("jax"), torch.randint(0, 3, (4,), generator=g).to(
            "jax"
        )


@pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError])
@pytest.mark.parametrize("path", ["repeated", "general"])
def test_interrupted_warm_step_keeps_before_or_after(exc, path):
    a, b = _setup(), _setup()
    x, y = _data()
    for _ in range(3):  # warm: the first call creates the state, the next ones compile
        a[3](x, y)
        b[3](x, y)
    assert _same(_snapshot(*a[:3]), _snapshot(*b[:3]))
    n, outcomes = 0, set()
    before = _snapshot(*a[:3])
    while True:
        n += 1
        if path == "general":
            a[3]._repeat = None  # pyright: ignore[reportFunctionMemberAccess]  (the jitted callable's)
            b[3]._repeat = None  # pyright: ignore[reportFunctionMemberAccess]  (the jitted callable's)
        b[3](x, y)
        after = _snapshot(*b[:3])
        injector = _Injector(n, exc)
        sys.settrace(injector)
        try:
            a[3](x, y)
            finished = True
        except exc as e:
            assert str(e) == "injected"
            finished = False
        finally:
            sys.settrace(None)
        now = _snapshot(*a[:3])
        if _same(now, after):
            outcomes.add("after")
        else:
            assert _same(now, before), f"interrupted at line {n}: neither before nor after"
            outcomes.add("before")
            a[3](x, y)  # the next call works, and catches up with b
            assert _same(_snapshot(*a[:3]), after)
        if finished:
            break
        before = after  # a's state now (checked above): the next call's before-values
    assert n > 10  # the sweep went through the call
    assert outcomes == {"before", "after"}


def test_ctrl_c_during_the_write_back_is_held_until_it_is_done(monkeypatch):
    a, b = _setup(), _setup()
    x, y = _data()
    for _ in range(3):
        a[3](x, y)
        b[3](x, y)
    b[3](x, y)
    after = _snapshot(*b[:3])
    write_state = _call._write_state

    def interrupted(*args):
        signal.raise_signal(signal.SIGINT)  # Ctrl-C, as the write-back starts
        return write_state(*args)

    for caller in (_call, _repeated):  # the general path's and the repeated step's write-back
        monkeypatch.setattr(caller, "_write_state", interrupted)
    # Python's own handler (a pytest-xdist worker ignores SIGINT)
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            a[3](x, y)
    finally:
        signal.signal(signal.SIGINT, handler)
    monkeypatch.undo()
    assert _same(_snapshot(*a[:3]), after)
    a[3](x, y)
    b[3](x, y)
    assert _same(_snapshot(*a[:3]), _snapshot(*b[:3]))
