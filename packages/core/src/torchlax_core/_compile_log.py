"""What torchlax tells the user about tracing and compiling: log lines and a progress line.

Every compiled program (``torchlax.jit``, the ``torch.compile`` backend, export) traces and
compiles through ``_compiled.CompiledProgram``, which reports here:

- ``traced``: a new input signature was traced (``torchlax`` logger, INFO). When the program
  already had signatures, why it retraces, input by input against the most recent one
  (``recompiles``: PyTorch's artifact, so ``TORCH_LOGS=recompiles`` shows it next to
  Dynamo's own recompile reasons).
- ``compiling``: around an XLA compilation. It tells a compile from a hit of JAX's persistent
  compilation cache (``_compilation_cache.py``) by JAX's public monitoring events, and on a
  terminal shows a progress line while a compilation runs longer than
  ``TORCHLAX_COMPILE_PROGRESS`` seconds (default 5; ``off`` hides it).

``graph_break`` is the line for code that leaves a compiled program to run eagerly
(PyTorch's ``graph_breaks`` artifact and the ``torchlax`` logger).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, TextIO

import jax
import jax.monitoring

from ._logging import artifact_logger, get_logger

_log = get_logger()
_PROGRESS_ENV = "TORCHLAX_COMPILE_PROGRESS"
_DEFAULT_PROGRESS_AFTER = 5.0

# JAX records these (jax.monitoring, public) on the compiling thread for each compilation
# that may use the persistent cache; counted per thread so concurrent compiles don't mix.
_REQUEST = "/jax/compilation_cache/compile_requests_use_cache"
_HIT = "/jax/compilation_cache/cache_hits"
_counts = threading.local()
_listening = False
_listening_lock = threading.Lock()


def _on_event(event: str, **_: Any) -> None:
    if event == _HIT:
        _counts.hits = getattr(_counts, "hits", 0) + 1
    elif event == _REQUEST:
        _counts.requests = getattr(_counts, "requests", 0) + 1


def _listen() -> None:
    global _listening
    with _listening_lock:
        if not _listening:
            jax.monitoring.register_event_listener(_on_event)
            _listening = True


def persistent_cache_counts() -> tuple[int, int]:
    """``(requests, hits)`` of JAX's persistent compilation cache on this thread so far
    (counted from the first torchlax compilation on)."""
    _listen()
    return getattr(_counts, "requests", 0), getattr(_counts, "hits", 0)


def describe_aval(value: Any) -> str:
    """``float32[4,8]`` for an array (or anything with shape and dtype), ``repr`` otherwise."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is None or dtype is None:
        return repr(value)
    weak = " (weak type)" if getattr(value, "weak_type", False) else ""
    return f"{dtype}[{','.join(map(str, shape))}]{weak}"


def signature_change(before: Sequence[Any], after: Sequence[Any]) -> str:
    """Which inputs differ between two signatures (each a sequence of per-input avals)."""
    if len(before) != len(after):
        return f"the number of array inputs changed from {len(before)} to {len(after)}"
    changed = [
        f"input {i}: {describe_aval(a)} -> {describe_aval(b)}"
        for i, (a, b) in enumerate(zip(before, after, strict=True))
        if a != b
    ]
    if not changed:
        return "the array inputs are the same; a static part of the call changed"
    shown = "; ".join(changed[:8])
    more = f"; and {len(changed) - 8} more" if len(changed) > 8 else ""
    return shown + more


def avals_of(args: Any) -> tuple:
    """The per-input avals (shape, dtype, weak type) of a pytree of arrays."""
    return tuple(
        jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=getattr(a, "weak_type", False))
        if hasattr(a, "shape") and hasattr(a, "dtype")
        else a
        for a in jax.tree.leaves(args)
    )


