"""A traced step that trains a module its state walk did not find raises, naming the module.

Such a module's parameters are constants of the program: ``loss.backward()`` inside the trace
gives them ``.grad``s that no call returns, and an update of them (by hand, or an optimizer
the walk found through another module) would be baked into the program instead of written
back. While a step is traced, a global module forward pre-hook (this thread only) records the
modules called whose parameters require grad and are no state; after the step ran, one whose
parameter's ``.grad`` changed is refused with the path the function reaches it by.
"""

from __future__ import annotations

import functools
import threading
import types

import torch
from torch.nn.modules.module import register_module_forward_pre_hook

from ._jit_holders import attributes, enterable, slot_values
from ._jit_state import MAX_STATE_DEPTH

# How far the search for a module's path goes (only when the error is raised).
_SEARCH_DEPTH = 8
_SEARCH_NODES = 20_000


class ConstantModules:
    """The watch over one trace: ``stop()`` after the step ran, then ``refuse(...)``."""

    def __init__(self, state_parameters: set):
        self._known = state_parameters  # ids of the state's parameters
        self._thread = threading.get_ident()
        self._seen: set = set()
        self._watched: list = []  # (module, parameter, its .grad before the step)
        self._handle = register_module_forward_pre_hook(self._called)

    def _called(self, module, _args) -> None:
        if threading.get_ident() != self._thread or id(module) in self._seen:
            return
        self._seen.add(id(module))
        for p in module.parameters():
            if p.requires_grad and id(p) not in self._known and id(p) not in self._seen:
                self._seen.add(id(p))
                self._watched.append((module, p, p.grad))

    def stop(self) -> None:
        self._handle.remove()

    def refuse(self, owner: str, target, args: tuple, kwargs: dict) -> None:
        """Raise if the step gave a watched parameter a new ``.grad``."""
        for module, p, grad in self._watched:
            if p.grad is not grad:
                where = _path_to(module, target, args, kwargs)
                raise RuntimeError(
                    f"{owner}: the step computes gradients for the parameters of the "
                    f"{type(module).__name__} {where}, which is not part of the compiled "
                    "step's state: its parameters would be constants of the program, and it "
                    "would not train. torchlax.jit finds modules and optimizers the function "
                    "closes over, names as globals or receives as arguments, and those these "
                    "hold in lists, tuples, dicts and objects' attributes, up to "
                    f"{MAX_STATE_DEPTH} levels deep. Close over the module (or its optimizer) directly, or pass it as "
                    "an argument of the jitted function."
                )


def _path_to(module, target, args: tuple, kwargs: dict) -> str:
    """How the function reaches ``module`` ('at self.cfg.deep.model'), found by a bounded
    breadth-first search, or where it was called if none is found."""
    roots: list = []
    fn = target
    if isinstance(fn, functools.partial):
        roots += [(f"partial argument {i}", a) for i, a in enumerate(fn.args)]
        fn = fn.func
    if isinstance(fn, types.MethodType):
        roots.append(("self", fn.__self__))
        fn = fn.__func__
    if isinstance(fn, types.FunctionType):
        cells = zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=False)
        for name, cell in cells:
            try:
                roots.append((name, cell.cell_contents))
            except ValueError:
                pass
        roots += [(n, fn.__globals__[n]) for n in fn.__code__.co_names if n in fn.__globals__]
    roots += [(f"argument {i}", a) for i, a in enumerate(args)]
    roots += [(f"argument {k!r}", a) for k, a in kwargs.items()]
    seen: set = set()
    level = roots
    for _ in range(_SEARCH_DEPTH):
        following: list = []
        for path, value in level:
            if value is module:
                return f"at {path}"
            if id(value) in seen or len(seen) > _SEARCH_NODES:
                continue
            seen.add(id(value))
            following += _children(path, value)
        level = following
    return "called inside the step (the function does not reach it within the search)"


def _children(path: str, value) -> list:
    if isinstance(value, torch.nn.Module):
        return [(f"{path}.{n}", m) for n, m in value.named_children()]
    if type(value) is list or isinstance(value, tuple):
        return [(f"{path}[{i}]", v) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return [(f"{path}[{k!r}]", v) for k, v in value.items()]
    if not enterable(value):
        return []
    attrs, slots = attributes(value)
    items = [*(attrs or {}).items(), *zip(slots, slot_values(value, slots), strict=True)]
    return [(f"{path}.{n}", v) for n, v in items]
