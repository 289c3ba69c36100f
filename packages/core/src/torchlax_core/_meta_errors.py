"""PyTorch's own error for an op whose lowering failed inside JAX on arguments PyTorch refuses.

Lowerings compute; they do not repeat every argument check of PyTorch's kernels. Arguments
PyTorch refuses (shapes that do not broadcast, ``torch.ones(2) + torch.ones(3)``) then reach
JAX, which raises its own ``TypeError``/``ValueError`` ("add got incompatible shapes for
broadcasting"): the wrong exception type for code written against PyTorch, and a ``TypeError``
inside ``Tensor.__add__`` even turns into Python's "unsupported operand type(s)".

So when an op fails that way, PyTorch is asked whether it refuses the arguments: first its meta
kernel on meta tensors of the arguments' layouts (no data, no computing); only if that refuses
them, its CPU kernel on stand-ins of the same shapes and dtypes (broadcast zeros, no memory;
written arguments get real zeros), because the CPU kernel's message is the one users know
(the meta kernels of pointwise ops word a broadcast error differently). Only the failure path
pays for this.

The question never re-enters torchlax: every device argument is moved to ``meta`` or ``cpu``
with the tensors (``torch.eye(-2, device="jax")`` asked again with ``device="jax"`` would fail
in torchlax and ask again, without end), and a question asked while one is being answered on
this thread gets no answer (the original error stands).
"""

from __future__ import annotations

import re
import threading
from contextlib import contextmanager

import torch
from torch.utils._pytree import tree_leaves, tree_map

from ._errors import TorchlaxError
from ._registry import op_name

# Errors that say the meta kernel could not run, not that the arguments are wrong.
_META_LIMITATION = re.compile(
    r"meta tensor|data pointer|_local_scalar_dense|data-dependent|is_meta|on the meta device"
)


# A written argument is stood in for by real zeros up to this many elements (an in-place op on
# broadcast zeros would fail PyTorch's overlap check first); above it the meta kernel's error.
_MAX_WRITTEN_STAND_IN = 1 << 20


# The CPU kernel runs on stand-ins that the meta kernel accepted only up to this many elements
# in all: it then computes a result.
_MAX_CPU_PROBE = 1 << 20


def _elements(args, kwargs) -> int:
    leaves = tree_leaves((args, kwargs))
    return sum(x.numel() for x in leaves if isinstance(x, torch.Tensor))


# Set while this thread asks PyTorch: a torchlax op failing inside the question is not asked
# about in turn.
_asking = threading.local()


@contextmanager
def _question():
    _asking.active = True
    try:
        yield
    finally:
        _asking.active = False


def _moved(value, kind: str, *, device_arg: bool = False):
    """``value`` with a device (a ``torch.device``, or a string in a device argument) on ``kind``."""
    if isinstance(value, torch.device) or (device_arg and isinstance(value, str | int)):
        return torch.device(kind)
    return value


def _devices_on(func, args: tuple, kwargs: dict, kind: str) -> tuple[tuple, dict]:
    """``args``/``kwargs`` with every device argument of ``func`` on ``kind`` (meta or cpu)."""
    schema = func._schema.arguments
    device_args = {a.name for a in schema if "Device" in str(a.type)}
    positional = [a.name in device_args for a in schema if not a.kwarg_only]
    positional += [False] * (len(args) - len(positional))

    def moved(value, device_arg: bool):
        return tree_map(lambda x: _moved(x, kind, device_arg=device_arg), value)

    new_args = tuple(moved(a, d) for a, d in zip(args, positional, strict=False))
    new_kwargs = {k: moved(v, k in device_args) for k, v in kwargs.items()}
    return new_args, new_kwargs


def _as_meta(x):
    if not isinstance(x, torch.Tensor):
        return x
    return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")


# How a CPU kernel says it has no implementation for a dtype: "bitwise_and_cpu" not implemented
# for 'Float'. The meta kernels do not check dtypes this way.
_NO_DTYPE_KERNEL = "not implemented for '"


def _refused(func, args, kwargs, *, dtype_only: bool = False) -> BaseException | None:
    """The argument error ``func`` raises on these arguments, or ``None`` if it accepts them.

    ``dtype_only``: count only a kernel missing for a dtype (the arguments are stand-ins whose
    values could make the kernel raise for other reasons).
    """
    try:
        func(*args, **kwargs)
    except NotImplementedError as error:  # no kernel at all, or none for these dtypes
        return error if _NO_DTYPE_KERNEL in str(error) else None
    except (RuntimeError, IndexError, TypeError, ValueError) as error:
        if dtype_only or _META_LIMITATION.search(str(error)):
            return None
        return error
    except Exception:  # noqa: BLE001  only a question: the original error stands
        return None
    return None


def _cpu_stand_ins(func, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """CPU tensors of the arguments' shapes and dtypes; ``None`` if a written one is too big."""
    schema = func._schema
    written = {
        i if a.kwarg_only is False else a.name
        for i, a in enumerate(schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    }
    too_big = False

    def stand_in(x, write: bool):
        nonlocal too_big
        if not isinstance(x, torch.Tensor):
            return x
        if not write:
            return torch.zeros((), dtype=x.dtype).expand(x.shape)
        if x.numel() > _MAX_WRITTEN_STAND_IN:
            too_big = True
            return x
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype).zero_()

    cpu_args = tuple(
        tree_map(lambda x, w=i in written: stand_in(x, w), a) for i, a in enumerate(args)
    )
    cpu_kwargs = {
        k: tree_map(lambda x, w=k in written: stand_in(x, w), v) for k, v in kwargs.items()
    }
    return None if too_big else (cpu_args, cpu_kwargs)


def _asked(func, args: tuple, kwargs: dict) -> BaseException | None:
    """PyTorch's refusal of the arguments: the meta kernel's, then the CPU kernel's words."""
    error = _refused(
        func, *_devices_on(func, tree_map(_as_meta, args), tree_map(_as_meta, kwargs), "meta")
    )
    if error is None and _elements(args, kwargs) > _MAX_CPU_PROBE:
        return None  # the CPU kernel would compute in earnest: not worth it for a message
    stand_ins = _cpu_stand_ins(func, args, kwargs)
    if stand_ins is not None:
        # Where the meta kernel accepted, only a CPU kernel missing for the dtype is news.
        cpu_args, cpu_kwargs = _devices_on(func, *stand_ins, "cpu")
        error = _refused(func, cpu_args, cpu_kwargs, dtype_only=error is None) or error
    return error


def pytorch_error(func, args: tuple, kwargs: dict, exc: BaseException) -> BaseException | None:
    """The exception PyTorch raises for ``func(*args, **kwargs)`` where JAX raised ``exc``.

    ``None`` when ``exc`` is not a JAX argument error, or when PyTorch accepts the arguments
    (the failure is torchlax's or data-dependent: ``exc`` stands).
    """
    if not isinstance(exc, TypeError | ValueError) or isinstance(exc, TorchlaxError):
        return None
    if not isinstance(func, torch._ops.OpOverload) or getattr(_asking, "active", False):
        return None
    try:
        with _question():
            error = _asked(func, args, kwargs)
    except Exception:  # noqa: BLE001  arguments the question cannot be asked about: exc stands
        return None
    if error is None:
        return None
    try:
        return type(error)(f"{error} ({op_name(func)})")
    except TypeError:  # an exception type that takes other arguments
        return error
