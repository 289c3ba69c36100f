"""Which constants a traced program's code changed: the tensors it reached that are no inputs.

A compiled program's inputs hold tracers while it is traced; a torchlax Tensor the traced code
reaches that still holds a concrete array is a *constant* of the program (a ``cfg.mask`` the
function reaches through an object its caller does not treat as state). Reading one is fine:
its value is baked in. Changing one is not: an in-place write (``buf.add_(1)``, ``w.data -=
...``, ``w.copy_(...)``) or a ``.grad`` that ``backward()`` gives it happens once, while the
program is traced, and leaves a value of the finished trace in the user's tensor (a tracer,
or a value computed at trace time that no later call updates).

A ``ConstantWatch`` records, while the trace watch (``_watch``) is entered around the step (it
registers this as the core's op observer, ``observing_ops``, for the tracing thread), each
torchlax Tensor that an op receives holding a concrete array at first sight (not one the
traced code made itself: a result of an op of the trace), with its storage, array and
``.grad`` then. ``ConstantWatch.changed()`` lists those still alive that the traced code
changed, and ``restore()`` puts back what they held, so the caller can refuse the program
naming them. The cost is
at trace time only (one look at each op's tensor arguments); a program's calls never see it.
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Callable, Iterator
from itertools import repeat
from typing import Any

import jax.core
import torch
from torchlax_core import Tensor
from torchlax_core.internal import rebind, storage_getter, storage_of, view_getter

# A storage (``.array``: its root's current array; ``.exclusive``), typed for what is read here
_storage_of: Callable[[Tensor], Any] = storage_of


class ChangedConstant:
    """A constant the traced code changed: ``tensor`` (put back as it was) and how."""

    __slots__ = ("tensor", "written", "grad_given", "_seen")

    def __init__(self, tensor: Tensor, written: bool, grad_given: bool, seen: _Seen):
        self.tensor = tensor
        self.written = written  # its data (an in-place write, or ``.data =``)
        self.grad_given = grad_given  # its ``.grad`` (replaced, or written in place)
        self._seen = seen  # what it held when first seen


class _Seen:
    """A constant as first seen: the tensor (weakly: a tensor the traced code made and
    dropped is no one's constant), its storage, view and array, and its ``.grad``'s."""

    __slots__ = ("ref", "storage", "view", "array", "layout", "grad", "grad_storage", "grad_array")

    def __init__(self, t: Tensor):
        self.ref = weakref.ref(t)
        self.storage = _storage_of(t)
        self.view = view_getter(t)
        self.array = self.storage.array
        self.layout = (tuple(t.shape), t.stride(), t.storage_offset())
        grad = t.grad if t.is_leaf else None
        self.grad = grad
        self.grad_storage = _storage_of(grad) if isinstance(grad, Tensor) else None
        self.grad_array = None if self.grad_storage is None else self.grad_storage.array


class ConstantWatch:
    """The constants one trace reached (see the module docstring)."""

    def __init__(self):
        # id -> _Seen for a constant, None for a tensor that holds a tracer or that the
        # traced code made (ids stay unique: a constant outlives the trace it is seen in)
        self._seen: dict[int, _Seen | None] = {}

    def see(self, args: tuple, kwargs: dict | None) -> None:
        """Record the constants among an op's tensor arguments (and its lists' tensors)."""
        seen = self._seen
        for a in (*args, *kwargs.values()) if kwargs else args:
            if isinstance(a, Tensor):
                if id(a) not in seen:
                    seen[id(a)] = self._first_sight(a)
            elif type(a) is list or type(a) is tuple:
                for t in a:
                    if isinstance(t, Tensor) and id(t) not in seen:
                        seen[id(t)] = self._first_sight(t)

    def made(self, result) -> None:
        """An op's results are the traced code's own, never constants of the program (an op
        of constants can give a concrete result: the eager op cache computes it)."""
        seen = self._seen
        if isinstance(result, Tensor):
            seen.setdefault(id(result), None)
        elif type(result) is tuple or type(result) is list:
            for r in result:
                if isinstance(r, Tensor):
                    seen.setdefault(id(r), None)

    @staticmethod
    def _first_sight(t: Tensor) -> _Seen | None:
        if isinstance(_storage_of(t).array, jax.core.Tracer):
            return None  # an input of the program, or a value the traced code computed
        with torch._C.DisableTorchFunctionSubclass():
            return _Seen(t)

    def requiring_grad(self) -> list[Tensor]:
        """The constants still alive that the traced code read and that require grad (first
        seen first): a backward of the program (its vjp) gives a constant no gradient, where
        eager PyTorch's backward would give it one."""
        with torch._C.DisableTorchFunctionSubclass():
            return [t for _, t in self._alive() if t.requires_grad]

    def changed(self) -> list[ChangedConstant]:
        """The constants still alive whose data or ``.grad`` the traced code changed (first
        seen first). Among them may be tensors the traced code made from host data (an
        optimizer's new step count: a factory op is no op of the trace to see) and kept
        where the program returns it from: the caller tells those apart."""
        changed = []
        with torch._C.DisableTorchFunctionSubclass():
            for seen, t in self._alive():
                written = _storage_of(t) is not seen.storage or seen.storage.array is not seen.array
                grad = t.grad if t.is_leaf else None
                grad_given = grad is not seen.grad or (
                    seen.grad_storage is not None and seen.grad_storage.array is not seen.grad_array
                )
                if written or grad_given:
                    changed.append(ChangedConstant(t, written, grad_given, seen))
        return changed

    def read(self) -> ReadConstants | None:
        """The constants still alive that the traced code read and left as they were (None
        if there are none), to check on each call that they still are (``ReadConstants``)."""
        with torch._C.DisableTorchFunctionSubclass():
            kept = [
                seen
                for seen, t in self._alive()
                if _storage_of(t) is seen.storage and seen.storage.array is seen.array
            ]
        return ReadConstants(kept) if kept else None

    def _alive(self) -> Iterator[tuple[_Seen, Tensor]]:
        """Each constant seen (first seen first) whose tensor is still alive, with it."""
        for seen in self._seen.values():
            if seen is not None:
                t = seen.ref()
                if t is not None:
                    yield seen, t

    @staticmethod
    def restore(changed: list[ChangedConstant]) -> None:
        """Put back the data and ``.grad`` each of ``changed`` held when first seen."""
        with torch._C.DisableTorchFunctionSubclass():
            for c in changed:
                t, seen = c.tensor, c._seen
                if c.written:
                    if _storage_of(t) is not seen.storage:  # ``t.data = other``
                        torch.Tensor.data.__set__(t, _alias(seen))  # pyright: ignore[reportAttributeAccessIssue]  (torch's stubs type Tensor.data as a Tensor, not its descriptor)
                    rebind(t, seen.storage, seen.view)
                    seen.storage.array = seen.array
                    seen.storage.exclusive = False  # (never donated: the user holds it)
                if c.grad_given:
                    if seen.grad_storage is not None:
                        seen.grad_storage.array = seen.grad_array
                    t.grad = seen.grad


