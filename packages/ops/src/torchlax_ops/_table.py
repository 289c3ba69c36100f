"""The tables this package fills at import time; ``_plugin`` hands them to the registry.

One lowering is a short stanza in the module of its op family::

    @lowering(aten.add.Tensor, aten.add.Scalar)
    @elementwise(("self", "other"), Promotion.DEFAULT)
    def add(self, other, *, alpha=1):
        return jnp.add(self, other * alpha if alpha != 1 else other)

``lowering`` records the function for the given ``OpOverload``s (or whole packets);
``_plugin.torchlax_register_lowerings`` registers every record through the public registry,
exactly as a third-party plugin would.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

LOWERINGS: list[tuple[Any, Callable]] = []
DECOMPOSITIONS: list[tuple[Any, Callable]] = []
FUNCTIONS: list[tuple[Any, Callable]] = []
# Ops of other libraries (torchvision, transformers) by qualified name ("torchvision::nms"):
# each exists only once its library is imported, which may be after the tables were built, so
# the plugin's ``torchlax_fallback`` hook answers for them on first use. (kind, fn) with kind
# "lowering" (jax.Arrays in and out) or "decomposition" (torch-level).
NAMED: dict[str, tuple[str, Callable]] = {}


def lowering(*ops: Any) -> Callable[[Callable], Callable]:
    """Record ``fn`` as the JAX lowering of each of ``ops`` (jax.Arrays in and out)."""

    def record(fn: Callable) -> Callable:
        for op in ops:
            LOWERINGS.append((op, fn))
        return fn

    return record


def decomposition(*ops: Any) -> Callable[[Callable], Callable]:
    """Record a torch-level implementation of ``ops`` (torchlax Tensors in and out)."""

    def record(fn: Callable) -> Callable:
        for op in ops:
            DECOMPOSITIONS.append((op, fn))
        return fn

    return record


def function(*torch_fns: Any) -> Callable[[Callable], Callable]:
    """Record a torch-level override of ``torch_fns`` (skipped while autograd records)."""

    def record(fn: Callable) -> Callable:
        for torch_fn in torch_fns:
            FUNCTIONS.append((torch_fn, fn))
        return fn

    return record


def named_lowering(*names: str) -> Callable[[Callable], Callable]:
    """Record ``fn`` as the JAX lowering of other libraries' ops, named ``"namespace::op"``."""

    def record(fn: Callable) -> Callable:
        for name in names:
            NAMED[name] = ("lowering", fn)
        return fn

    return record


def named_decomposition(*names: str) -> Callable[[Callable], Callable]:
    """Record a torch-level implementation of other libraries' ops, named ``"namespace::op"``."""

    def record(fn: Callable) -> Callable:
        for name in names:
            NAMED[name] = ("decomposition", fn)
        return fn

    return record
