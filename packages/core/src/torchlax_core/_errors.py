"""Exceptions raised by torchlax. Each message names the op or argument and says what to do."""

from __future__ import annotations


class TorchlaxError(RuntimeError):
    """Base class for torchlax's own runtime errors."""


class OpNotLoweredError(NotImplementedError):
    """An ATen op (or torch function) reached torchlax and no plugin lowers it to JAX."""

    def __init__(self, message: str, op=None):
        super().__init__(message)
        self.op = op


class UnsupportedDtypeError(TypeError):
    """A dtype that one side (torch or JAX) cannot represent."""


class DeviceMismatchError(RuntimeError):
    """An op mixes a torchlax Tensor with a tensor on another device."""


class PluginError(TorchlaxError):
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
