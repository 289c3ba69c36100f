"""Exceptions raised by torchlax. Each message names the op or argument and says what to do.

Every one derives from ``TorchlaxError`` and from the built-in exception PyTorch raises in the
same situation. ``TorchlaxError`` itself is defined torch-free (``_torchlax_errors``) so that
torchlax-export's loading errors share it without importing torch.
"""

from __future__ import annotations

import torch
from _torchlax_errors import TorchlaxError as TorchlaxError


class OpNotLoweredError(TorchlaxError, NotImplementedError):
    """An ATen op (or torch function) reached torchlax and no plugin lowers it to JAX."""

    def __init__(self, message: str, op=None):
        super().__init__(message)
        self.op = op


class UnsupportedDtypeError(TorchlaxError, TypeError):
    """A dtype that one side (torch or JAX) cannot represent (converting a tensor or dtype).

    ``dtype``: the torch dtype JAX lacks, where that is the case (else None).
    """

    def __init__(self, message: str, dtype=None):
        super().__init__(message)
        self.dtype = dtype


class DtypeNotImplementedError(TorchlaxError, NotImplementedError):
    """An op whose result (or computation) dtype JAX cannot represent: ``half_tensor + 1j``
    would be complex32.

    A ``NotImplementedError``, as PyTorch's kernels raise for a dtype they do not implement
    ("... not implemented for 'ComplexHalf'"), and deliberately not a ``TypeError``: Python's
    operators turn a ``TypeError`` raised inside ``Tensor.__add__`` into "unsupported operand
    type(s) for +", which would hide the reason.
    """


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


class ProgramFailedError(TorchlaxError, RuntimeError):
    """A compiled XLA program failed while it ran (XLA reports such failures when a result is
    waited for, after the launch returned). ``program`` names it; its results were not
    written into any tensor."""

    def __init__(self, message: str, program: str = ""):
        super().__init__(message)
        self.program = program


class ProgramOutOfMemoryError(ProgramFailedError, torch.OutOfMemoryError):
    """A compiled XLA program needs more memory than its device has, or ran out of it.

    A ``torch.OutOfMemoryError``, as PyTorch raises when CUDA runs out of memory.
    ``requested``: the bytes XLA reported it could not allocate, or the program's estimate
    when it was refused before it ran (None where XLA named no size)."""

    def __init__(self, message: str, program: str = "", requested: int | None = None):
        super().__init__(message, program)
        self.requested = requested


class JitError(TorchlaxError, RuntimeError):
    """``torchlax.jit`` (or the ``torch.compile`` backend) refuses a call it cannot run as one
    program with eager PyTorch's results: a constant or plain CPU tensor the step changes, an
    optimizer or module it trains that is no state, a backward() toward a CPU tensor, a tracer
    leaked out of the trace, ... The message names the tensor or object and what to do."""


class JitArgumentError(JitError, TypeError):
    """An argument ``torchlax.jit`` cannot take as it is given (a static argument that is not
    hashable, ...): a ``TypeError``, as PyTorch raises for an argument of the wrong kind."""
