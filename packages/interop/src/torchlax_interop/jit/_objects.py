"""Returned objects that are not pytree nodes but hold tensors the jitted function computed.

``torchlax.jit`` flattens its function's result with ``torch.utils._pytree``; a leaf that is
neither a tensor nor a constant (a transformers ``DynamicCache``, a user's class) would be kept
as a constant of the trace, its tensors holding tracers that the program never outputs. Such a
leaf is searched once, when its signature is traced (``find``): the torchlax Tensors computed
inside the trace that it holds (in attributes, ``__slots__``, lists, tuples and dicts) become
program outputs, and each call hands out a fresh copy of the object with that call's results
in their places (``ObjectOutput.rebuilt``: ``copy.copy`` along the paths to them only), as an
eager call hands out a new object each time. What cannot be rebuilt so raises at trace time.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import types
from collections.abc import Callable
from typing import Any

import jax
import jax.core
import numpy as np
import torch
from torchlax_core import JitError, Tensor
from torchlax_core.internal import storage_of

from .._object_nodes import TENSORLESS
from .._views import is_namedtuple

# Values that hold no tensor: not searched (functional's object pytrees share the list).
_ATOMS = (
    *TENSORLESS,
    np.ndarray,
    np.generic,
    jax.Array,  # a concrete one: each check for a tracer (also a jax.Array) comes first
)
# A search this deep or this large is not trusted to have seen everything (an object graph
# that reaches a whole program); it raises instead.
_MAX_DEPTH = 16
_MAX_NODES = 100_000

_ATTR, _SLOT, _ITEM = "attribute", "slot", "item"


class _Placeholder:
    """What the kept template holds where a program output goes (no tracer is kept)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<torchlax.jit output>"


