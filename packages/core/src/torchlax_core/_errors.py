"""Exceptions raised by torchlax. Each message names the op or argument and says what to do.

Every one derives from ``TorchlaxError`` and from the built-in exception PyTorch raises in the
same situation. ``TorchlaxError`` itself is defined torch-free (``_torchlax_errors``) so that
torchlax-export's loading errors share it without importing torch.
"""

from __future__ import annotations

from _torchlax_errors import TorchlaxError as TorchlaxError


class OpNotLoweredError(TorchlaxError, NotImplementedError):
    """An ATen op (or torch function) reached torchlax and no plugin lowers it to JAX."""

    def __init__(self, message: str, op=None):
        super().__init__(message)
        self.op = op


class UnsupportedDtypeError(TorchlaxError, TypeError):
    """A dtype that one side (torch or JAX) cannot represent."""


class DeviceMismatchError(TorchlaxError, RuntimeError):
    """An op mixes a torchlax Tensor with a tensor on another device."""


class PluginError(TorchlaxError, RuntimeError):
    """A plugin failed to load, register or lower an op.

    ``Environment.register_plugin`` raises it (leaving the environment as it was); an
    installed (entry-point) plugin that fails is reported and skipped instead, unless
    ``TORCHLAX_STRICT_PLUGINS=1``.
    """


class PluginConflictError(PluginError):
    """Two plugins claim the same op without ``override=True``; ``plugins`` names both."""

    def __init__(self, message: str, plugins: tuple[str, ...] = ()):
        super().__init__(message)
        self.plugins = tuple(plugins)
