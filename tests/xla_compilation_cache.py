"""One persistent XLA compilation cache shared by every process of a test run.

Most of the suite's time is XLA compiling small programs, and its processes compile many of the
same ones: both pytest-xdist workers (an eager OpInfo test compiles one program per primitive
and shape it runs, and the harness's own conversions repeat across ops) and the fresh Python
processes tests start (each compiles from nothing). JAX's persistent compilation cache lets a
process load what another one compiled instead of compiling it again.

Why it cannot change what a test sees: JAX keys an entry on the whole program, the compile
options, the XLA flags, the devices and the jax/jaxlib versions, and a hit is the executable that
compiling would have produced (programs with host callbacks are never written). The directory
is new for each run and removed at its end, so no run reads another run's entries. A read that
fails (an entry another process is still writing) is a warning and an ordinary compilation.

The cache is on unless ``JAX_COMPILATION_CACHE_DIR`` is already set: a pytest-xdist worker
inherits its controller's directory, and a developer may point it elsewhere (or turn it off with
``JAX_ENABLE_COMPILATION_CACHE=false``).
"""

from __future__ import annotations

import os
import shutil
import tempfile

_DIRECTORY = "JAX_COMPILATION_CACHE_DIR"

_SETTINGS = {
    # JAX writes only compilations slower than 1 s by default, and the suite's programs take
    # tens of milliseconds: every one is worth keeping, at any size.
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
    # Whole executables only: XLA's own GPU caches kept there too (autotuning results by
    # default) would let one process's choice of kernels decide another's.
    "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES": "none",
}


def share_for_this_run() -> str | None:
    """Point this process and the processes it starts at a new cache directory, before JAX is
    imported (JAX reads these variables when it starts). Returns the directory if it was
    created here (the caller removes it with ``remove``), None if one was already set."""
    if _DIRECTORY in os.environ:
        return None
    directory = tempfile.mkdtemp(prefix="torchlax-tests-xla-cache-")
    os.environ[_DIRECTORY] = directory
    for name, value in _SETTINGS.items():
        os.environ.setdefault(name, value)
    return directory


def remove(directory: str) -> None:
    shutil.rmtree(directory, ignore_errors=True)
