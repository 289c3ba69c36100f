"""A compiled call's launch and write-back, all or nothing.

A training step's program consumes the state it is given (its arrays are donated) and
returns the new state; until that is written back, the model and optimizer hold deleted
arrays. So once the launch has returned, the write-back is finished whatever happens: an
exception or ``KeyboardInterrupt`` arriving in it (or between the launch and it) writes the
whole new state again (the writes are idempotent assignments) before it propagates, and a
Ctrl-C that arrives during the launch and write-back is held until they are done. Before the
launch, nothing of the state has changed but what ``undo`` puts back. Afterwards the model
and optimizer hold either the values before the call or those after it (#37, item 2).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import Any

# The C module behind ``signal`` (no stubs): its getsignal/signal cost ~0.3 us a call against
# tens of us of ``signal``'s (which convert handlers to and from enums), on every step's call.
_signal: Any = importlib.import_module("_signal")

_main_thread = threading.main_thread()
_SIGINT = 2


class _HeldInterrupts:
    """Holds SIGINT while entered (on the main thread, where Python runs signal handlers) and
    delivers it on exit, to the handler that was installed before."""

    __slots__ = ("_previous", "_caught")

    def __enter__(self) -> _HeldInterrupts:
        self._caught: tuple | None = None
        self._previous = None
        if threading.current_thread() is _main_thread:
            previous = _signal.getsignal(_SIGINT)
            if callable(previous):  # (SIG_IGN / SIG_DFL, or a handler set from C: left alone)
                self._previous = previous
                _signal.signal(_SIGINT, self._catch)
        return self

    def _catch(self, signum, frame) -> None:
        self._caught = (signum, frame)

    def __exit__(self, *exc_info) -> None:
        previous = self._previous
        if previous is None:
            return
        _signal.signal(_SIGINT, previous)
        caught = self._caught
        if caught is not None:
            previous(*caught)  # Python's default handler raises KeyboardInterrupt here


def launch_and_write(
    launch: Callable[[list], None],
    write: Callable[[Any], None],
    undo: Callable[[], None] | None = None,
) -> Any:
    """The results that ``launch(out)`` appends to ``out`` (in the statement that launches:
    nothing can interrupt it between the two), written with ``write(results)``; all or
    nothing.

    ``write`` must be safe to run twice (the second run completes an interrupted first).
    ``undo`` puts back what was changed before the launch, if the launch does not happen."""
    out: list = []
    with _HeldInterrupts():
        try:
            launch(out)
            write(out[0])
        except BaseException:
            if out:
                write(out[0])  # the launch consumed the old state: finish the new one
            elif undo is not None:
                undo()
            raise
    return out[0]
