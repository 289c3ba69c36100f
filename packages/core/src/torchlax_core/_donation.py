"""The window in which a compiled program's donated arrays are deleted and not yet replaced.

A program that updates state in place is given (donated) the state's arrays: JAX deletes them
when it launches the run, and the caller writes the run's new arrays into the same tensors
after it. An eager op on another thread (an evaluation thread, a checkpoint writer reading the
model) that took one of those arrays just before the launch then fails with JAX's "Array has
been deleted" (or "Buffer has been deleted or donated"). The caller holds ``window`` from the
launch until its write-back is done; ``run_op``, given that error, waits for the window to
close and runs the op once more on what the tensors hold then (the new state), so a reader
sees the state before or after a step, never an error. The lock is taken only by callers that
donate, and waited for only on that error.
"""

from __future__ import annotations

import threading

#: Held by a caller of a donating program from its launch until the new arrays are written.
window = threading.RLock()

_DELETED = ("has been deleted", "deleted or donated")


def read_a_donated_array(exc: BaseException) -> bool:
    """Whether ``exc`` is JAX refusing an array deleted by donation."""
    if not isinstance(exc, RuntimeError | ValueError):
        return False
    message = str(exc)
    return any(words in message for words in _DELETED)


def wait_for_write_backs() -> None:
    """Return once no donating program is between its launch and its write-back."""
    with window:
        pass
