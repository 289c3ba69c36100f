"""A training step under ``torch.compile(backend="torchlax")`` whose XLA program fails.

Issue 37, item 3: a step that allocated more than the machine has returned normally; every
later read of a parameter raised (``JaxRuntimeError``) and the state before the call was gone
(XLA reports a failed run when a result is read, and the backend had written the failed
results back). Now it raises ``ProgramOutOfMemoryError`` (a ``TorchlaxError`` and a
``torch.OutOfMemoryError``) naming the program and the allocation, and the parameters,
``.grad``s and optimizer state are as they were; the next call works.

The allocation is a sort over 2**46 float32 elements (256 TiB, the input repeated: no factory,
which the eager op cache could run for real while the graph is traced): above any machine's RAM and
above a 47-bit address space, so the allocation is refused at once even where Linux
overcommits memory, and no page is ever touched.
"""

import pytest
import torch
import torchlax
import torchlax_core._launch_check as launch_check
from torch import nn

HUGE = 2**46


def _setup():
    torch.manual_seed(0)
    model = nn.Linear(4, 2).to("jax")
    opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(0.1))
    huge = [False]

    def step(x):
        opt.zero_grad()
        loss = model(x).square().mean()
        if huge[0]:  # a temporary of 256 TiB, multiplied by 0: same loss
            loss = loss + x.reshape(-1).repeat(HUGE // x.numel()).sort().values[-1] * 0
        loss.backward()
        opt.step()
        return loss.detach()

    return model, opt, huge, torch.compile(step, backend="torchlax")


def _state(model, opt) -> list[torch.Tensor]:
    out = []
    for p in model.parameters():
        out.append(p.detach().cpu().clone())
        out.append(p.grad.detach().cpu().clone() if p.grad is not None else torch.tensor(0.0))
        out += [v.detach().cpu().clone() for v in opt.state[p].values()]
    return out


def _assert_equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)


@pytest.mark.parametrize("at", ["before_launch", "while_running"])
def test_a_step_that_runs_out_of_memory_raises_and_keeps_the_state(monkeypatch, at):
    if at == "while_running":
        # XLA's estimate is not checked against the machine: the run itself fails, and XLA
        # reports it only when a result is read.
        monkeypatch.setattr(launch_check, "_host_memory", lambda: 2**62)
    with torchlax.enable():
        model, opt, huge, step = _setup()
        x = torch.linspace(-1, 1, 16).reshape(4, 4).to("jax")
        for _ in range(2):
            step(x)
        before = _state(model, opt)
        huge[0] = True
        with pytest.raises(torchlax.ProgramOutOfMemoryError) as info:
            step(x)
        assert isinstance(info.value, torchlax.TorchlaxError)
        assert isinstance(info.value, torch.OutOfMemoryError)
        message = str(info.value)
        assert message.startswith("torch.compile graph "), message
        assert info.value.program and info.value.program in message
        assert info.value.requested is not None and info.value.requested >= HUGE * 4
        assert "TiB" in message
        # zero_grad() ran before the failed program, as it would eagerly: .grads are None.
        assert all(p.grad is None for p in model.parameters())
        _assert_equal(_state(model, opt), list(_with_grads_cleared(before, model, opt)))
        huge[0] = False
        loss = step(x)
        assert torch.isfinite(loss.cpu())
        assert not torch.equal(_state(model, opt)[0], before[0])  # it trained


def _with_grads_cleared(state, model, opt):
    """``state`` (``_state``'s list) with each ``.grad`` as ``zero_grad()`` leaves it (None)."""
    i = 0
    for p in model.parameters():
        yield state[i]
        yield torch.tensor(0.0)
        i += 2
        for _ in opt.state[p]:
            yield state[i]
            i += 1
