"""jit: state reached through a step's default arguments (``def step(model=model, opt=opt)``,
the idiom that binds loop variables) trains as eagerly, and rebinding the defaults between
calls is followed."""

import copy

import torch
import torch.nn.functional as F
import torchlax


def _parts():
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 2))
    with torchlax.enable():
        model = copy.deepcopy(ref).to("jax")
    return ref, model


def _make_step(model, opt, x, y):
    def step(model=model, opt=opt, x=x, y=y):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def test_state_in_default_arguments_trains_as_eagerly(float64_default):
    ref, model = _parts()
    x, y = torch.randn(4, 5), torch.randn(4, 2)
    eager = _make_step(ref, torch.optim.AdamW(ref.parameters(), lr=0.05), x, y)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    compiled = torchlax.jit(_make_step(model, opt, x.to("jax"), y.to("jax")))
    for _ in range(3):
        torch.testing.assert_close(compiled().cpu(), eager(), rtol=1e-10, atol=1e-10)
    for want, got in zip(ref.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-10, atol=1e-10)
    assert compiled.compilations == 2  # the first call's program and the steady one


def test_defaults_rebound_between_calls_are_followed(float64_default):
    first, model = _parts()
    _, other = _parts()
    x, y = torch.randn(4, 5).to("jax"), torch.randn(4, 2).to("jax")
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, other)]
    step = _make_step(model, opts[0], x, y)
    compiled = torchlax.jit(step)
    compiled()
    before = [p.cpu().clone() for p in other.parameters()]
    step.__defaults__ = (other, opts[1], x, y)
    compiled()
    after = [p.cpu() for p in other.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert not any(p.grad is None for p in other.parameters())
