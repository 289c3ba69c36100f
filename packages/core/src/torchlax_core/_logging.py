"""torchlax's logger: ``logging.getLogger("torchlax")``, silent unless asked.

Every torchlax package logs through this logger (or a child such as ``torchlax.dynamo``), so
one switch shows them all: set ``TORCHLAX_LOG=info`` (or ``debug``) in the environment, or
configure the ``"torchlax"`` logger as any other Python logger. It is also registered with
PyTorch's ``torch._logging``: ``TORCH_LOGS=torchlax`` (INFO), ``TORCH_LOGS=+torchlax`` (DEBUG)
and ``torch._logging.set_logs(modules={"torchlax": logging.INFO})`` turn it on with PyTorch's
format, and torchlax's recompile reasons and graph breaks also go to PyTorch's ``recompiles``
and ``graph_breaks`` artifacts (``TORCH_LOGS=recompiles,graph_breaks``: ``artifact_logger``).

- ``info``: plugins loaded, blocked or failed; fallbacks to eager PyTorch; ``torch.compile``
  graphs, their partitions; each program's traces and XLA compilations with their time, and
  its loads from the persistent compilation cache (``_compile_log.py``).
- ``debug``: per-op detail (why a graph node runs eagerly, what each program holds, ...).
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

logger = logging.getLogger("torchlax")
# A library adds no output of its own by default: the NullHandler stops Python's "last resort"
# handler from printing warnings of ours when the application configured no logging.
logger.addHandler(logging.NullHandler())

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
}
_HANDLER_NAME = "torchlax-env"
_artifact_loggers: dict[str, logging.Logger] = {}


def get_logger(name: str | None = None) -> logging.Logger:
    """``torchlax`` or its child ``torchlax.<name>`` (e.g. ``get_logger("dynamo")``)."""
    return logger if not name else logger.getChild(name)


def configure_from_env(value: str | None = None) -> logging.Handler | None:
    """Apply ``TORCHLAX_LOG`` (``info``/``debug``/...): a stderr handler at that level.

    Called once when ``torchlax_core`` is imported; unset or empty leaves logging alone.
    Calling it again replaces the handler it added before rather than adding a second one.
    """
    value = os.environ.get("TORCHLAX_LOG", "") if value is None else value
    value = value.strip().lower()
    if not value:
        return None
    level = _LEVELS.get(value)
    if level is None:
        if value.isdigit():
            level = int(value)
        else:
            # Not through the logger: it has no handler yet, so nobody would see it.
            warnings.warn(
                f"TORCHLAX_LOG={value!r} is not a logging level; use one of "
                f"{', '.join(sorted(_LEVELS))}. torchlax logging stays off.",
                RuntimeWarning,
                stacklevel=2,
            )
            return None
    for handler in list(logger.handlers):
        if handler.get_name() == _HANDLER_NAME:
            logger.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(logging.Formatter("[%(name)s %(levelname)s] %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level)
    return handler


def artifact_logger(artifact: str) -> logging.Logger:
    """torchlax's logger of PyTorch's logging artifact ``artifact`` (``recompiles``,
    ``graph_breaks``), on when ``TORCH_LOGS`` (or ``torch._logging.set_logs``) names it.

    It is ``torch.torchlax.__<artifact>``, under PyTorch's ``torch`` logger as PyTorch's own
    artifact loggers are: torch gives that logger its handler, so nothing of torch's logging
    setup is redone here. (The ``torchlax`` logger itself is not registered with torch: torch
    resets a registered logger's level and propagation on every ``set_logs`` call, which
    would undo ``TORCHLAX_LOG`` and an application's own logging configuration. Naming it in
    ``TORCH_LOGS`` works all the same: torch takes it as a module's logger.)
    """
    log = _artifact_loggers.get(artifact)
    if log is None:
        from torch._logging import getArtifactLogger

        log = _artifact_loggers[artifact] = getArtifactLogger("torch.torchlax", artifact)
    return log
