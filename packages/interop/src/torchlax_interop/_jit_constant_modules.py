"""A traced step that trains a module its state walk did not find raises, naming the module.

Such a module's parameters are constants of the program: ``loss.backward()`` inside the trace
gives them ``.grad``s that no call returns, and an update of them (by hand, or an optimizer
the walk found through another module) would be baked into the program instead of written
back. While a step is traced, a global module forward pre-hook (this thread only) records the
modules called whose parameters require grad and are no state; after the step ran, one whose
parameter's ``.grad`` changed is refused with the path the function reaches it by.
"""

from __future__ import annotations

import threading

from torch.nn.modules.module import register_module_forward_pre_hook

from ._jit_paths import path_to
from ._jit_state import MAX_STATE_DEPTH


class ConstantModules:
    """The watch over one trace: ``stop()`` after the step ran, then ``error(...)``."""

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

    def error(self, owner: str, target, args: tuple, kwargs: dict) -> RuntimeError | None:
        """The error to raise if the step gave a watched parameter a new ``.grad`` (read
        before the constants' watch puts the old ``.grad``s back), else None."""
        for module, p, grad in self._watched:
            if p.grad is not grad:
                path = path_to(module, target, args, kwargs)
                where = (
                    "called inside the step (the function does not reach it within the search)"
                    if path is None
                    else f"at {path}"
                )
                return RuntimeError(
                    f"{owner}: the step computes gradients for the parameters of the "
                    f"{type(module).__name__} {where}, which is not part of the compiled "
                    "step's state: its parameters would be constants of the program, and it "
                    "would not train. torchlax.jit finds modules and optimizers the function "
                    "closes over, names as globals or receives as arguments, and those these "
                    "hold in lists, tuples, dicts and objects' attributes, up to "
                    f"{MAX_STATE_DEPTH} levels deep. Close over the module (or its optimizer) directly, or pass it as "
                    "an argument of the jitted function."
                )
        return None
