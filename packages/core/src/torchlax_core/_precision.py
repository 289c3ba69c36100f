"""PyTorch's float32 matmul precision as lowerings read it, and which traces read it.

``torch.set_float32_matmul_precision`` ("highest", "high", "medium") decides how float32
products and convolutions are computed; a lowering reads it when it is traced
(``float32_matmul_precision``), so a compiled executable holds the mode of its trace. Every
cache that keeps an executable across calls must then tell the modes apart:

- the eager op cache keys an op's signatures on the mode once a trace of that op read it
  (``_opcache.Op.context``; reading PyTorch's mode costs ~0.4 us, too much for every hit of
  every op);
- compiled programs (``torchlax.jit``, the ``torch.compile`` backend, export) key each
  signature on it (``_compiled.CompiledProgram.entry``), and an entry whose trace read it is
  ``stale`` once the mode changed, for callers that repeat an entry without looking it up.

``recording()`` says whether the code traced in its block read the mode (PyTorch's own
``torch.compile`` guards only on ``allow_tf32``, so "high" and "medium" share its graphs).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

_active = threading.local()  # .reads: this thread's innermost Reads while recording

_get_mode = torch.get_float32_matmul_precision


class Reads:
    """What the code traced in one ``recording()`` block read: the mode, or None."""

    __slots__ = ("precision",)

    def __init__(self):
        self.precision: str | None = None


def float32_matmul_precision() -> str:
    """``torch.get_float32_matmul_precision()``, noted in this thread's ``recording()``."""
    mode = _get_mode()
    reads = getattr(_active, "reads", None)
    if reads is not None:
        reads.precision = mode
    return mode


def current_precision() -> str:
    """The mode now, not noted anywhere (a cache key's part)."""
    return _get_mode()


def dtype_and_precision() -> tuple:
    """The last part of an op cache key for an op whose lowering reads the mode: the default
    dtype (as every key has) and the mode."""
    return (torch.get_default_dtype(), _get_mode())


@contextlib.contextmanager
def recording() -> Iterator[Reads]:
    """Note whether the code run in the block (this thread) reads the mode; a read also
    counts for an enclosing block (a program traced inside another's trace)."""
    outer = getattr(_active, "reads", None)
    reads = _active.reads = Reads()
    try:
        yield reads
    finally:
        _active.reads = outer
        if outer is not None and reads.precision is not None:
            outer.precision = reads.precision
