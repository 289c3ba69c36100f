"""Faults inside a warm training step under ``torch.compile(backend="torchlax")``.

Issue 37, items 2 and 5 (the backend's side). An exception or a ``KeyboardInterrupt`` raised
at any stage of a warm call of the compiled step (gathering the inputs, copying arrays to
donate, after the launch, while the outputs are made, while the state is written back, in
either program) leaves each parameter, ``.grad`` and optimizer state tensor with its value
from before the call or from after it (a ``.grad`` may be None: ``zero_grad()`` ran), readable,
and the next call works. A thread reading the model while another trains it sees values,
never an error.
"""

import threading

import pytest
import torch
import torchlax
import torchlax_core._call_plan as call_plan
import torchlax_dynamo._program as program
from torch import nn

# The functions a warm call goes through, in order (the backend's, and the failure check of
# the core's call plan, which runs the launch and write-back); the fault is raised on entry.
STAGES = (
    (program, "peek_arrays"),
    (program, "_copy_shared"),
    (call_plan, "failure_of"),
    (program, "wrap_results_like"),
    (program, "output_tensors"),
    (program, "write_back_all"),
)


class Fault(Exception):
    pass


def _setup():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)).to("jax")
    opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(0.05))

    def step(x):
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        return loss

    return model, opt, torch.compile(step, backend="torchlax")


def _tensors(model, opt) -> list[torch.Tensor | None]:
    out: list[torch.Tensor | None] = []
    for p in model.parameters():
        out += [p, p.grad]
        out += [v for v in opt.state[p].values() if isinstance(v, torch.Tensor)]
    return out


def _values(model, opt) -> list[torch.Tensor | None]:
    return [None if t is None else t.detach().cpu().clone() for t in _tensors(model, opt)]


def _restore(model, opt, values) -> None:
    with torch.no_grad():
        for t, v in zip(_tensors(model, opt), values, strict=True):
            assert t is not None and v is not None
            t.copy_(v.to("jax"))


class _Injector:
    """Counts the calls of the STAGES functions; raises ``fault`` on the ``at``-th."""

    def __init__(self, monkeypatch):
        self.calls = 0
        self.at = -1
        self.fault: BaseException | None = None
        for module, name in STAGES:
            real = getattr(module, name)
            monkeypatch.setattr(module, name, self._wrap(real))

    def _wrap(self, real):
        def fn(*args, **kwargs):
            self.calls += 1
            if self.calls == self.at and self.fault is not None:
                raise self.fault
            return real(*args, **kwargs)

        return fn


def _same(a, b) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))


@pytest.mark.parametrize("fault", [Fault("injected"), KeyboardInterrupt()], ids=type)
def test_a_fault_at_each_stage_leaves_the_state_before_or_after(monkeypatch, fault):
    injector = _Injector(monkeypatch)
    with torchlax.enable():
        model, opt, step = _setup()
        x = torch.linspace(-1, 1, 12).reshape(3, 4).to("jax")
        for _ in range(3):
            step(x)
        injector.calls = 0
        step(x)
        stages = injector.calls  # the instrumented calls of one warm step
        assert stages >= 4
        for at in range(1, stages + 1):
            before = _values(model, opt)
            step(x)
            after = _values(model, opt)
            _restore(model, opt, before)
            injector.calls, injector.at, injector.fault = 0, at, fault
            with pytest.raises(type(fault)):
                step(x)
            injector.fault = None
            now = _values(model, opt)  # every tensor readable
            grads = {id(p.grad) for p in model.parameters()}
            for i, (t, v, b, a) in enumerate(
                zip(_tensors(model, opt), now, before, after, strict=True)
            ):
                # A .grad may also be None: the step's zero_grad() ran before the fault.
                ok = _same(v, b) or _same(v, a) or (t is None and id(t) in grads | {id(None)})
                assert ok, (at, i, v, b, a)
            step(x)  # the next call works
            assert all(v is None or torch.isfinite(v).all() for v in _values(model, opt))


def test_a_thread_reading_the_model_while_another_trains_it_sees_values():
    # Before: a reader that took a parameter's array just before the optimizer program was
    # launched (which donates it) failed with "Array has been deleted" (core _state_lock).
    with torchlax.enable():
        model, opt, step = _setup()
        x = torch.linspace(-1, 1, 12).reshape(3, 4).to("jax")
        step(x)
        errors: list[BaseException] = []
        done = threading.Event()

        def read():
            try:
                while not done.is_set():
                    for p in model.parameters():
                        assert torch.isfinite(p.detach().cpu()).all()
                        p.detach().sum().cpu()
            except BaseException as exc:  # reported by the test below
                errors.append(exc)

        readers = [threading.Thread(target=read) for _ in range(2)]
        for r in readers:
            r.start()
        try:
            for _ in range(300):
                step(x)
                if errors:
                    break
        finally:
            done.set()
            for r in readers:
                r.join()
        assert not errors, errors[0]
