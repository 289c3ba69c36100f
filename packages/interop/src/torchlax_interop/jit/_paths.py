"""How a jitted function reaches an object, for the errors that name one (``cfg.w``,
``holder.nets[0][0][0].model``, ``default argument 'w'``).

A bounded breadth-first search from what the function can name: a ``functools.partial``'s
arguments, a bound method's object, closure cells, the globals its code reads, its default
arguments, and the call's arguments; through lists, tuples, dicts, the attributes of the
objects the state walk would enter (``_holders``), a module's submodules, parameters,
buffers and public attributes, and the same roots of the functions met (a helper the step
calls: ``helper -> buf``). It runs only when something may have to be named.
"""

from __future__ import annotations

import functools
import types

import torch

from ._holders import attributes, enterable, slot_values

# How far the search goes (it runs only to word an error).
_SEARCH_DEPTH = 8
_SEARCH_NODES = 20_000


def path_to(target_obj, fn, args: tuple, kwargs: dict) -> str | None:
    """The path by which ``fn`` (called with ``args``/``kwargs``) reaches ``target_obj``
    (``'cfg.w'``), or None if the search does not find it."""
    return _search(_roots(fn, args, kwargs), target_obj)


def _search(level: list, target_obj) -> str | None:
    seen: set = set()
    for _ in range(_SEARCH_DEPTH):
        following: list = []
        for path, value in level:
            if value is target_obj:
                return path
            if id(value) in seen or len(seen) > _SEARCH_NODES:
                continue
            seen.add(id(value))
            following += _children(path, value)
        level = following
    return None


def reaches(root, target_obj) -> bool:
    """Whether ``target_obj`` is ``root`` or inside it (searched as ``path_to`` does)."""
    return _search([("", root)], target_obj) is not None


def _roots(fn, args: tuple, kwargs: dict) -> list:
    roots = _function_roots(fn)
    roots += [(f"argument {i}", a) for i, a in enumerate(args)]
    roots += [(f"argument {k!r}", a) for k, a in kwargs.items()]
    return roots


def _function_roots(fn, prefix: str = "") -> list:
    """What ``fn`` names: a partial's arguments, a bound method's object, a module's
    ``self``, its closure cells, the globals its code reads and its default arguments
    (``prefix``: the path of ``fn`` itself, for a function met inside the search)."""
    roots: list = []
    if isinstance(fn, functools.partial):
        roots += [(f"partial argument {i}", a) for i, a in enumerate(fn.args)]
        roots += [(f"partial argument {k!r}", a) for k, a in fn.keywords.items()]
        fn = fn.func
    if isinstance(fn, types.MethodType):
        roots.append(("self", fn.__self__))
        fn = fn.__func__
    if isinstance(fn, torch.nn.Module):
        roots.append(("self", fn))
        fn = type(fn).forward
    if isinstance(fn, types.FunctionType):
        code = fn.__code__
        cells = zip(code.co_freevars, fn.__closure__ or (), strict=False)
        for name, cell in cells:
            try:
                roots.append((name, cell.cell_contents))
            except ValueError:  # an empty cell
                pass
        roots += [(n, fn.__globals__[n]) for n in code.co_names if n in fn.__globals__]
        defaults = fn.__defaults__ or ()
        named = code.co_varnames[code.co_argcount - len(defaults) : code.co_argcount]
        roots += [(f"default argument {n!r}", v) for n, v in zip(named, defaults, strict=True)]
        roots += [(f"default argument {n!r}", v) for n, v in (fn.__kwdefaults__ or {}).items()]
    if prefix:
        return [(f"{prefix} -> {path}", value) for path, value in roots]
    return roots


def _children(path: str, value) -> list:
    if isinstance(value, torch.nn.Module):
        named = [
            *value._modules.items(),
            *value._parameters.items(),
            *value._buffers.items(),
            *((n, v) for n, v in vars(value).items() if not n.startswith("_") and n != "training"),
        ]
        return [(f"{path}.{n}", v) for n, v in named if v is not None]
    if isinstance(value, torch.Tensor):
        return []
    if isinstance(value, types.FunctionType | types.MethodType | functools.partial):
        # a helper the step calls, and what it closes over (``buf`` in ``helper``'s closure)
        return _function_roots(value, path)
    if type(value) is list or isinstance(value, tuple):
        return [(f"{path}[{i}]", v) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return [(f"{path}[{k!r}]", v) for k, v in value.items()]
    if not enterable(value):
        return []
    attrs, slots = attributes(value)
    items = [*(attrs or {}).items(), *zip(slots, slot_values(value, slots), strict=True)]
    return [(f"{path}.{n}", v) for n, v in items]
