"""The lock a compiled call holds while the state it reads and writes is in flux, and the
retry of an eager op that read such state from another thread meanwhile.

While ``torchlax.jit`` traces a step, the model's parameters hold JAX tracers; between a
training step's launch and its write-back they hold the arrays donated to it (deleted). An
op another thread runs on them then (an evaluation or checkpointing thread reading the model)
fails before it computes anything; ``retry_after_state_settles`` waits until the call is done
and runs the op again on the state after it, so a reader sees the state before or after a
step, never an error (#37, item 5). The thread holding the lock (the step itself) gets its
errors as they are.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import jax

# Held by torchlax.jit's calls (and traces); re-entrant: a step's code may call another
# jitted function.
state_lock = threading.RLock()


def _read_in_flux(exc: BaseException) -> bool:
    """Whether ``exc`` is what reading state that another thread's call holds raises: a
    tracer of its trace, or an array donated to its program."""
    if isinstance(exc, (jax.errors.UnexpectedTracerError, jax.errors.ConcretizationTypeError)):
        return True
    if isinstance(exc, jax.errors.JaxRuntimeError):
        return "deleted or donated" in str(exc)
    if isinstance(exc, RuntimeError):
        message = str(exc)
        return "has been deleted" in message or "is being traced by JAX" in message
    return False


def retry_after_state_settles(exc: Exception, op: Callable[[], Any]) -> Any:
    """``op()`` again once no compiled call holds the state, where ``exc`` (what its first run
    raised) says it read state in flux; else ``exc`` is raised."""
    if not _read_in_flux(exc) or state_lock._is_owned():  # pyright: ignore[reportAttributeAccessIssue]  (CPython's RLock has it)
        raise exc
    with state_lock:  # (no call runs while the op runs again: it reads settled state)
        try:
            return op()
        except Exception:
            raise exc from None
