"""The lock a compiled call holds while the state it reads and writes is in flux, and the
retry of an eager op that read such state from another thread meanwhile.

While ``torchlax.jit`` traces a step, the model's parameters hold JAX tracers; between a
compiled training step's launch and its write-back (``torchlax.jit``'s and the
``torch.compile`` backend's) they hold the arrays donated to it, which JAX deleted at the
launch. An op another thread runs on them then (an evaluation or checkpointing thread reading
the model) fails before it computes anything; ``run_op`` hands that error to
``retry_after_state_settles``, which waits until the call is done and runs the op again on
the state after it, so a reader sees the state before or after a step, never an error. The
thread holding the lock (the step itself) gets its errors as they are. The lock is taken only
by compiled calls, and waited for only on such an error.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import jax

from ._x64 import x64

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
    # (a launch whose argument another thread's program has just donated raises a ValueError:
    # "Invalid buffer passed to Execute() ...: Buffer has been deleted or donated")
    if isinstance(exc, RuntimeError | ValueError):
        message = str(exc)
        return any(
            words in message
            for words in ("has been deleted", "deleted or donated", "is being traced by JAX")
        )
    return False


# How long a reader waits for a compiled call (a first trace of a large model takes minutes).
_WAIT_SECONDS = 600.0

#: What ``retry_after_state_settles`` returns where it did not run the op again, or where the
#: second run failed too (the first error then stands).
NOT_RETRIED = object()


def retry_after_state_settles(exc: Exception, impl: Callable, args: tuple, kwargs: dict) -> Any:
    """``impl(args, kwargs)`` again once no compiled call holds the state, where ``exc`` (what
    its first run raised) says it read state in flux; else ``NOT_RETRIED``."""
    if not _read_in_flux(exc) or state_lock._is_owned():  # pyright: ignore[reportAttributeAccessIssue]  (CPython's RLock has it)
        return NOT_RETRIED
    # Bounded: a call that never released the lock (an interrupt landing exactly at a ``with``
    # statement's exit skips its ``__exit__``) must not hang every reader: the first error
    # then stands.
    if not state_lock.acquire(timeout=_WAIT_SECONDS):
        return NOT_RETRIED
    try:
        with x64():  # (no call runs while the op runs again: it reads settled state)
            return impl(args, kwargs)
    except Exception:
        return NOT_RETRIED
    finally:
        state_lock.release()
