"""torchlax.jit donates a training step's state to XLA: what the user took from that state
(``t.jax()``, a ``clone()``, ``copy.deepcopy``, ``.to(copy=True)``) stays valid and keeps its
values, and a training loop's later steps donate the state as it is (no copy)."""

import copy

import torch
import torchlax
from torchlax_core.internal import is_exclusive


def _setup():
    torch.manual_seed(0)
    with torchlax.enable():
        lin = torch.nn.Linear(3, 2).to("jax")
    opt = torch.optim.AdamW(lin.parameters(), lr=0.1)

    def step(x):
        opt.zero_grad()
        lin(x).square().sum().backward()
        opt.step()
        return lin.weight.sum()

    return lin, opt, torchlax.jit(step), torchlax.from_torch(torch.randn(4, 3))


def test_what_the_user_took_from_the_state_survives_later_steps():
    lin, opt, step, x = _setup()
    step(x)
    step(x)
    weight = lin.weight
    taken = {"jax()": lambda: weight.jax()}
    with torchlax.enable():
        held = {
            "clone": weight.clone(),
            "detach().clone()": weight.detach().clone(),
            "deepcopy": copy.deepcopy(weight.detach()),
            "to(copy=True)": weight.to(torch.float32, copy=True),
            "exp_avg clone": opt.state[weight]["exp_avg"].clone(),
        }
    arrays = {name: take() for name, take in taken.items()}
    values = {name: t.cpu().clone() for name, t in held.items()}
    values.update({name: torch.from_numpy(a.__array__().copy()) for name, a in arrays.items()})
    for _ in range(2):
        step(x)
    for name, a in arrays.items():
        assert not a.is_deleted(), name
        torch.testing.assert_close(torch.from_numpy(a.__array__().copy()), values[name], msg=name)
    for name, t in held.items():
        torch.testing.assert_close(t.cpu(), values[name], rtol=0, atol=0, msg=name)
    assert not torch.equal(lin.weight.cpu(), values["clone"])  # the steps did train


def test_later_steps_donate_the_state_as_it_is():
    lin, opt, step, x = _setup()
    for _ in range(3):
        step(x)
    state = [*lin.parameters(), *(v for s in opt.state.values() for v in s.values())]
    assert all(is_exclusive(t) for t in state if isinstance(t, torchlax.Tensor))
    lin.weight.jax()  # handed out: the next step donates a copy, then owns its result again
    assert not is_exclusive(lin.weight)
    step(x)
    assert is_exclusive(lin.weight)


def test_two_parameters_holding_one_array_each_train():
    # q is made from p's very array: the step donates that array once (a copy at the other
    # position), and both train as eagerly.
    def make():
        with torchlax.enable():
            p = torch.nn.Parameter(torch.ones(3, device="jax"))
        q = torch.nn.Parameter(torchlax.Tensor(p.detach().jax()))
        opt = torch.optim.SGD([p, q], lr=0.1)

        def step(x):
            opt.zero_grad()
            ((p * x).sum() + (q * q).sum()).backward()
            opt.step()
            return p.sum() + q.sum()

        return p, q, step

    with torchlax.enable():
        x = torch.arange(3.0, device="jax")
    p, q, step = make()
    eager = [step(x).detach().cpu() for _ in range(3)]
    p_jit, q_jit, step = make()
    assert p_jit.detach().jax() is q_jit.detach().jax()
    step = torchlax.jit(step)
    got = [step(x).cpu() for _ in range(3)]
    torch.testing.assert_close(got, eager)
    torch.testing.assert_close(p_jit.detach().cpu(), p.detach().cpu())
    torch.testing.assert_close(q_jit.detach().cpu(), q.detach().cpu())
