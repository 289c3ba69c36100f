"""Plain CPU tensors a traced step changes: what the trace watch notes of each, and how it is
put back.

A plain ``torch.Tensor`` on the CPU that a step reaches (``counter = torch.zeros(())``, a
global or a closure, a module's plain attribute) is no state of the compiled program, and the
constant watch (``_constants``) sees torchlax Tensors only. A write into one (``counter.add_(1)``,
``hist[i] = 1``, ``t.data.add_(1)``, ``t.data = other``) or a ``.grad`` given to one (by hand,
or by a ``backward()`` of the step) happens once, on the host, while the step is traced: in
eager PyTorch the counter counts, under ``torchlax.jit`` it would stop at its trace-time value.
The trace watch (``_watch``) notes each such tensor at first sight (``SeenCpuTensor``:
its version counter, a copy of its value, its storage and its ``.grad``); ``changed`` lists
those that changed and ``restore`` puts back what they held, so the caller can refuse the
program naming them. ``leaves_given_grads`` finds, before a ``backward()`` runs, the CPU
leaves it would give a ``.grad``: such a backward is refused before it runs (when the loss is
a torchlax Tensor it could not even run: the gradient would have to cross from the traced
program to the host).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable

import jax.core
import torch
from torchlax_core import Tensor
from torchlax_core.internal import array_of


class SeenCpuTensor:
    """A CPU tensor as first seen: the tensor (weakly), its version counter, an alias of its
    data (the storage and layout ``t.data = other`` would replace), a copy of its value, its
    ``.grad`` and that ``.grad``'s version counter and value (a ``.grad`` can be written in
    place: ``backward()`` accumulates into it)."""

    __slots__ = ("ref", "origin", "version", "alias", "value", "grad", "grad_version", "grad_value")

    def __init__(self, t: torch.Tensor, origin: Callable | None = None):
        # (``t.data`` is a temporary: held here, so that a write through it is still seen)
        self.ref: Callable = weakref.ref(t) if origin is None else lambda: t
        self.origin = origin  # for ``t.data``: t (the tensor to name)
        self.version = _version(t)
        with torch.no_grad():
            self.alias = t.detach()
            self.value = self.alias.clone()
            self.grad = t.grad if t.is_leaf else None
            self.grad_version = -1 if self.grad is None else _version(self.grad)
            self.grad_value = None if self.grad is None else self.grad.clone()

    def grad_changed(self, t: torch.Tensor) -> bool:
        grad = t.grad if t.is_leaf else None
        return grad is not self.grad or (grad is not None and _version(grad) != self.grad_version)


class ChangedCpuTensor:
    """A CPU tensor the traced step changed: ``tensor``, and whether its data (``written``) or
    its ``.grad`` (``grad_given``: given, replaced or written in place) changed;
    ``by_backward``: a ``backward()`` or ``torch.autograd.grad()`` of the step (``call``) was
    refused before it ran, so nothing changed: it would give the tensor a ``.grad``, or
    (``crossing``) carry a gradient from the traced program to it; ``made``: the trace made
    the tensor itself (no path of the function's reaches it)."""

    __slots__ = (
        "tensor",
        "written",
        "grad_given",
        "by_backward",
        "call",
        "crossing",
        "made",
        "first_seen",
    )

    def __init__(
        self,
        tensor: torch.Tensor,
        written: bool,
        grad_given: bool,
        seen: SeenCpuTensor | None,
        by_backward: bool = False,
        call: str = "backward()",
        crossing: bool = False,
        made: bool = False,
    ):
        self.tensor = tensor
        self.written = written
        self.grad_given = grad_given
        self.by_backward = by_backward
        self.call = call
        self.crossing = crossing
        self.made = made
        self.first_seen = seen  # what it held when first seen (None: nothing to put back)


def changed(seen: Iterable[SeenCpuTensor | None]) -> list[ChangedCpuTensor]:
    """Those of the ``seen`` CPU tensors still alive whose data or ``.grad`` changed since."""
    found = []
    for s in seen:
        if s is None:
            continue
        t = s.ref()
        if t is None:
            continue
        written = _version(t) != s.version or not _same_data(t, s.alias)
        grad_given = s.grad_changed(t)
        if written or grad_given:
            origin = s.origin() if s.origin is not None else None
            found.append(ChangedCpuTensor(origin or t, written, grad_given, s))
    return found


def restore(changed: list[ChangedCpuTensor]) -> None:
    """Put back the data and ``.grad`` each of ``changed`` held when first seen."""
    with torch.no_grad():
        for c in changed:
            seen = c.first_seen
            if seen is None:
                continue
            t = seen.ref() if seen.origin is not None else c.tensor  # (the alias written)
            if t is None:
                continue
            if c.written:
                if not _same_data(t, seen.alias):  # ``t.data = other``
                    t.data = seen.alias
                seen.alias.copy_(seen.value)
            if c.grad_given:
                t.grad = seen.grad
                grad, value = seen.grad, seen.grad_value
                if grad is not None and value is not None and _version(grad) != seen.grad_version:
                    grad.copy_(value)


def leaves_given_grads(roots, inputs, made: Callable[[torch.Tensor], bool]) -> list[torch.Tensor]:
    """The plain CPU leaves a ``backward()`` of ``roots`` (limited to ``inputs`` if given) would
    give a ``.grad``, but those ``made`` by the trace itself; found by walking the roots'
    autograd graph before it runs."""
    leaves, _ = _reached(roots)
    if inputs is not None:
        wanted = {id(t) for t in _tensors(inputs)}
        leaves = {k: t for k, t in leaves.items() if k in wanted}
    return [t for t in leaves.values() if is_plain_cpu(t) and not made(t)]


def host_targets_of_traced_roots(roots, inputs) -> list[torch.Tensor]:
    """The plain CPU tensors toward which a ``backward()`` or ``torch.autograd.grad()`` of
    ``roots`` would carry a gradient from a traced torchlax Tensor among them: ``inputs``
    where given (leaves or not), else every leaf reached. Such a gradient would have to leave
    the traced program for the host while the step is traced, which it cannot (the backward
    of the device copy fails with an unnamed "Unable to cast")."""
    traced = [r for r in _tensors(roots) if isinstance(r, Tensor) and _is_traced(r)]
    if not traced:
        return []
    leaves, nodes = _reached(traced)
    if inputs is None:
        targets = list(leaves.values())
    else:
        targets = [
            t
            for t in _tensors(inputs)
            if id(t) in leaves or (t.grad_fn is not None and t.grad_fn in nodes)
        ]
    return [t for t in targets if is_plain_cpu(t)]


def _reached(roots) -> tuple[dict[int, torch.Tensor], set]:
    """The leaves (by id) and the autograd nodes a backward of ``roots`` reaches."""
    reached: dict[int, torch.Tensor] = {}
    stack = []
    for r in _tensors(roots):
        if r.grad_fn is not None:
            stack.append(r.grad_fn)
        elif r.requires_grad:  # ``w.backward(...)`` of a leaf itself
            reached[id(r)] = r
    visited: set = set()
    while stack:
        node = stack.pop()
        if node in visited:
            continue
        visited.add(node)
        leaf = getattr(node, "variable", None)  # (an AccumulateGrad node: a leaf's)
        if isinstance(leaf, torch.Tensor):
            reached[id(leaf)] = leaf
        stack.extend(n for n, _ in node.next_functions if n is not None)
    return reached, visited


def _tensors(values) -> list[torch.Tensor]:
    """The tensors of a backward's roots or inputs: a tensor, a sequence, or (for
    ``torch.autograd.grad``'s inputs) a dict of them; a GradientEdge is not followed."""
    if isinstance(values, torch.Tensor):
        return [values]
    if isinstance(values, dict):
        values = values.values()
    return [t for t in values if isinstance(t, torch.Tensor)]


def _is_traced(t: Tensor) -> bool:
    return isinstance(array_of(t), jax.core.Tracer)


def is_plain_cpu(t) -> bool:
    """Whether ``t`` is a plain CPU ``torch.Tensor`` (not a torchlax Tensor)."""
    return isinstance(t, torch.Tensor) and not isinstance(t, Tensor) and t.device.type == "cpu"


def _version(t: torch.Tensor) -> int:
    try:
        return t._version
    except RuntimeError:  # an inference tensor: it cannot be written outside inference mode
        return -1


def _same_data(t: torch.Tensor, alias: torch.Tensor) -> bool:
    return bool(
        t.untyped_storage().data_ptr() == alias.untyped_storage().data_ptr()
        and t.shape == alias.shape
        and t.stride() == alias.stride()
        and t.storage_offset() == alias.storage_offset()
    )
