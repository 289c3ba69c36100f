"""The ``ops`` plugin: registers this package's tables through the public hooks.

Loaded through the ``torchlax`` entry point (``ops = "torchlax_ops._plugin"``), the same way a
third-party plugin is; block it with ``TORCHLAX_BLOCK_PLUGINS=ops``.
"""

from __future__ import annotations

from torchlax_core import hookimpl

from . import _lowerings  # noqa: F401  (fills the tables)
from ._table import DECOMPOSITIONS, FUNCTIONS, LOWERINGS


@hookimpl
def torchlax_register_lowerings(registry):
    for op, fn in LOWERINGS:
        registry.register_lowering(op, fn)
    for torch_fn, fn in FUNCTIONS:
        registry.register_function(torch_fn, fn)


@hookimpl
def torchlax_register_decompositions(registry):
    for op, fn in DECOMPOSITIONS:
        registry.register_decomposition(op, fn)