_PLACEHOLDER = _Placeholder()


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
    None when it holds none. ``stateful``: ids of the state's storages (a parameter, a buffer:
    it is no leaked value, and the returned object keeps it, as eagerly). ``name`` (the leaf's
    path in the output, made only when an error needs it) and ``owner``
    (``torchlax.jit(fn)``) name it in errors."""
    search = _Search(stateful, name, owner, leaf)
    if isinstance(leaf, jax.core.Tracer):
        raise search.error((), "is a JAX value computed inside the function (not a tensor)")
    if isinstance(leaf, _ATOMS) or isinstance(leaf, torch.Tensor):
        return None
    search.holds[id(leaf)] = None
    trie = search.walk(leaf, (), 0)
    search.holds[id(leaf)] = bool(trie)
    search.check_back_references()
    if not trie:
        return None
    template = _rebuilt(leaf, trie, [_PLACEHOLDER] * len(search.tensors), search.error)
    return ObjectOutput(template, trie, len(search.tensors)), search.tensors


class _Search:
    def __init__(self, stateful: set, name: Callable[[], str], owner: str, root: Any):
        self.stateful = stateful
        self.name = name
        self.owner = owner
        self.root = root
        self.tensors: list = []
        self.index: dict[int, int] = {}  # id(tensor) -> its output index
        # id(node) -> whether it holds traced tensors (None: still being searched)
        self.holds: dict[int, bool | None] = {}
        self.back_references: list = []  # (node, path) met again while searching
        self.nodes = 0

    def walk(self, node: Any, path: tuple, depth: int) -> dict:
        """The trie of paths from ``node`` to traced tensors (empty: none)."""
        trie: dict = {}
        for step, value in self._children(node, path, depth):
            sub_path = (*path, step)
            if isinstance(value, torch.Tensor):
                if self._traced(value, sub_path):
                    trie[step] = self.index.setdefault(id(value), len(self.tensors))
                    if trie[step] == len(self.tensors):
                        self.tensors.append(value)
                continue
            if isinstance(value, jax.core.Tracer):
                raise self.error(
                    sub_path, "holds a JAX value computed inside the function (not a tensor)"
                )
            if isinstance(value, _ATOMS):
                continue
            seen = self.holds.get(id(value), False)
            if id(value) in self.holds:
                if seen is None:  # a reference back to an object being searched
                    self.back_references.append((value, sub_path))
                elif seen:
                    raise self._shared(sub_path)
                continue
            self.holds[id(value)] = None
            sub = self.walk(value, sub_path, depth + 1)
            self.holds[id(value)] = bool(sub)
            if sub:
                trie[step] = sub
        return trie

    def check_back_references(self) -> None:
        """A reference back to an object that holds computed tensors: its copy would not be
        referred to by the copies (the sharing cannot be kept)."""
        for value, at in self.back_references:
            if self.holds.get(id(value)):
                raise self._shared(at)

    def _children(self, node: Any, path: tuple, depth: int):
        self.nodes += 1
        if depth > _MAX_DEPTH or self.nodes > _MAX_NODES:
            raise self.error(
                path, "is too deep or too large to search for the tensors the function computed"
            )
        if type(node) in (list, tuple) or is_namedtuple(node):
            return [((_ITEM, i), v) for i, v in enumerate(node)]
        if isinstance(node, dict):  # an OrderedDict or defaultdict too (copied with copy.copy)
            return [((_ITEM, k), v) for k, v in node.items()]
        if isinstance(node, types.MethodType):
            node = node.__func__
        if isinstance(node, types.FunctionType):
            # Its globals reach the whole program: only what it closes over is searched.
            for cell in node.__closure__ or ():
                self._refuse_hidden(cell, (*path, ("hidden", "closure")), 0)
            return []
        children = []
        explained = {id(type(node))}
        attributes = getattr(node, "__dict__", None)
        if type(attributes) is dict:
            # (Python may traverse an instance's attribute values without their dict.)
            explained.update([id(attributes), *map(id, attributes.values())])
            children.extend(((_ATTR, k), v) for k, v in attributes.items())
        for name in slot_names(type(node)):
            try:
                value = object.__getattribute__(node, name)
            except AttributeError:
                continue
            explained.add(id(value))
            children.append(((_SLOT, name), value))
        # What the object holds where Python cannot set it (a C extension's fields, a closure,
        # a set's items): searched only to refuse a traced tensor there.
        for referent in gc.get_referents(node):
            if id(referent) not in explained:
                self._refuse_hidden(referent, (*path, ("hidden", type(node).__name__)), 0)
        return children

    def _refuse_hidden(self, node: Any, path: tuple, depth: int) -> None:
        if isinstance(node, torch.Tensor):
            if self._traced(node, path):
                raise self.error(
                    path,
                    "holds a tensor the function computed where torchlax cannot put another "
                    "in its place (a C extension's field, a closure, a set)",
                )
            return
        if isinstance(node, jax.core.Tracer):
            raise self.error(path, "holds a JAX value computed inside the function")
        if isinstance(node, _ATOMS) or depth > _MAX_DEPTH or id(node) in self.holds:
            return
        if isinstance(node, (types.FunctionType, types.MethodType)):
            self._children(node, path, depth)  # its closure only
            return
        self.holds[id(node)] = False
        self.nodes += 1
        if self.nodes > _MAX_NODES:
            raise self.error(path, "is too large to search for the tensors the function computed")
        for referent in gc.get_referents(node):
            self._refuse_hidden(referent, path, depth + 1)

    def _traced(self, tensor: torch.Tensor, path: tuple) -> bool:
        """Whether ``tensor`` was computed inside the trace (holds a tracer that is no state)."""
        if not isinstance(tensor, Tensor):
            return False  # a CPU tensor: a concrete value, kept as it is
        storage = storage_of(tensor)
        return isinstance(getattr(storage, "array", None), jax.core.Tracer) and (
            id(storage) not in self.stateful
        )

    def _shared(self, path: tuple) -> JitError:
        return self.error(
            path,
            "reaches the same object holding computed tensors twice (shared or cyclic): a "
            "copy cannot keep that sharing",
        )

    def error(self, path: tuple, what: str) -> JitError:
        return JitError(
            f"{self.owner}: the returned {type(self.root).__qualname__} at {self.name()}"
            f"{_path_text(path)} {what}. The program can only return tensors it can find and "
            "put back. Return tensors or a pytree of them instead, register the type with "
            "torch.utils._pytree.register_pytree_node, or, for a transformers model's "
            "cache, call it with use_cache=False."
        )


def _rebuilt(node: Any, trie: dict, tensors: list, error=None, path: tuple = ()) -> Any:
    """A copy of ``node`` with, at each path of ``trie``, the tensor its index names (copies
    only the objects along the paths; with ``error``, checks that the copy took the values)."""
    values = {
        step: tensors[sub]
        if isinstance(sub, int)
        else _rebuilt(_get(node, step), sub, tensors, error, (*path, step))
        for step, sub in trie.items()
    }
    if type(node) is list:
        new = list(node)
        for (_, i), v in values.items():
            new[i] = v
        return new
    if type(node) is tuple or is_namedtuple(node):
        items = list(node)
        for (_, i), v in values.items():
            items[i] = v
        return tuple(items) if type(node) is tuple else type(node)._make(items)  # pyright: ignore[reportAttributeAccessIssue]  (a namedtuple)
    if type(node) is dict:
        new = dict(node)
        for (_, k), v in values.items():
            new[k] = v
        return new
    try:
        new = copy.copy(node)
        for (kind, name), v in values.items():
            if kind == _ITEM:  # a dict subclass
                new[name] = v
            elif kind == _ATTR:
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
    if kind == _ITEM:
        return node[key]
    if kind == _ATTR:
        return node.__dict__[key]
    return object.__getattribute__(node, key)


def slot_names(cls: type) -> list[str]:
    names = []
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        names.extend([slots] if isinstance(slots, str) else slots)
    return [n for n in names if n not in ("__dict__", "__weakref__")]


def _path_text(path: tuple) -> str:
    text = ""
    for kind, key in path:
        if kind == _ITEM:
            text += f"[{key!r}]"
        elif kind == "hidden":
            text += f" (inside a {key})"
        else:
            text += f".{key}"
    return text
