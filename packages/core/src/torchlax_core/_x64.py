"""JAX's 64-bit mode, switched in one place.

torchlax keeps int64 and float64 data as PyTorch does; outside its 64-bit ("x64") mode JAX
narrows them to int32/float32 silently, in ``jnp`` calls, ``device_put``, random keys, traces
and compiles alike. So everything torchlax does with arrays runs inside ``x64()``; nothing else
in torchlax names JAX's flag (``tests/core/test_x64.py`` greps for it).

JAX's flag is thread-local when switched this way: ``x64()`` turns it on for the calling thread
only, for the block, and restores what was there on exit (nested blocks included). Other
threads, and plain JAX code outside the block, are unaffected. ``set_x64_globally`` is the one
process-wide switch (for ``torchlax.enable_globally``).

At the bottom of the core: it imports no other core module. Siblings use it through
``torchlax_core.internal``.
"""

from __future__ import annotations

import contextlib
from typing import Any

import jax
from jax._src.config import enable_x64 as _flag

x64_flag = _flag
"""JAX's 64-bit flag: ``x64_flag.value`` is this thread's setting. Hot paths read it before
``with x64():`` so that, already inside 64-bit mode (``torchlax.enable()``), an op pays one
attribute read: ``if x64_flag.value: return run() / with x64(): return run()``."""


def x64() -> contextlib.AbstractContextManager[Any]:
    """Turn JAX's 64-bit mode on in this thread for a ``with`` block.

    On exit the thread's previous setting comes back, so nested blocks and callers that had it
    on or off are left as they were. Other threads are not affected. Inside the block the mode
    stays on even if the process-wide default changes meanwhile (``disable_globally``).
    """
    return _flag(True)


def no_x64() -> contextlib.AbstractContextManager[Any]:
    """Turn JAX's 64-bit mode off in this thread for a ``with`` block: for JAX code written for
    32-bit mode that breaks in 64-bit mode (Pallas kernels' index arithmetic), called from
    inside an op (which runs in 64-bit mode). Restored on exit, as ``x64()``."""
    return _flag(False)


def set_x64_globally(on: bool) -> bool:
    """Set JAX's process-wide 64-bit default (threads inside ``x64()`` keep theirs); return the
    previous default, for restoring it."""
    before = bool(_flag.get_global())
    jax.config.update(_flag.name, on)  # through jax.config: it also runs JAX's update hooks
    return before
