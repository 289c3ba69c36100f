"""Checks of values PyTorch rejects (an index out of range, a negative probability, ...).

One primitive serves every lowering: ``check(pred, IndexError, "index {index} is out of ...",
index=...)``. Eagerly the values are concrete, so a failed check raises PyTorch's exception at
once (reading ``pred`` is a device-to-host sync). While tracing (``jax.jit``, ``torchlax.jit``,
``torch.compile``, export) XLA cannot raise: inside a program wrapped by ``checked(fn)`` the
check is recorded with ``jax.experimental.checkify`` and ``raise_error`` raises it after the
call; anywhere else it records nothing, and the op returns JAX's clamped or filled values.
``Config.checked`` (env ``TORCHLAX_CHECKS=1``) tells the program builders to wrap.
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import Callable
from typing import Any

import jax
import jax.core
import jax.numpy as jnp
from jax.experimental import checkify

# Set while ``checked`` traces a program: only then may a traced check become a checkify check
# (one staged outside ``checkify.checkify`` would fail the trace).
_recording: contextvars.ContextVar[bool] = contextvars.ContextVar("torchlax_checks", default=False)

# Set while a check reads values on the host (eagerly): the op cache counts such reads apart
# from a lowering's own, which would mark the op as never cacheable (``_opcache.run_probed``).
_reading: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "torchlax_check_reading", default=False
)


def reading_values() -> bool:
    """Whether the current host read is made by a value check (``check``, ``check_index``)."""
    return _reading.get()


# Exception types seen by a recorded check, by the tag its message carries.
_EXCEPTIONS: dict[str, type[BaseException]] = {
    cls.__name__: cls for cls in (IndexError, RuntimeError, ValueError, NotImplementedError)
}
_TAGGED = re.compile(r"\A\[torchlax:([\w.]+)\] (.*?)(?: \(`check` failed\))?\Z", re.S)


def is_concrete(x: Any) -> bool:
    """Whether ``x`` holds values now (not a tracer of a JAX transform)."""
    return not isinstance(x, jax.core.Tracer)


def check(pred: Any, exc_type: type[BaseException], message: str, **values: Any) -> None:
    """Require ``pred`` (a Python bool or a scalar bool array) to hold.

    ``message`` is formatted with ``values`` (arrays, numbers, or zero-argument callables that
    compute them, called only when needed) as ``message.format(**values)``.
    """
    if not is_concrete(pred):
        if _recording.get():
            tag = _tag(exc_type)
            checkify.check(
                pred,
                f"[torchlax:{tag}] {message}",
                **{k: jnp.asarray(_value(v)) for k, v in values.items()},  # pyright: ignore[reportArgumentType]  (format values; none is named debug)
            )
        return
    token = _reading.set(True)
    try:
        if not bool(pred):
            raise exc_type(message.format(**{k: _python(_value(v)) for k, v in values.items()}))
    finally:
        _reading.reset(token)


@jax.jit
def _first_outside(index, low, high):
    flat = jnp.ravel(index)
    outside = (flat < low) | (flat >= high)
    return jnp.any(outside), flat[jnp.argmax(outside)]


def check_index(
    index: Any, low: int, high: int, exc_type: type[BaseException], message: str
) -> None:
    """Require every value of integer array ``index`` to lie in ``[low, high)``.

    ``message`` may name the first offending value as ``{index}``. Eagerly this costs one fused
    min/max-like pass and one device-to-host read of two scalars.
    """
    if index is None or getattr(index, "size", 1) == 0:
        return
    index = jnp.asarray(index)
    if not is_concrete(index):
        if _recording.get():
            outside, first = _first_outside(index, low, high)
            check(~outside, exc_type, message, index=first)
        return
    outside, first = _first_outside(index, low, high)
    if not is_concrete(outside):  # a constant index inside a trace: the jitted check is staged
        if _recording.get():
            check(~outside, exc_type, message, index=first)
        return
    token = _reading.set(True)
    try:
        outside, first = jax.device_get((outside, first))
    finally:
        _reading.reset(token)
    if outside:
        raise exc_type(message.format(index=int(first)))


_INT64_MAX = 2**63 - 1


def check_sizes(size: Any, itemsize: int) -> None:
    """PyTorch's checks of a new tensor's sizes, before XLA sees them (an overflowing shape
    aborts XLA's process instead of raising). Symbolic sizes (shape polymorphism) pass."""
    dims = list(size)
    nbytes = itemsize
    for d in dims:
        if not isinstance(d, int):
            return
        if d < 0:
            raise RuntimeError(f"Trying to create tensor with negative dimension {d}: {dims}")
        nbytes *= d
    if nbytes > _INT64_MAX:
        raise RuntimeError(f"Storage size calculation overflowed with sizes={dims}")


def checked(fn: Callable) -> Callable:
    """``fn`` made to return ``(error, outputs)``: its traced checks recorded by checkify.

    Trace and compile the result like ``fn`` (``jax.jit(checked(fn))``), then pass ``error``
    to ``raise_error`` after each call, before using or writing back the outputs.
    """

    def recording(*args, **kwargs):
        token = _recording.set(True)
        try:
            return fn(*args, **kwargs)
        finally:
            _recording.reset(token)

    return checkify.checkify(recording)


def raise_error(error: Any) -> None:
    """Raise the first check ``error`` recorded as the exception PyTorch raises (else nothing)."""
    if error is None:
        return
    message = error.get()
    if message is None:
        return
    match = _TAGGED.match(message.strip())
    if match is None:  # a checkify check of the user's own
        raise RuntimeError(message)
    raise _EXCEPTIONS.get(match.group(1), RuntimeError)(match.group(2))


def _tag(exc_type: type[BaseException]) -> str:
    tag = (
        exc_type.__name__
        if exc_type.__module__ == "builtins"
        else (f"{exc_type.__module__}.{exc_type.__qualname__}")
    )
    _EXCEPTIONS.setdefault(tag, exc_type)
    return tag


def _value(v):
    return v() if callable(v) else v


def _python(v):
    return v.item() if hasattr(v, "item") else v
