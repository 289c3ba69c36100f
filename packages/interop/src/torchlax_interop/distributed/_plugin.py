"""The torchlax plugin ``distributed``: lowers ``torch.ops._c10d_functional`` collectives.

Loaded through the ``torchlax`` entry point of torchlax-interop; block it with
``TORCHLAX_BLOCK_PLUGINS=distributed``.
"""

from __future__ import annotations

from torchlax_core import hookimpl

from ._collectives import register_lowerings


@hookimpl
def torchlax_register_lowerings(registry):
    register_lowerings(registry)
