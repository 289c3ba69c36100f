"""What a step reaches: the one object walker (``walk``: each object once, with its path from
a root), and its rules of what it enters: ``reached`` (what a function reaches, for the paths
errors name things by: ``path_to``) and those the state walk (``_discover``) and the search of
returned objects (``_objects``) build on. See docs/architecture.md, "What the state walk
enters".
"""

from __future__ import annotations

import dis
import enum
import functools
import logging
import threading
import types
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import jax
import jax.core
import numpy as np
import torch

from .._object_nodes import TENSORLESS

# Values that hold no tensor: never entered (functional's object pytrees share the list).
ATOMS = (
    *TENSORLESS,
    np.ndarray,
    np.generic,
    jax.Array,  # a concrete one: a tracer (also a jax.Array) is yielded, never entered
)

# A path is a tuple of steps (kind, key): a root's name, an item, an attribute, a slot, or
# where a value hides from Python (``_objects``).
ROOT, ITEM, ATTR, SLOT, HIDDEN = "root", "item", "attribute", "slot", "hidden"


class Visit(NamedTuple):
    """One object met: its path, the objects along it (the root first, not ``value``), and
    whether it was met before by another path (``again``: then it is not entered)."""

    path: tuple
    value: Any
    holders: tuple
    again: bool


def walk(
    roots: Iterable[tuple[tuple, Any]],
    children: Callable[[Visit], Iterable[tuple[tuple | None, Any]]],
    *,
    max_depth: int,
    max_nodes: int,
    breadth: bool = False,
    too_far: Callable[[Visit], None] | None = None,
) -> Iterator[Visit]:
    """Each object reachable from ``roots`` ((path, value) pairs) by ``children``, once (met
    again: yielded with ``again``, not entered), depth first or, with ``breadth``, nearest
    first; atoms are not yielded. A child's step of None (a value hidden from Python: a C
    extension's field, a set's item) leaves it its holder's path. An object whose path has
    ``max_depth`` steps, or any once ``max_nodes`` were met, is not entered (``too_far`` is
    told, and may raise)."""
    seen: set[int] = set()
    pending = deque(Visit(path, value, (), False) for path, value in roots)
    if not breadth:
        pending.reverse()
    take = pending.popleft if breadth else pending.pop
    while pending:
        visit = take()
        value = visit.value
        if isinstance(value, ATOMS) and not isinstance(value, jax.core.Tracer):
            continue
        if id(value) in seen:
            yield visit._replace(again=True)
            continue
        seen.add(id(value))
        yield visit
        if isinstance(value, torch.Tensor | jax.core.Tracer):
            continue
        if len(visit.path) >= max_depth or len(seen) > max_nodes:
            if too_far is not None:
                too_far(visit)
            continue
        holders = (*visit.holders, value)
        following = [
            Visit(visit.path if step is None else (*visit.path, step), child, holders, False)
            for step, child in children(visit)
        ]
        pending.extend(following if breadth else reversed(following))


def reached(visit: Visit) -> list[tuple[tuple, Any]]:
    """What a function reaches from ``visit.value``: a container's items, an entered object's
    ``fields``, a module's submodules, parameters, buffers and public attributes, what a
    function met names (``function_roots``)."""
    value = visit.value
    if isinstance(value, torch.nn.Module):
        named = [*value._modules.items(), *value._parameters.items(), *value._buffers.items()]
        found = [*(((ATTR, n), v) for n, v in named), *public_fields(value)]
        return [(step, v) for step, v in found if v is not None]
    if isinstance(value, types.FunctionType | types.MethodType | functools.partial):
        return function_roots(value)
    if is_container(value):
        return items(value)
    return fields(value) if enterable(value) else []


# How far the search for a path goes (only to word an error: wider than the state walk)
_SEARCH_DEPTH = 8
_SEARCH_NODES = 20_000


