"""The constants a traced program read, checked on each call: the torchlax Tensors its trace
reached that hold concrete arrays (no state; the trace watch, ``_watch``, finds them). Their
values are baked into the program, so a call runs it only while each still holds the array it
held when traced.
"""

from __future__ import annotations

import operator
from itertools import repeat

from torchlax_core.internal import storage_getter


class ReadConstants:
    """The constants a program's trace read, each with the storage and array it had then:
    their values are baked into the program. ``hold()`` tells whether each still has them (a
    write between calls, in place or through ``.data``, replaces one); a constant no one
    holds any more can no longer change. A C-level pass of identity checks: a program that
    read no constant has no ``ReadConstants`` at all."""

    __slots__ = ("_refs", "_storages", "_arrays")

    def __init__(self, seen: list):
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