class ReadConstants:
    """The constants a program's trace read, each with the storage and array it had then:
    their values are baked into the program. ``hold()`` tells whether each still has them (a
    write between calls, in place or through ``.data``, replaces one); a constant no one
    holds any more can no longer change. A C-level pass of identity checks: a program that
    read no constant has no ``ReadConstants`` at all."""

    __slots__ = ("_refs", "_storages", "_arrays")

    def __init__(self, seen: list[_Seen]):
        self._refs = tuple(s.ref for s in seen)
        self._storages = tuple(s.storage for s in seen)
        self._arrays = tuple(s.array for s in seen)

    def hold(self) -> bool:
        tensors = [ref() for ref in self._refs]
        # (not ``None in tensors``: that compares each tensor with None, an op each)
        if not all(map(operator.is_not, tensors, repeat(None))):
            # dropped since (or made by the trace): forgotten, it never changes again
            alive = [i for i, t in enumerate(tensors) if t is not None]
            tensors = [tensors[i] for i in alive]
            self._refs = tuple(self._refs[i] for i in alive)
            self._storages = tuple(self._storages[i] for i in alive)
            self._arrays = tuple(self._arrays[i] for i in alive)
        return all(map(operator.is_, map(storage_getter, tensors), self._storages)) and all(
            map(operator.is_, map(_ARRAY, self._storages), self._arrays)
        )

    def __len__(self) -> int:
        return len(self._refs)


_ARRAY = operator.attrgetter("array")


def _alias(seen: _Seen) -> torch.Tensor:
    """A tensor with the sizes, strides and offset a constant had when first seen (which
    ``t.data = other`` replaced), to set its metadata back from."""
    shape, stride, offset = seen.layout
    return torch.as_strided(Tensor(seen.array), shape, stride, offset)