def path_to(target_obj, fn, args: tuple, kwargs: dict) -> str | None:
    """The shortest path by which ``fn`` (called with ``args``/``kwargs``) reaches
    ``target_obj`` (``'cfg.w'``), by the rule ``reached``, or None if the search does not
    find it."""
    roots = [
        *function_roots(fn),
        *(((ROOT, f"argument {i}"), a) for i, a in enumerate(args)),
        *(((ROOT, f"argument {k!r}"), a) for k, a in kwargs.items()),
    ]
    return _search([((step,), value) for step, value in roots], target_obj)


def reaches(root, target_obj) -> bool:
    """Whether ``target_obj`` is ``root`` or inside it (searched as ``path_to`` does)."""
    return _search([((), root)], target_obj) is not None


def _search(roots: list, target_obj) -> str | None:
    visits = walk(roots, reached, max_depth=_SEARCH_DEPTH, max_nodes=_SEARCH_NODES, breadth=True)
    return next((path_text(v.path) for v in visits if v.value is target_obj), None)


def read_directly(reader: Callable, *args) -> Any:
    return reader(*args)


def function_roots(fn) -> list[tuple[tuple, Any]]:
    """What ``fn`` names: a partial's arguments, a bound method's object, a module's
    ``self``, its closure cells, the globals its code reads and its default arguments."""
    roots: list = []
    if isinstance(fn, functools.partial):
        roots += [((ROOT, f"partial argument {i}"), a) for i, a in enumerate(fn.args)]
        roots += [((ROOT, f"partial argument {k!r}"), a) for k, a in fn.keywords.items()]
        fn = fn.func
    if isinstance(fn, types.MethodType):
        roots.append(((ROOT, "self"), fn.__self__))
        fn = fn.__func__
    if isinstance(fn, torch.nn.Module):
        roots.append(((ROOT, "self"), fn))
        fn = type(fn).forward
    if isinstance(fn, types.FunctionType):
        roots += named_by(fn)
    return roots


def named_by(fn: types.FunctionType, read: Callable = read_directly) -> list[tuple[tuple, Any]]:
    """What ``fn``'s code names, each bound one with its step: its closure cells, the globals
    it reads, its default arguments (``default argument 'model'``). Each is read through
    ``read(reader, *arguments)`` (the state walk's snapshot records those reads)."""
    code = fn.__code__
    cells = zip(code.co_freevars, fn.__closure__ or (), strict=False)
    found = [((ROOT, name), read(cell_contents, cell)) for name, cell in cells]
    found += [
        ((ROOT, name), read(dict.get, fn.__globals__, name, ABSENT)) for name in global_names(code)
    ]
    if any([read(getattr, fn, "__defaults__"), read(getattr, fn, "__kwdefaults__")]):
        defaults = fn.__defaults__ or ()
        named = code.co_varnames[code.co_argcount - len(defaults) : code.co_argcount]
        found += [
            ((ROOT, f"default argument {n!r}"), v)
            for n, v in (*zip(named, defaults, strict=True), *(fn.__kwdefaults__ or {}).items())
        ]
    return [(step, value) for step, value in found if value is not ABSENT]


def cell_contents(cell):
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell: the variable is not bound yet
        return ABSENT


# The instructions that read a global (``LOAD_NAME``: in a class body the function defines).
_GLOBAL_READS = {"LOAD_GLOBAL", "LOAD_NAME"}


@functools.cache
def global_names(code: types.CodeType) -> tuple[str, ...]:
    """The globals ``code`` (and the code objects it defines) reads. Not ``co_names``: that
    holds attribute names too (``out.loss`` would take a global ``loss`` for one it reads)."""
    names = [i.argval for i in dis.get_instructions(code) if i.opname in _GLOBAL_READS]
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names.extend(global_names(const))
    return tuple(dict.fromkeys(names))


def is_container(value) -> bool:
    """A list (exactly: a subclass may compute its items), a tuple (a namedtuple too) or a
    dict (an OrderedDict, a defaultdict too)."""
    return type(value) is list or isinstance(value, tuple | dict)


