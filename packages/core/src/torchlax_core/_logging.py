"""torchlax's logger: ``logging.getLogger("torchlax")``, silent unless asked.

Every torchlax package logs through this logger (or a child such as ``torchlax.dynamo``), so
one switch shows them all: set ``TORCHLAX_LOG=info`` (or ``debug``) in the environment, or
configure the ``"torchlax"`` logger as any other Python logger.

- ``info``: plugins loaded, blocked or failed; fallbacks to eager PyTorch; ``torch.compile``
  graphs, their partitions and each XLA program compilation with its time.
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
