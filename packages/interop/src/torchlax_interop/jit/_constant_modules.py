"""A traced step that trains a module its state walk did not find raises, naming the module.

Such a module's parameters are constants of the program: ``loss.backward()`` inside the trace
gives them ``.grad``s that no call returns, and an update of them (by hand, or an optimizer
the walk found through another module) would be baked into the program instead of written
back. While a step is traced, the trace watch (``_watch``) hands each module called
to ``ConstantModules.called``, which notes the parameters that require grad and are no state;
after the step ran, a module whose parameter's ``.grad`` changed (or whose parameter a refused
``backward()`` would have given one) is refused with the path the function reaches it by.
"""

from __future__ import annotations

from collections.abc import Collection

import torch
from torchlax_core import JitError

from ._discover import MAX_STATE_DEPTH
from ._paths import path_to


class ConstantModules:
    """The modules a trace called whose parameters are no state: ``called(module)`` for each
    module's first call, then ``error(...)`` after the step ran."""

    def __init__(self, state_parameters: set[int]):
        self._known = state_parameters  # ids of the state's parameters
        self._noted: set[int] = set()  # ids of the parameters noted (shared ones once)
        self._watched: list = []  # (module, parameter, its .grad before the step)

    def called(self, module: torch.nn.Module) -> None:
        for p in module.parameters():
            if p.requires_grad and id(p) not in self._known and id(p) not in self._noted:
                self._noted.add(id(p))
                self._watched.append((module, p, p.grad))

    def error(
        self, owner: str, target, args: tuple, kwargs: dict, refused: Collection[int] = ()
    ) -> JitError | None:
        """The error to raise if the step gave a watched parameter a new ``.grad`` (read
        before the constants' watch puts the old ``.grad``s back), or a refused ``backward()``
        would have (``refused``: the ids of the leaves it would have given one), else None."""
        for module, p, grad in self._watched:
            if p.grad is not grad or id(p) in refused:
                path = path_to(module, target, args, kwargs)
                where = (
                    "called inside the step (the function does not reach it within the search)"
                    if path is None
                    else f"at {path}"
                )
                return JitError(
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
