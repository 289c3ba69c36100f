"""The guard of a jitted step's state (jit/_state ``_Snapshot``, checked by ``_Layout.holds``):
each kind of read the state walk records sees its change, and what each step replaces (an
optimizer state tensor, a ``.grad``) does not make the next call walk again. Nothing here
compiles: the layout is found and checked directly."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
import torchlax
from torch import nn
from torchlax_interop.jit._discover import find_state

_GLOBAL_MODEL: nn.Module | None = None


@dataclasses.dataclass(slots=True)
class _Holder:
    model: nn.Module
    extra: object = None


def _objects():
    with torchlax.enable():
        model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2)).to("jax")
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model(torch.ones(2, 3, device="jax")).sum().backward()
        opt.step()  # (momentum buffers: tensor state entries)
    opt.state[_first(model)]["count"] = 1  # (a state entry that is no tensor)
    return model, opt


def _first(model: nn.Module) -> torch.Tensor:
    return next(model.parameters())  # (the first Linear's weight)


def _found(step, *args):
    layout = find_state(step, None, list(args))
    assert layout.holds(list(args))
    return layout


def _with_everything():
    global _GLOBAL_MODEL
    model, opt = _objects()
    _GLOBAL_MODEL = model
    holder = _Holder(model)
    models = [model]
    config = {"opt": opt}

    def step(x, scale=1.0, *, shift=0.0):
        # (a cell, a global, a slot, a list, a dict, defaults)
        assert _GLOBAL_MODEL is not None
        return holder.model(x) + models[0](x) + config["opt"].param_groups[0]["lr"]

    return step, model, opt, holder, models, config


def _new_model():
    with torchlax.enable():
        return nn.Linear(3, 2).to("jax")


CHANGES = {
    "momentum-replaced": lambda s, m, o, h, ms, c: o.param_groups[0].update(momentum=0.5),
    "group-key-added": lambda s, m, o, h, ms, c: o.param_groups[0].update(new=1),
    "group-parameter-dropped": lambda s, m, o, h, ms, c: o.param_groups[0]["params"].pop(),
    "state-value-replaced": lambda s, m, o, h, ms, c: o.state[m[0].weight].update(count=2),
    "state-tensor-became-a-number": lambda s, m, o, h, ms, c: o.state[m[0].weight].update(
        momentum_buffer=0.0
    ),
    "state-entry-dropped": lambda s, m, o, h, ms, c: o.state.pop(m[2].bias),
    "slot-rebound": lambda s, m, o, h, ms, c: setattr(h, "model", _new_model()),
    "list-item-replaced": lambda s, m, o, h, ms, c: ms.__setitem__(0, _new_model()),
    "dict-value-replaced": lambda s, m, o, h, ms, c: c.__setitem__(
        "opt", torch.optim.SGD(m.parameters(), lr=0.1)
    ),
    "global-rebound": lambda s, m, o, h, ms, c: globals().__setitem__(
        "_GLOBAL_MODEL", _new_model()
    ),
    "keyword-defaults-replaced-beside-defaults": lambda s, m, o, h, ms, c: setattr(
        s, "__kwdefaults__", {"shift": 1.0}
    ),
    "submodule-replaced": lambda s, m, o, h, ms, c: m.__setitem__(1, nn.Tanh()),
    "training-flag": lambda s, m, o, h, ms, c: m.eval(),
    "requires-grad": lambda s, m, o, h, ms, c: m[0].bias.requires_grad_(False),
    "forward-hook": lambda s, m, o, h, ms, c: m[2].register_forward_hook(lambda *a: None),
}


@pytest.mark.parametrize("name", list(CHANGES))
def test_each_kind_of_read_sees_its_change(name):
    objects = _with_everything()
    layout = _found(objects[0], torch.ones(1))
    CHANGES[name](*objects)
    assert not layout.holds([torch.ones(1)])


def test_what_a_step_replaces_keeps_the_layout():
    step, model, opt, *_ = _with_everything()
    layout = _found(step)
    with torchlax.enable():
        entries = opt.state[_first(model)]
        entries["momentum_buffer"] = entries["momentum_buffer"] * 2  # (a new tensor)
        model[2].weight.grad = torch.zeros(2, 3, device="jax")
        opt.param_groups[0]["lr"] = 0.01  # (a learning rate is an input, not structure)
    assert layout.holds([])
    layout.assemble()
    assert layout.holds([])


def test_a_function_given_defaults_later_is_walked_again():
    model, _ = _objects()

    def step(x, m=None):
        return model(x) if m is None else m(x)

    layout = _found(step)
    step.__defaults__ = (_new_model(),)
    assert not layout.holds([])


def test_a_partial_and_a_bound_method_read_their_objects():
    model, _ = _objects()
    holder = _Holder(model)
    bound = _Holder.__repr__.__get__(holder)
    layout = _found(functools.partial(lambda h, x: h.model(x), holder))
    bound_layout = _found(bound)
    holder.model = _new_model()
    assert not layout.holds([]) and not bound_layout.holds([])
