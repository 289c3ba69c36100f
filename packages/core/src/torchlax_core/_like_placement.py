"""``zeros_like(x)`` and its kin land where ``x`` is, as PyTorch's land on ``x``'s device.

A ``*_like`` op (and ``new_*``) builds its result from ``x``'s shape alone, so JAX would put it
uncommitted on the default device even when ``x`` is sharded over a mesh: an optimizer's
``zeros_like(param)`` state would then sit whole on device 0. Here, when ``x`` is a committed
array, the result takes ``x``'s sharding (a ``new_*`` result of another shape: replicated over
``x``'s devices). The fills are computed straight into that sharding (one jitted fill per
op, arguments and sharding; no device ever holds more than its shard); the random ones are
drawn as eagerly (the same numbers as for an unsharded ``x``) and then laid out.
Uncommitted and traced inputs take the ordinary path.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import torch
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

from ._tensor import Tensor
from ._unwrap import _ArrayImpl

aten = torch.ops.aten

_FILLS = frozenset(
    {
        aten.zeros_like.default,
        aten.ones_like.default,
        aten.full_like.default,
        aten.empty_like.default,
        aten.new_zeros.default,
        aten.new_ones.default,
        aten.new_full.default,
        aten.new_empty.default,
        aten.new_empty_strided.default,
    }
)
_RANDOM = frozenset(
    {
        aten.rand_like.default,
        aten.rand_like.generator,
        aten.randn_like.default,
        aten.randn_like.generator,
        aten.randint_like.default,
        aten.randint_like.generator,
        aten.randint_like.low_dtype,
        aten.randint_like.low_generator_dtype,
        aten.randint_like.Tensor,
        aten.randint_like.Tensor_generator,
    }
)
LIKE_OPS = _FILLS | _RANDOM


def placed_lowering(func, fn: Callable) -> Callable:
    """``fn`` (``func``'s lowering) with its result laid out like its first argument when that
    is a committed array; called with unwrapped, concrete arrays."""
    random = func in _RANDOM

    def placed(src, *args, **kwargs):
        target = _target(src, func, args)
        if target is None:
            return fn(src, *args, **kwargs)
        if not random:
            try:
                key = (_hashable(args), _hashable(tuple(kwargs.items())))
            except TypeError:
                key = None  # an argument jit cannot key on: filled whole, then laid out
            if key is not None:
                return _fill_jit(fn, *key, target)(src)
        return jax.device_put(fn(src, *args, **kwargs), target)

    return placed


def source_is_committed(args) -> bool:
    """Whether the call's first argument is a torchlax Tensor over a committed array."""
    src = args[0] if args else None
    if type(src) is not Tensor:
        return False
    array = src._storage.array
    return type(array) is _ArrayImpl and array.committed


def _target(src, func, args):
    """Where the result goes: ``src``'s sharding, or for a ``new_*`` result of another shape
    the same devices, replicated (None: the ordinary path)."""
    if type(src) is not _ArrayImpl or not src.committed:
        return None
    sharding = src.sharding
    if func in _FILLS and func.name().startswith("aten::new_") and tuple(args[0]) != src.shape:
        if isinstance(sharding, NamedSharding):
            return NamedSharding(sharding.mesh, PartitionSpec(), memory_kind=sharding.memory_kind)
        return sharding if isinstance(sharding, SingleDeviceSharding) else None
    return sharding


def _hashable(value):
    """``value`` with its lists made tuples; ``TypeError`` when a part cannot be hashed."""
    if isinstance(value, list | tuple):
        return tuple(_hashable(v) for v in value)
    hash(value)
    return value


@functools.lru_cache(maxsize=256)
def _fill_jit(fn, args: tuple, kwargs: tuple, target) -> Callable:
    """The fill ``fn(src, *args, **kwargs)`` compiled to write its result in ``target``."""
    return jax.jit(lambda src: fn(src, *args, **dict(kwargs)), out_shardings=target)
