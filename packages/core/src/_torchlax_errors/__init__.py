"""The base class of every torchlax exception, importable without torch.

It lives apart from ``torchlax_core`` (whose package imports torch) so that ``torchlax_export``
can derive its loading errors from it on a machine where torch cannot be imported. Import it as
``torchlax.TorchlaxError`` or ``torchlax_core.TorchlaxError``, not from here.
"""

from __future__ import annotations


class TorchlaxError(Exception):
    """Base class of every exception torchlax raises itself: ``except TorchlaxError`` catches them.

    Each subclass also derives from the built-in exception PyTorch would raise in its place
    (``RuntimeError``, ``NotImplementedError``, ``TypeError``, ``ValueError``), so code written
    against PyTorch's exceptions keeps working.
    """


__all__ = ["TorchlaxError"]
