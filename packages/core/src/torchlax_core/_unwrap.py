"""An op's arguments in and its results out: torchlax Tensors to what a lowering sees (arrays),
a lowering's arrays back to Tensors.

An unwrapper (``_make_unwrapper``) is specialised to its op's schema: it unwraps only the
argument positions the schema types as tensors (an "unwrap plan"), accepts what PyTorch lets
stay on the CPU (a 0-d tensor as a scalar, the tensors of an index list), and refuses a tensor
of another device, or tensors on two jax devices, with ``DeviceMismatchError``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.core
import jax.numpy as jnp
import torch

from . import _opcache, _tensor
from ._dtypes import jax_dtype
from ._errors import DeviceMismatchError
from ._registry import op_name
from ._tensor import Tensor, _from_cpu, _make
from ._x64 import x64, x64_flag

_ArrayImpl = type(jnp.zeros(()))
_JAX_DTYPES = {t: jax_dtype(t) for t in _tensor._DTYPES.values()}


# -- unwrapping and wrapping --------------------------------------------------------------------


class _ForeignTensor(Exception):
    def __init__(self, tensor, position):
        self.tensor = tensor
        self.position = position


def _unwrap(x, position=None):
    """Any argument value -> what a lowering sees (arrays for tensors, recursively in lists)."""
    if isinstance(x, Tensor):
        return x._value()
    if isinstance(x, torch.Tensor):
        # PyTorch lets a 0-d CPU tensor act as a scalar next to tensors on any device.
        if x.dim() == 0 and x.device.type == "cpu":
            return _from_cpu(x)
        raise _ForeignTensor(x, position)
    if type(x) is list or type(x) is tuple:
        return type(x)(_unwrap(y, position) for y in x)
    return x


def _unwrap_deferring(x, position):
    """``_unwrap`` of one tensor of a list argument, a deferred view as ``_opcache.Pending``."""
    if type(x) is Tensor:
        view = x._view
        if view is not None and view.seen is None:
            return _opcache.Pending(x, x._storage.array, view.compute, view.compute.recipe)
    return _unwrap(x, position)


def _wrap(x):
    """A lowering's result -> Tensors (recursively in lists and tuples)."""
    if type(x) is _ArrayImpl or isinstance(x, jax.Array):
        return _make(x)
    if type(x) is list or type(x) is tuple:
        return type(x)(_wrap(y) for y in x)
    return x


def _is_tensor_type(t) -> bool:
    if isinstance(t, torch.TensorType):
        return True
    if isinstance(t, torch.OptionalType | torch.ListType):
        return _is_tensor_type(t.getElementType())
    return False


def _unwrap_plan(func) -> tuple[tuple[int, ...], bool]:
    """(positions of tensor-typed arguments, whether any kwarg-only argument is a tensor)."""
    schema = getattr(func, "_schema", None)
    if schema is None:  # not an ATen overload: look at everything
        return (), True
    positions = tuple(
        i for i, a in enumerate(schema.arguments) if not a.kwarg_only and _is_tensor_type(a.type)
    )
    tensor_kwargs = any(a.kwarg_only and _is_tensor_type(a.type) for a in schema.arguments)
    return positions, tensor_kwargs


def release(args) -> None:
    """Clear the exclusivity of every torchlax Tensor in ``args`` (see ``_tensor._Storage``):
    for an op whose lowering runs plainly, which may return an input's array unchanged."""
    for a in args:
        if type(a) is Tensor or isinstance(a, Tensor):
            a._storage.exclusive = False
        elif type(a) is list or type(a) is tuple:
            release(a)


