"""Objects that hold tensors (a Hugging Face ``DynamicCache``) as JAX pytree nodes.

``functional``'s ``fn`` returns what the module returns, as JAX data; a causal LM returns its
KV cache as a ``transformers`` ``Cache`` object, which JAX takes for an opaque leaf and
``jax.jit`` refuses ("not a valid JAX type"). ``register(obj)`` makes such an object's class a
JAX pytree node: flattening walks the object (its attributes, and lists, tuples and dicts in
them) and returns the tensors and arrays it holds as children; the auxiliary data is a copy of
the object with placeholders in their places plus a hashable description of that structure
(so ``jax.jit`` retraces only when the structure or a non-array attribute changes).
Unflattening copies the template along the way and puts the children back. So ``jax.jit(fn)``
returns the cache with ``jax.Array``s in it, and the same object passed back into ``fn`` comes
back as a cache of torchlax Tensors: ``torchlax.jit`` does the same for its outputs
(``jit/_objects.py``).

``register_known()`` registers ``transformers``' cache classes ahead (when transformers is
imported), so a cache the caller built (``DynamicCache(config=...)``) can be passed in first.
"""

from __future__ import annotations

import copy
import enum
import sys
import types
from typing import Any

import jax
import numpy as np
import torch
from torchlax_core import TorchlaxError

# Values that hold no tensor, here and in torchlax.jit's search of returned objects
# (jit/_objects.py).
TENSORLESS = (
    int,
    float,
    complex,
    str,
    bytes,
    type(None),
    type(Ellipsis),
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
    enum.Enum,
    type,
    types.ModuleType,
    range,
)
# Kept in the template as they are.
_ATOMS = (*TENSORLESS, types.FunctionType, types.BuiltinFunctionType, types.MethodType)
_MAX_DEPTH = 12
_registered: set[type] = set()


class ObjectPytreeError(TorchlaxError, TypeError):
    """An object returned by (or passed to) a functional module that cannot be a JAX pytree."""


class _Slot:
    """Where the template had child ``index``."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    def __repr__(self) -> str:
        return f"<array {self.index}>"


class _Aux:
    """The auxiliary data of one object node: its template and a hashable description."""

    __slots__ = ("template", "key")

    def __init__(self, template: Any, key: Any):
        self.template, self.key = template, key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Aux) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return f"{type(self.template).__name__} template"


def _is_array(value: Any) -> bool:
    return isinstance(value, torch.Tensor | jax.Array | np.ndarray)


def _atom_key(value: Any) -> Any:
    try:
        hash(value)
    except TypeError:
        return (type(value), repr(value))
    return (type(value), value)


def _strip(value: Any, leaves: list, path: tuple, owner: str) -> tuple[Any, Any]:
    """``(template, key)`` of ``value``: its arrays appended to ``leaves``, placeholders in
    their places (objects and containers copied), and the structure as a hashable key."""
    if _is_array(value):
        leaves.append(value)
        return _Slot(len(leaves) - 1), "array"
    if isinstance(value, _ATOMS):
        return value, _atom_key(value)
    if len(path) > _MAX_DEPTH or any(value is p for p in path):
        raise ObjectPytreeError(
            f"torchlax.functional: the {owner} returned by the module (or passed to it) holds "
            f"objects {_MAX_DEPTH} levels deep or a reference cycle, so its tensors cannot be "
            "found reliably. Return its tensors in a tuple or dict instead, or use torchlax.jit, "
            "which hands such objects out as they are."
        )
    path = (*path, value)
    kind = type(value)
    if kind in (list, tuple):
        parts = [_strip(v, leaves, path, owner) for v in value]
        return kind(p[0] for p in parts), (kind, tuple(p[1] for p in parts))
    if kind is dict:
        parts = {k: _strip(v, leaves, path, owner) for k, v in value.items()}
        template = {k: p[0] for k, p in parts.items()}
        return template, (dict, tuple((k, p[1]) for k, p in parts.items()))
    attributes = getattr(value, "__dict__", None)
    if attributes is None:
        return value, ("object", id(value))  # opaque, kept as is: equal only to itself
    template = copy.copy(value)
    keys = []
    for name, attr in attributes.items():
        stripped, key = _strip(attr, leaves, path, owner)
        template.__dict__[name] = stripped
        keys.append((name, key))
    return template, (kind, tuple(keys))


def _fill(template: Any, children: list) -> Any:
    if isinstance(template, _Slot):
        return children[template.index]
    kind = type(template)
    if kind in (list, tuple):
        return kind(_fill(v, children) for v in template)
    if kind is dict:
        return {k: _fill(v, children) for k, v in template.items()}
    if isinstance(template, _ATOMS) or not hasattr(template, "__dict__"):
        return template
    if not any(_holds_slot(v) for v in template.__dict__.values()):
        return template
    filled = copy.copy(template)
    for name, attr in template.__dict__.items():
        filled.__dict__[name] = _fill(attr, children)
    return filled


def _holds_slot(value: Any) -> bool:
    if isinstance(value, _Slot):
        return True
    if type(value) in (list, tuple):
        return any(_holds_slot(v) for v in value)
    if type(value) is dict:
        return any(_holds_slot(v) for v in value.values())
    attributes = getattr(value, "__dict__", None)
    if attributes is None or isinstance(value, _ATOMS):
        return False
    return any(_holds_slot(v) for v in attributes.values())


def _flatten(obj: Any) -> tuple[list, _Aux]:
    leaves: list = []
    template, key = _strip(obj, leaves, (), type(obj).__name__)
    return leaves, _Aux(template, key)


def _unflatten(aux: _Aux, children: Any) -> Any:
    return _fill(aux.template, list(children))


def holds_arrays(obj: Any) -> bool:
    """Whether ``obj`` is a plain object (not a container JAX or torch's pytrees know) holding
    a tensor or array somewhere in its attributes."""
    if _is_array(obj) or isinstance(obj, _ATOMS) or not hasattr(obj, "__dict__"):
        return False
    return _finds_array(obj, 0)


def _finds_array(value: Any, depth: int) -> bool:
    if _is_array(value):
        return True
    if depth > _MAX_DEPTH or isinstance(value, _ATOMS):
        return False
    if type(value) in (list, tuple):
        return any(_finds_array(v, depth + 1) for v in value)
    if type(value) is dict:
        return any(_finds_array(v, depth + 1) for v in value.values())
    attributes = getattr(value, "__dict__", None)
    return attributes is not None and any(_finds_array(v, depth + 1) for v in attributes.values())


def register_class(kind: type) -> None:
    """Make ``kind`` a JAX pytree node whose children are the arrays its objects hold."""
    if kind in _registered:
        return
    try:
        jax.tree_util.register_pytree_node(kind, _flatten, _unflatten)
    except ValueError:  # registered with JAX already (by its author or another library)
        pass
    _registered.add(kind)


def register_known() -> None:
    """Register ``transformers``' KV-cache classes, if transformers has been imported."""
    cache_utils = sys.modules.get("transformers.cache_utils")
    base = getattr(cache_utils, "Cache", None)
    if not isinstance(base, type):
        return
    pending = [base]
    while pending:
        kind = pending.pop()
        register_class(kind)
        pending.extend(kind.__subclasses__())
