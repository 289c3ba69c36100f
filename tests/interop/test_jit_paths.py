"""The paths torchlax.jit's errors name things by (jit/_walk ``path_to``, ``reaches``): the
shortest path by which a function reaches an object, through what it names (closure cells,
globals, default arguments, a partial's arguments, a bound method's object), the call's
arguments, containers, objects' attributes and slots, modules and the functions met. Nothing
here traces: the walk is asked directly."""

from __future__ import annotations

import functools
import types

import torch
from torch import nn
from torchlax_interop.jit._walk import path_to, reaches

_GLOBAL = types.SimpleNamespace(inner={"w": torch.zeros(1)})


class _Slotted:
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


def test_each_kind_of_step_is_named_as_the_function_reaches_it():
    w, buf, held = torch.zeros(2), torch.zeros(3), torch.zeros(4)
    cfg = types.SimpleNamespace(items=[0, {"key": w}], slotted=_Slotted(held))

    def helper():
        return buf

    def fn(x, scale=held):
        return cfg, helper, scale, _GLOBAL

    assert path_to(w, fn, (), {}) == "cfg.items[1]['key']"
    assert path_to(held, fn, (), {}) == "default argument 'scale'"  # (the shortest path)
    assert path_to(held, lambda: cfg, (), {}) == "cfg.slotted.value"
    assert path_to(buf, fn, (), {}) == "helper -> buf"  # through the function it names
    assert path_to(_GLOBAL.inner["w"], fn, (), {}) == "_GLOBAL.inner['w']"
    assert path_to(w, lambda x, opts: x, (None, [w]), {}) == "argument 1[0]"
    assert path_to(w, lambda x, **k: x, (), {"opts": (w,)}) == "argument 'opts'[0]"
    assert path_to(w, functools.partial(lambda a, x: x, w), (), {}) == "partial argument 0"
    assert path_to(torch.zeros(1), fn, (), {}) is None  # not reached


def test_a_module_and_a_bound_method_are_named_from_self():
    model = nn.Sequential(nn.Linear(2, 2))
    model.extra = types.SimpleNamespace(t=torch.zeros(1))
    assert path_to(model[0].weight, model, (), {}) == "self.0.weight"
    assert path_to(model.extra.t, model.forward, (), {}) == "self.extra.t"


def test_reaches_looks_inside_a_returned_object():
    t = torch.zeros(1)
    out = {"loss": torch.ones(()), "parts": [types.SimpleNamespace(t=t)]}
    assert reaches(out, t) and reaches(t, t)
    assert not reaches(out, torch.zeros(1))