def items(container) -> list[tuple[tuple, Any]]:
    """A list's or tuple's items or a dict's values, with their steps."""
    if isinstance(container, dict):
        return [((ITEM, k), v) for k, v in container.items()]
    return [((ITEM, i), v) for i, v in enumerate(container)]


# Python's class statement makes heap types; a static C type's instance dict is its own business.
_HEAP_TYPE = 1 << 9

# Python objects whose attributes a function's walk does not enter: data pipelines (a
# dataset's samples are data, and can be many), loggers (they reach every logger of the
# process), threads (another thread's work), JAX arrays (C++ objects), and what the walk
# handles itself or holds no state of its own: modules, optimizers, schedulers, tensors,
# classes, Python modules, enum members, functions and methods (a callback's globals reach
# the whole program).
_NOT_ENTERED = (
    torch.utils.data.DataLoader,
    torch.utils.data.Dataset,
    logging.Logger,
    logging.Handler,
    threading.Thread,
    jax.Array,
    torch.nn.Module,
    torch.optim.Optimizer,
    torch.optim.lr_scheduler.LRScheduler,
    torch.Tensor,
    type,
    types.FunctionType,
    types.MethodType,
    types.BuiltinFunctionType,
    types.ModuleType,
    enum.Enum,
)


def enterable(obj: Any) -> bool:
    """Whether a function's walk enters ``obj``'s attributes: an instance of a class written
    in Python, or a ``SimpleNamespace`` (a trainer, a config), that is none of ``_NOT_ENTERED``."""
    cls = type(obj)
    if cls is types.SimpleNamespace:
        return True
    return bool(cls.__flags__ & _HEAP_TYPE) and not isinstance(obj, _NOT_ENTERED)


def fields(obj: Any) -> list[tuple[tuple, Any]]:
    """``obj``'s attributes (its instance ``__dict__``, when a plain dict) and the slots its
    classes declare that are set, with their steps."""
    attrs, slots = attributes(obj)
    found = [((ATTR, k), v) for k, v in (attrs or {}).items()]
    for name in slots:
        value = slot_value(obj, name)
        if value is not ABSENT:
            found.append(((SLOT, name), value))
    return found


def public_fields(module: torch.nn.Module) -> list[tuple[tuple, Any]]:
    """A module's ``fields`` that are public (neither its parameters, buffers and submodules,
    which its ``__dict__`` does not hold, nor ``training``)."""
    return [(s, v) for s, v in fields(module) if not s[1].startswith("_") and s[1] != "training"]


def attributes(obj: Any) -> tuple[dict | None, list[str]]:
    """``obj``'s instance dict (None if it has none, or one that is not a plain dict) and the
    names of the ``__slots__`` its classes declare."""
    attrs = slot_value(obj, "__dict__")
    slots = [klass.__dict__.get("__slots__", ()) for klass in type(obj).__mro__]
    names = [n for s in slots for n in ([s] if isinstance(s, str) else s)]
    return (attrs if type(attrs) is dict else None), [
        n for n in names if n not in ("__dict__", "__weakref__")
    ]


def slot_value(obj: Any, name: str) -> Any:
    """``obj``'s slot ``name`` (``ABSENT`` if unset), past the class's ``__getattribute__``."""
    try:
        return object.__getattribute__(obj, name)
    except AttributeError:
        return ABSENT


ABSENT = object()  # an unset slot, an empty closure cell


# Each kind of step in words (a root's arrow dropped where it starts the path)
_STEP_TEXT = {ROOT: " -> {}", ITEM: "[{!r}]", HIDDEN: " (inside a {})"}


def path_text(path: tuple) -> str:
    """A path in words: ``cfg.model``, ``holder.nets[0]``, ``helper -> buf``."""
    text = "".join(_STEP_TEXT.get(kind, ".{}").format(key) for kind, key in path)
    return text.removeprefix(" -> ")
