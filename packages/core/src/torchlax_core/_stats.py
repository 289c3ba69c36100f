"""Counters of one environment: op-cache hits and misses, XLA compilations and their time.

``Environment.stats()`` returns them as a dict. Whatever compiles an XLA program on behalf of
torchlax (the eager op cache here, ``torchlax.jit``, the ``torch.compile`` backend) reports it
with ``record_compile(name, seconds)``, so one place counts them all and tells the user, once
per name, when a compilation was slow (``Config.slow_compile_seconds``).
"""

from __future__ import annotations

from typing import Any

from ._current import current_env
from ._logging import logger


class Stats:
    """Plain counters (incremented on the hot path, so no locking and no properties)."""

    __slots__ = ("hits", "misses", "compilations", "compile_seconds", "slowest", "_logged")

    def __init__(self) -> None:
        self.hits = 0  # eager ops served by a cached executable
        self.misses = 0  # eager ops looked up in the cache and not found there
        self.compilations = 0
        self.compile_seconds = 0.0
        self.slowest: tuple[str, float] | None = None
        self._logged: set[str] = set()

    def record_compile(
        self, name: str, seconds: float, threshold: float | None, logged: bool = False
    ) -> None:
        self.compilations += 1
        self.compile_seconds += seconds
        if self.slowest is None or seconds > self.slowest[1]:
            self.slowest = (name, seconds)
        if logged:  # the caller logged it (_compile_log.compiling)
            return
        if threshold is not None and seconds >= threshold and name not in self._logged:
            self._logged.add(name)
            logger.info(
                "XLA compiled %s in %.1f s (the first call of each new shape or program "
                "compiles; later calls reuse it).",
                name,
                seconds,
            )
        else:
            logger.debug("XLA compiled %s in %.3f s", name, seconds)

    def reset(self) -> None:
        self.__init__()


def record_compile(name: str, seconds: float, env: Any = None, *, logged: bool = False) -> None:
    """Count one XLA compilation of ``name`` (an op or a program) that took ``seconds``.

    It goes into ``env``'s stats (default: the current environment). A compilation slower than
    that environment's ``Config.slow_compile_seconds`` is logged once per name through the
    ``torchlax`` logger (shown with ``TORCHLAX_LOG=info``), unless ``logged``: the caller
    logged it itself.
    """
    if env is None:
        env = current_env()
    stats = getattr(env, "_stats", None)
    if stats is None:  # an environment object from before this module (or a stand-in)
        return
    stats.record_compile(
        name, seconds, getattr(env.config, "slow_compile_seconds", None), logged=logged
    )