def traced(name: str, seconds: float, avals: tuple, previous: tuple | None, count: int) -> None:
    """Log the trace of a new signature of program ``name`` (its ``count``-th); ``previous``:
    the avals of the signature it had traced last (None for its first)."""
    if previous is None:
        _log.info("traced %s in %.3f s", name, seconds)
        return
    why = signature_change(previous, avals)
    _log.info("traced %s again (signature %d) in %.3f s: %s", name, count, seconds, why)
    artifact_logger("recompiles").debug("torchlax recompiling %s: %s", name, why)


def graph_break(where: str, why: str) -> None:
    """Log code that leaves a compiled program to run eagerly (op by op)."""
    _log.info("%s runs eagerly: %s", where, why)
    artifact_logger("graph_breaks").debug("torchlax graph break in %s: %s", where, why)


def _progress_after(value: str | None = None) -> float | None:
    value = os.environ.get(_PROGRESS_ENV, "") if value is None else value
    value = value.strip().lower()
    if not value:
        return _DEFAULT_PROGRESS_AFTER
    if value in ("off", "0", "false", "no", "never"):
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        return _DEFAULT_PROGRESS_AFTER


class _Progress:
    """A line on a terminal, rewritten in place each second while a compilation runs."""

    def __init__(self, name: str, stream: TextIO, after: float, every: float = 1.0):
        self.name, self.stream, self.after, self.every = name, stream, after, every
        self.start = time.monotonic()
        self.done = threading.Event()
        self.shown = False
        self.thread = threading.Thread(target=self._show, name="torchlax-compile-progress")
        self.thread.daemon = True
        self.thread.start()

    def _show(self) -> None:
        if self.done.wait(self.after):
            return
        while True:
            elapsed = time.monotonic() - self.start
            self.stream.write(f"\r[torchlax] compiling {self.name} ... {elapsed:.0f} s")
            self.stream.flush()
            self.shown = True
            if self.done.wait(self.every):
                return

    def stop(self) -> None:
        self.done.set()
        self.thread.join()
        if self.shown:
            elapsed = time.monotonic() - self.start
            self.stream.write(f"\r[torchlax] compiled {self.name} in {elapsed:.1f} s\n")
            self.stream.flush()


class Compilation:
    """What ``compiling`` learned: the time and whether JAX's persistent cache served it."""

    __slots__ = ("name", "seconds", "cache_hit")

    def __init__(self, name: str):
        self.name, self.seconds, self.cache_hit = name, 0.0, False


@contextlib.contextmanager
def compiling(
    name: str,
    *,
    level: int | None = logging.INFO,
    stream: TextIO | None = None,
    progress_after: float | None = -1.0,
) -> Iterator[Compilation]:
    """Around one XLA compilation of ``name``: time it, tell a persistent-cache hit, log it at
    ``level`` (None: not at all, the caller logs), and show a progress line on a terminal
    while it runs long.

    ``stream`` (default: ``sys.stderr``) gets the progress line only if it is a terminal;
    ``progress_after`` (default: ``TORCHLAX_COMPILE_PROGRESS``) is the delay before it shows,
    None for never."""
    stream = sys.stderr if stream is None else stream  # (None under pythonw)
    after = _progress_after() if progress_after == -1.0 else progress_after
    progress = None
    if after is not None and stream is not None and _is_terminal(stream):
        progress = _Progress(name, stream, after)
    requests, hits = persistent_cache_counts()
    result = Compilation(name)
    start = time.perf_counter()
    try:
        yield result
    finally:
        result.seconds = time.perf_counter() - start
        if progress is not None:
            progress.stop()
    new_requests, new_hits = persistent_cache_counts()
    result.cache_hit = new_hits > hits and new_requests - requests == new_hits - hits
    if level is None:
        return
    if result.cache_hit:
        _log.log(
            level,
            "loaded %s from the persistent compilation cache in %.3f s (cache hit)",
            name,
            result.seconds,
        )
    else:
        _log.log(level, "XLA compiled %s in %.3f s", name, result.seconds)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False
