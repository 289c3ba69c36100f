"""Exceptions of torchlax-export. Importing this module needs neither torch nor torchlax-core."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _torchlax_errors import TorchlaxError
else:
    try:  # installed with torchlax-core, torch-free: one base for all of torchlax's exceptions
        from _torchlax_errors import TorchlaxError
    except ImportError:  # torchlax-export alone (a serving machine): its errors are the only ones

        class TorchlaxError(Exception):
            """Base class of every exception torchlax raises itself."""


class ExportError(TorchlaxError, RuntimeError):
    """A program could not be exported (an op without lowering, an unsupported construct)."""


class UnsupportedOpError(ExportError, NotImplementedError):
    """The program uses ops that no torchlax plugin lowers; ``ops`` names them."""

    def __init__(self, message: str, ops=()):
        super().__init__(message)
        self.ops = tuple(ops)


class ArtifactError(TorchlaxError, ValueError):
    """Base class of the errors a saved artifact or a call of it raises."""


class ArtifactFormatError(ArtifactError):
    """An artifact directory is missing, truncated, corrupt or of an unknown format version."""


class InputMismatchError(ArtifactError, TypeError):
    """An artifact was called with inputs of the wrong number, shape or dtype."""
