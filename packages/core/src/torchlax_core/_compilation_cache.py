"""JAX's persistent compilation cache, on by default under the user's cache directory.

A new process compiles every XLA program again (a GPT-2 training step: 15 s on a small CPU);
JAX can keep executables on disk and load them instead (2.5 s). As inductor keeps its caches
under the user's cache directory, torchlax turns JAX's cache on when ``torchlax_core`` is
imported, in ``$TORCHLAX_COMPILATION_CACHE``, else ``$XDG_CACHE_HOME/torchlax/xla``, else
``~/.cache/torchlax/xla``. ``TORCHLAX_COMPILATION_CACHE=off`` leaves it off.

JAX's own configuration comes first: when ``jax_compilation_cache_dir`` is already set (by
``JAX_COMPILATION_CACHE_DIR`` or ``jax.config.update``: the test suite's per-run cache is) or
``jax_enable_compilation_cache`` is off, nothing here changes anything. Where torchlax turns
the cache on it also keeps compilations of any length (JAX's default keeps only those over
1 s, and a model's eager first call is hundreds of short ones), unless
``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`` says otherwise. It is a process-wide JAX
setting: JAX programs of the same process use the cache too.

A hit is the executable compiling would have produced: JAX keys an entry on the whole program,
the compile options, XLA flags, devices and jax/jaxlib versions, and never writes programs with
host callbacks. ``clear_compilation_cache()`` (``python -m torchlax cache clear``) empties it.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import jax

_SETTING = "TORCHLAX_COMPILATION_CACHE"
_OFF = ("0", "off", "false", "no", "none", "disable", "disabled")
_MIN_TIME_ENV = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
# The file names JAX's file-system cache writes (jax/_src/lru_cache.py): an entry and, with
# eviction on, its access time. ``clear`` removes only these.
_ENTRY_SUFFIXES = ("-cache", "-atime")

_enabled: Path | None = None


def _config(name: str):
    # JAX's options are attributes of jax.config set up at run time (no static type).
    return getattr(jax.config, name)


def directory(setting: str | None = None) -> Path | None:
    """The directory torchlax's settings name (None: ``TORCHLAX_COMPILATION_CACHE=off``),
    whether or not it is in use (``compilation_cache_dir()`` says what JAX uses)."""
    value = os.environ.get(_SETTING, "") if setting is None else setting
    value = value.strip()
    if value.lower() in _OFF:
        return None
    if value:
        return Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    root = Path(base).expanduser() if base else Path.home() / ".cache"
    return root / "torchlax" / "xla"


def compilation_cache_dir() -> str | None:
    """The directory of JAX's persistent compilation cache in this process (torchlax's or the
    user's own), None if it is off."""
    if not _config("jax_enable_compilation_cache"):
        return None
    return _config("jax_compilation_cache_dir")


def enable() -> Path | None:
    """Turn JAX's persistent compilation cache on in torchlax's directory, unless JAX's own
    configuration or ``TORCHLAX_COMPILATION_CACHE=off`` says otherwise. Returns the directory
    it turned on (None: nothing changed). Called when this module is imported, first of the
    core's."""
    global _enabled
    if _enabled is not None:
        return _enabled
    path = directory()
    if (
        path is None
        or compilation_cache_dir() is not None
        or not _config("jax_enable_compilation_cache")
    ):
        return None
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        warnings.warn(
            f"torchlax could not create its compilation cache directory {str(path)!r} ({exc}); "
            f"XLA programs are compiled anew in each process. Set {_SETTING} to a writable "
            f"directory, or {_SETTING}=off to stop this warning.",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    jax.config.update("jax_compilation_cache_dir", str(path))
    if _MIN_TIME_ENV not in os.environ:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    # JAX decides once per process whether the cache is used: a compilation before this import
    # would have decided "no". Resetting makes the next compilation decide again.
    from jax.experimental.compilation_cache import compilation_cache

    compilation_cache.reset_cache()
    _enabled = path
    return path


def entries(path: str | os.PathLike | None = None) -> list[Path]:
    """The cache entries (files JAX wrote) in ``path`` (default: torchlax's directory)."""
    path = directory() if path is None else Path(path)
    if path is None or not path.is_dir():
        return []
    return [p for p in path.iterdir() if p.is_file() and p.name.endswith(_ENTRY_SUFFIXES)]


def clear_compilation_cache(path: str | os.PathLike | None = None) -> tuple[int, int]:
    """Remove the cache entries in ``path`` (default: torchlax's directory); other files are
    left alone. Returns ``(files, bytes)`` removed. Executables this process already loaded
    stay in memory; later processes compile again."""
    files = size = 0
    for entry in entries(path):
        try:
            length = entry.stat().st_size
            entry.unlink()
        except FileNotFoundError:  # another process evicted or cleared it meanwhile
            continue
        files += 1
        size += length
    return files, size


# On import, which ``torchlax_core``'s ``__init__`` does first: before any module of the core
# compiles anything (a compilation before it would miss the cache in every process).
enable()
