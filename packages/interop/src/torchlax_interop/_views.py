"""Convert whole pytrees between torchlax Tensors and ``jax.Array``s, without copying."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.utils._pytree as torch_pytree
from torchlax_core import Tensor, wrap

from ._dlpack import from_torch


def _is_tensor(x) -> bool:
    return isinstance(x, torch.Tensor)


def _to_array(x):
    if isinstance(x, Tensor):
        return x.jax()
    if isinstance(x, torch.Tensor):
        return from_torch(x).jax()
    return x


def _to_tensor(x):
    if isinstance(x, jax.Array) and not isinstance(x, torch.Tensor):
        return wrap(x)
    return x


def jax_view(tree: Any) -> Any:
    """``tree`` with every torchlax Tensor replaced by the ``jax.Array`` it holds.

    Plain torch tensors are promoted with ``from_torch`` (shared, copy-on-write on the torch
    side). Other leaves, and containers, are kept: JAX's pytrees (tuples, lists, dicts,
    namedtuples, None), every node type PyTorch's pytree registry knows (Hugging Face's
    ``ModelOutput`` for one) and dataclasses; the last two are registered with JAX on first
    sight, so the result is a valid JAX pytree (``jax.jit`` may return it). Autograd history
    is not carried: the result is plain JAX data.
    """
    register_containers(tree)
    return jax.tree_util.tree_map(_to_array, tree, is_leaf=_is_tensor)


# Node types JAX knows natively, and the ones registered here, so each is checked once.
_JAX_KNOWN: set[type] = {
    tuple,
    list,
    dict,
    type(None),
    collections.OrderedDict,
    collections.defaultdict,
    collections.deque,
}


def is_namedtuple(obj: Any) -> bool:
    """Whether ``obj`` is a namedtuple (a pytree node to JAX and torch alike, never registered)."""
    return isinstance(obj, tuple) and hasattr(type(obj), "_fields")


def register_containers(obj: Any) -> None:
    """Register the container types in ``obj`` that torch's pytrees know and JAX's do not.

    Models return containers PyTorch code understands (``ModelOutput`` is registered with
    ``torch.utils._pytree``; ``dataclasses`` with neither), which JAX would otherwise take for
    one opaque leaf and reject as "not a valid JAX type".
    """
    if isinstance(obj, torch.Tensor | jax.Array):
        return
    kind = type(obj)
    node = torch_pytree.SUPPORTED_NODES.get(kind)
    namedtuple = is_namedtuple(obj)
    if node is not None or namedtuple:
        if kind not in _JAX_KNOWN and not namedtuple:
            _register_torch_node(kind, node)
        children, _ = node.flatten_fn(obj) if node is not None else (list(obj), None)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        if kind not in _JAX_KNOWN:
            _register_dataclass(kind)
        children = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    else:
        return
    for child in children:
        register_containers(child)


def _register_torch_node(kind: type, node: Any) -> None:
    def flatten(obj):
        children, context = node.flatten_fn(obj)
        return children, _Hashable(context)

    def unflatten(context, children):
        return node.unflatten_fn(list(children), context.value)

    _register(kind, flatten, unflatten)


def _register_dataclass(kind: type) -> None:
    names = tuple(f.name for f in dataclasses.fields(kind) if f.init)

    def flatten(obj):
        return [getattr(obj, name) for name in names], names

    def unflatten(names, children):
        return kind(**dict(zip(names, children, strict=True)))

    _register(kind, flatten, unflatten)


def _register(kind: type, flatten, unflatten) -> None:
    try:
        jax.tree_util.register_pytree_node(kind, flatten, unflatten)
    except ValueError:  # registered with JAX already (by its author or another library)
        pass
    _JAX_KNOWN.add(kind)


class _Hashable:
    """A torch pytree context (often a list of keys) as the hashable aux data JAX requires."""

    __slots__ = ("value", "_key")

    def __init__(self, value: Any):
        self.value = value
        self._key = repr(value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Hashable) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)


def torch_view(tree: Any) -> Any:
    """``tree`` with every ``jax.Array`` (traced ones included) wrapped as a torchlax Tensor.

    The arrays are shared, not copied. Other leaves and the containers are kept.
    """
    return jax.tree_util.tree_map(_to_tensor, tree, is_leaf=_is_tensor)


def numpy_to_jax(tree: Any) -> Any:
    """``tree`` with NumPy arrays made JAX arrays (JAX functions accept both)."""
    return jax.tree_util.tree_map(
        lambda x: jnp.asarray(x) if isinstance(x, np.ndarray) else x, tree, is_leaf=_is_tensor
    )
