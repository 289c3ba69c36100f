"""How a jitted function reaches an object, for the errors that name one (``cfg.w``,
``holder.nets[0][0][0].model``, ``default argument 'w'``, ``helper -> buf``).

The walk (``_walk``) from what the function names and the call's arguments, by the rule of
what a function reaches (``_walk.reached``), breadth first: the shortest path. It runs only
when something may have to be named, so its bounds are wider than the state walk's.
"""

from __future__ import annotations

from ._walk import ROOT, function_roots, path_text, reached, walk

# How far the search goes (it runs only to word an error).
_SEARCH_DEPTH = 8
_SEARCH_NODES = 20_000


def path_to(target_obj, fn, args: tuple, kwargs: dict) -> str | None:
    """The path by which ``fn`` (called with ``args``/``kwargs``) reaches ``target_obj``
    (``'cfg.w'``), or None if the search does not find it."""
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
