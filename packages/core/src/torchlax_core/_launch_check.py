"""A compiled program's failure seen before its caller commits a result: refused before the
launch when it can never fit, raised after the launch before any write-back otherwise.

XLA launches asynchronously: an executable whose run fails (out of memory allocating its
temporaries, say) returns arrays that raise only when read. A caller that writes them into
tensors (parameters, ``.grad``s, optimizer state) would commit arrays that raise on every later
read, silently. Two checks, each turning XLA's ``JaxRuntimeError`` into a
``ProgramFailedError`` (``ProgramOutOfMemoryError`` for memory) that names the program:

- ``refuse_if_too_large``, once per executable before its first launch: XLA's own estimate of
  what the program needs at once (arguments, outputs and temporaries, less the outputs that
  reuse donated arguments) against what the device can ever hold (an accelerator's
  ``bytes_limit``; on the CPU, RAM and swap). A program over it cannot run; refused before the
  launch, nothing is donated and every tensor stays as it was.
- ``failure_of`` after a launch: waits for one result (the results of one run become ready, or
  fail, together) and returns the failure, if any, for the caller to raise before it writes
  anything back. Arrays donated to a run that failed are gone (JAX deletes a donated argument
  when the run is launched); the error says so.
"""

from __future__ import annotations

import functools
import os
import re

import jax
import jax.core

from ._errors import ProgramFailedError, ProgramOutOfMemoryError

_ALLOCATING = re.compile(r"allocat\w*\s+(\d+)\s*bytes", re.IGNORECASE)
_OOM_WORDS = ("RESOURCE_EXHAUSTED", "out of memory", "Out of memory")


def _size(n: int) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


@functools.cache
def _host_memory() -> int | None:
    """RAM and swap of this machine: Linux's default overcommit refuses one allocation above it."""
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return sum(int(fields[k].split()[0]) * 1024 for k in ("MemTotal", "SwapTotal"))
    except (OSError, KeyError, ValueError):
        try:
            return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, AttributeError):
            return None


def _device_limit(device) -> tuple[int | None, str]:
    if device.platform == "cpu":
        return _host_memory(), "RAM and swap"
    try:
        stats = device.memory_stats() or {}
    except Exception:  # a backend without memory statistics: nothing to compare with
        return None, ""
    return stats.get("bytes_limit"), "memory"


def _needed(executable) -> int | None:
    try:
        m = executable.memory_analysis()
    except Exception:  # the jax.jit fallback, or a backend without the analysis
        return None
    if m is None:
        return None
    return (
        m.argument_size_in_bytes
        + m.output_size_in_bytes
        + m.temp_size_in_bytes
        - m.alias_size_in_bytes
    )


def refuse_if_too_large(executable, name: str, device) -> None:
    """Raise ``ProgramOutOfMemoryError`` if ``executable`` needs more than ``device`` holds."""
    needed = _needed(executable)
    if not needed:
        return
    limit, what = _device_limit(device)
    if limit is None or needed <= limit:
        return
    raise ProgramOutOfMemoryError(
        f"{name}: the XLA program needs {_size(needed)} at once (XLA's estimate of its "
        f"arguments, outputs and temporaries) and the {device.platform} device has "
        f"{_size(limit)} of {what}, so it was not run; every tensor is as it was before the "
        "call. Make the step need less memory (a smaller batch or sequence length, gradient "
        "checkpointing, a smaller intermediate tensor).",
        name,
        needed,
    )


def failure_of(results, name: str, donated: int = 0) -> ProgramFailedError | None:
    """Wait for ``results`` (arrays of one run, or lists and tuples of them: ``torchlax.jit``'s
    outputs, new state and extra results); the run's failure as a torchlax error, or None.

    ``donated``: how many of the caller's tensors the run was given to update in place."""
    array = _first_array(results)
    if array is None or isinstance(array, jax.core.Tracer):
        return None  # (inlined into a JAX trace: the outer program runs, and fails, later)
    try:
        array.block_until_ready()
    except jax.errors.JaxRuntimeError as exc:
        return launch_error(exc, name, donated)
    return None


def _first_array(results) -> jax.Array | None:
    """The first array (or tracer) in ``results``, looking inside lists and tuples."""
    for value in results:
        if isinstance(value, list | tuple):
            value = _first_array(value)
        if isinstance(value, jax.Array | jax.core.Tracer):
            return value
    return None


def launch_error(exc: Exception, name: str, donated: int = 0) -> ProgramFailedError:
    """XLA's ``JaxRuntimeError`` of a run of program ``name`` as a torchlax error."""
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if donated:
        lost = (
            f" The {donated} tensor(s) it was updating in place had been handed to it "
            "(donated) and no longer hold data: restore them (from a checkpoint) before "
            "using them again."
        )
    else:
        lost = " None of its results was written into a tensor: the tensors are as they were."
    if any(word in reason for word in _OOM_WORDS):
        found = _ALLOCATING.search(reason)
        requested = int(found.group(1)) if found else None
        size = f" ({_size(requested)} requested)" if requested is not None else ""
        return ProgramOutOfMemoryError(
            f"{name}: the XLA program ran out of memory while it ran{size}: {reason}.{lost} "
            "Make the step need less memory (a smaller batch or sequence length, gradient "
            "checkpointing) or free device memory.",
            name,
            requested,
        )
    return ProgramFailedError(f"{name}: the XLA program failed while it ran: {reason}.{lost}", name)
