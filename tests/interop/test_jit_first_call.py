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
    layers = [nn.Linear(6, 8)] + ([nn.BatchNorm1d(8)] if batchnorm else [])
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
