"""Returned objects that are not pytree nodes but hold tensors the jitted function computed:
searched once, when the signature is traced (``find``), their computed tensors become program
outputs, and each call hands out a fresh copy with that call's results in their places
(``ObjectOutput.rebuilt``). See docs/architecture.md, "Returned objects".
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import sys
import types
from collections.abc import Callable
from typing import Any

import jax
import jax.core
import torch
from torchlax_core import JitError, Tensor
from torchlax_core.internal import storage_of

from .._views import is_namedtuple
from ._refusals import returned_object_error
from ._walk import (
    ATOMS,
    ATTR,
    HIDDEN,
    ITEM,
    Visit,
    attributes,
    fields,
    items,
    path_text,
    walk,
)

# A search this deep or large is not trusted to have seen everything: it raises.
_MAX_DEPTH = 17
_MAX_NODES = 100_000


_PLACEHOLDER = object()  # what the kept template holds where a program output goes (no tracer)


@dataclasses.dataclass(frozen=True)
class ObjectOutput:
    """One returned object's plan: a template (the object with placeholders where its traced
    tensors were) and the paths to them, as a trie: ``{step: sub-trie or output index}``."""

    template: Any
    trie: dict
    n: int  # how many program outputs it takes

    def rebuilt(self, tensors: list) -> Any:
        """A fresh copy of the template holding ``tensors`` (this call's outputs)."""
        return _rebuilt(self.template, self.trie, tensors)


def find(
    leaf: Any, name: Callable[[], str], stateful: set, owner: str
) -> tuple[ObjectOutput, list] | None:
    """The plan for output leaf ``leaf`` and the traced tensors it holds (in output order), or
    None when it holds none. ``stateful``: ids of the state's storages (kept in the object, as
    eagerly). ``name()`` (its path in the output) and ``owner`` name it in errors."""
    search = _Search(stateful, name, owner, leaf)
    if isinstance(leaf, jax.core.Tracer):
        raise search.error((), "is a JAX value computed inside the function (not a tensor)")
    if isinstance(leaf, ATOMS) or isinstance(leaf, torch.Tensor):
        return None
    trie, tensors = search.run()
    if not trie:
        return None
    template = _rebuilt(leaf, trie, [_PLACEHOLDER] * len(tensors), search.error)
    return ObjectOutput(template, trie, len(tensors)), tensors


@dataclasses.dataclass
class _Search:
    """The walk through a returned object (rule: ``_children``), finding its traced tensors at
    their paths; what hides in it from Python (a C extension's field, a closure, a set's items:
    its ``gc.get_referents``, under a ``HIDDEN`` step) is walked only to refuse one there."""

    stateful: set
    name: Callable[[], str]
    owner: str
    root: Any

    def run(self) -> tuple[dict, list]:
        """The trie of paths to the traced tensors ``root`` holds, and those tensors."""
        trie: dict = {}
        tensors: list = []
        index: dict[int, int] = {}  # id(tensor) -> its output index
        holding: set[int] = set()  # ids of the objects along the paths to them
        again: list[Visit] = []
        visits = walk(
            [((), self.root)],
            self._children,
            max_depth=sys.maxsize,  # (``_children`` bounds it: a hidden step adds none to a path)
            max_nodes=_MAX_NODES,
            too_far=self._too_far,
        )
        for visit in visits:
            value, path = visit.value, visit.path
            hidden = _hidden(path)
            if isinstance(value, jax.core.Tracer):
                what = "holds a JAX value computed inside the function"
                raise self.error(path, what if hidden else f"{what} (not a tensor)")
            traced = isinstance(value, torch.Tensor) and self._traced(value)
            if hidden and (traced or (visit.again and id(value) in holding)):
                raise self.error(
                    path,
                    "holds a tensor the function computed where torchlax cannot put another "
                    "in its place (a C extension's field, a closure, a set)",
                )
            if traced:
                i = index.setdefault(id(value), len(tensors))
                if i == len(tensors):
                    tensors.append(value)
                _insert(trie, path, i)
                holding.update(map(id, visit.holders))
            elif visit.again and not isinstance(value, torch.Tensor):
                again.append(visit)
        # An object holding computed tensors met by two paths (shared, or a cycle): its
        # copies would not share it.
        for visit in again:
            if id(visit.value) in holding:
                raise self.error(
                    visit.path,
                    "reaches the same object holding computed tensors twice (shared or "
                    "cyclic): a copy cannot keep that sharing",
                )
        return trie, tensors

    def _too_far(self, visit: Visit) -> None:
        far = "too large" if _hidden(visit.path) else "too deep or too large"
        raise self.error(visit.path, f"is {far} to search for the tensors the function computed")

    def _children(self, visit: Visit) -> list:
        """A container's items, an object's fields; what hides from Python in it first, and
        from a function (its globals reach the whole program) only what it closes over. In
        what hides: its ``gc.get_referents`` (no step), within ``_MAX_DEPTH`` of where it
        hides, and a tensor or JAX value one beyond."""
        node, path, hidden = visit.value, visit.path, _hidden(visit.path)
        if not hidden and len(path) >= _MAX_DEPTH:
            self._too_far(visit)
        if isinstance(node, types.MethodType):
            node = node.__func__
        if isinstance(node, types.FunctionType):
            return [((HIDDEN, "closure"), cell) for cell in node.__closure__ or ()]
        if hidden:  # (each hidden step adds a holder, none to the path)
            deep = len(visit.holders) - len(path) >= _MAX_DEPTH
            return [
                (None, r)
                for r in gc.get_referents(node)
                if not deep or isinstance(r, torch.Tensor | jax.core.Tracer)
            ]
        if type(node) in (list, tuple) or is_namedtuple(node) or isinstance(node, dict):
            return items(node)  # (an OrderedDict or defaultdict too: copied with copy.copy)
        children = fields(node)
        attrs, _ = attributes(node)
        # (Python may traverse an instance's attribute values without their dict.)
        explained = {id(type(node)), id(attrs), *(id(v) for _, v in children)}
        step = (HIDDEN, type(node).__name__)
        return [(step, r) for r in gc.get_referents(node) if id(r) not in explained] + children

    def _traced(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` was computed inside the trace (holds a tracer that is no state)."""
        if not isinstance(tensor, Tensor):
            return False  # a CPU tensor: a concrete value, kept as it is
        storage = storage_of(tensor)
        return isinstance(getattr(storage, "array", None), jax.core.Tracer) and (
            id(storage) not in self.stateful
        )

    def error(self, path: tuple, what: str) -> JitError:
        return returned_object_error(self.owner, self.root, self.name() + path_text(path), what)


def _hidden(path: tuple) -> bool:
    """Whether ``path`` leads into what hides from Python."""
    return bool(path) and path[-1][0] == HIDDEN


def _insert(trie: dict, path: tuple, index: int) -> None:
    for step in path[:-1]:
        trie = trie.setdefault(step, {})
    trie[path[-1]] = index


def _rebuilt(node: Any, trie: dict, tensors: list, error=None, path: tuple = ()) -> Any:
    """A copy of ``node`` (only the objects along the paths) with, at each path of ``trie``,
    the tensor its index names; with ``error``, checks that the copy took the values."""
    values = {
        step: tensors[sub]
        if isinstance(sub, int)
        else _rebuilt(_get(node, step), sub, tensors, error, (*path, step))
        for step, sub in trie.items()
    }
    if type(node) in (list, tuple, dict) or is_namedtuple(node):
        new = dict(node) if type(node) is dict else list(node)
        for (_, key), v in values.items():
            new[key] = v
        if type(node) is tuple:
            return tuple(new)
        return type(node)._make(new) if is_namedtuple(node) else new  # pyright: ignore[reportAttributeAccessIssue]  (a namedtuple)
    try:
        new = copy.copy(node)
        for (kind, name), v in values.items():
            if kind == ITEM:  # a dict subclass
                new[name] = v
            elif kind == ATTR:
                new.__dict__[name] = v  # past a custom __setattr__ (a frozen dataclass)
            else:
                object.__setattr__(new, name, v)
    except Exception as exc:
        if error is None:
            raise
        raise error(path, f"cannot be copied with its tensors replaced ({exc!r})") from exc
    if error is not None and (
        new is node or any(_get(new, step) is not v for step, v in values.items())
    ):
        raise error(path, "is not copied by copy.copy into an object whose tensors can be replaced")
    return new


def _get(node: Any, step: tuple) -> Any:
    kind, key = step
    if kind == ITEM:
        return node[key]
    if kind == ATTR:
        return node.__dict__[key]
    return object.__getattribute__(node, key)