def _make_unwrapper(func, defer_views: bool = False) -> Callable:
    """``unwrap(args, kwargs) -> (arrays, kwargs)`` specialised to ``func``'s schema.

    On the hot path: one call, no helper calls for a plain Tensor argument. With
    ``defer_views`` (cached ops) a deferred view not computed yet comes as ``_opcache.Pending``.
    It reads arrays without handing them out (``_peek``): the caller decides (``release``).
    """
    positions, tensor_kwargs = _unwrap_plan(func)
    by_schema = getattr(func, "_schema", None) is not None
    cpu_index_positions = _cpu_index_positions(func)
    several_devices = _several_devices()  # fixed for the process once JAX has started

    def unwrap(args, kwargs):
        try:
            if by_schema:
                jargs = list(args)
                n = len(jargs)
                for i in positions:
                    if i >= n:
                        break
                    a = jargs[i]
                    if type(a) is Tensor:
                        view = a._view
                        if view is None:
                            jargs[i] = a._storage.array
                        elif defer_views and view.seen is None:
                            jargs[i] = _opcache.Pending(
                                a, a._storage.array, view.compute, view.compute.recipe
                            )
                        else:
                            jargs[i] = a._peek()
                    elif defer_views and type(a) is list:  # cat's tensors
                        jargs[i] = [_unwrap_deferring(x, i) for x in a]
                    elif a is not None:
                        jargs[i] = _unwrap(a, i)
            else:  # not an ATen overload: look at everything
                jargs = [_unwrap(a, i) for i, a in enumerate(args)]
            if kwargs and tensor_kwargs:
                kwargs = {k: _unwrap(v, k) for k, v in kwargs.items()}
        except _ForeignTensor as exc:
            if exc.position in cpu_index_positions:
                args = list(args)
                args[exc.position] = [
                    _from_cpu(t) if _is_cpu_tensor(t) else t for t in args[exc.position]
                ]
                return unwrap(args, kwargs)
            raise _foreign_tensor_error(func, exc) from None
        if several_devices:
            _check_one_device(func, args, positions)
        return jargs, kwargs

    return unwrap


@functools.cache
def _several_devices() -> bool:
    return jax.device_count() > 1


def _check_one_device(func, args, positions) -> None:
    """PyTorch's rule for ``jax:0 + jax:1``: tensors of one op must be on one device (JAX would
    quietly compute on one of them). Only single-device arrays are compared: a sharded array
    spans devices by design."""
    first = None
    for i in positions or range(len(args)):
        if i >= len(args):
            break
        for a in args[i] if type(args[i]) in (list, tuple) else (args[i],):  # cat's tensors
            if type(a) is not Tensor:
                continue
            if first is None:
                first = (i, a)
            elif a.device != first[1].device and _single_device(a) and _single_device(first[1]):
                _raise_mismatch(func, first, (i, a))


def _raise_mismatch(func, first, second) -> None:
    schema = func._schema.arguments if getattr(func, "_schema", None) else None
    names = [
        f"argument '{schema[k].name}'" if schema and k < len(schema) else f"argument {k}"
        for k in (first[0], second[0])
    ]
    raise DeviceMismatchError(
        f"{op_name(func)} got tensors on different devices: {first[1].device} as {names[0]} "
        f"and {second[1].device} as {names[1]}. Expected all tensors to be on the same device: "
        "move one first, e.g. with tensor.to(other.device)."
    )


def _single_device(t) -> bool:
    array = t._storage.array
    return not isinstance(array, jax.core.Tracer) and len(array.devices()) == 1


def _cpu_index_positions(func) -> frozenset[int]:
    """Arguments PyTorch lets stay on the CPU next to tensors on any device: ``x[cpu_index]``."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return frozenset()
    return frozenset(
        i
        for i, a in enumerate(schema.arguments)
        if a.name == "indices" and isinstance(a.type, torch.ListType)
    )


def _is_cpu_tensor(t) -> bool:
    return isinstance(t, torch.Tensor) and not isinstance(t, Tensor) and t.device.type == "cpu"


def _foreign_tensor_error(func, exc: _ForeignTensor) -> DeviceMismatchError:
    arg = "an argument"
    schema = getattr(func, "_schema", None)
    if (
        schema is not None
        and isinstance(exc.position, int)
        and exc.position < len(schema.arguments)
    ):
        arg = f"argument '{schema.arguments[exc.position].name}'"
    elif isinstance(exc.position, str):
        arg = f"argument '{exc.position}'"
    return DeviceMismatchError(
        f"{op_name(func)} got a tensor on device {exc.tensor.device} as {arg}, next to torchlax "
        "Tensors on device jax. Only 0-d CPU tensors mix with jax tensors (as scalars). Move it "
        "first with tensor.to('jax') inside torchlax.enable(), or torchlax.from_torch(tensor)."
    )


def _call(fn, jargs, jkwargs):
    """Run a lowering with JAX's 64-bit mode on (entering it only when it is off).

    Implementations run under ``_run.run_op``, which turns the mode on; this is for what runs
    later, outside any op: a view recomputing itself from its storage when read.
    """
    if x64_flag.value:
        return fn(*jargs, **jkwargs)
    with x64():
        return fn(*jargs, **jkwargs)
