"""torchlax-export: PyTorch programs to StableHLO artifacts that run with JAX alone.

    artifact = torchlax_export.export(model, (x,), dynamic_shapes={"x": {0: Dim("batch")}})
    artifact.save("model/")
    program = torchlax_export.load("model/")   # needs only jax and numpy
    y = program(x_numpy)

Importing this package (and ``load``) does not import torch or torchlax-core; ``export``
imports them when first used. See ``_artifact`` for the layout of a saved artifact.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._errors import ArtifactError as ArtifactError
from ._errors import ArtifactFormatError as ArtifactFormatError
from ._errors import ExportError as ExportError
from ._errors import InputMismatchError as InputMismatchError
from ._errors import TorchlaxError as TorchlaxError
from ._errors import UnsupportedOpError as UnsupportedOpError

if TYPE_CHECKING:
    from ._artifact import Artifact as Artifact
    from ._artifact import load as load
    from ._export import export as export

__version__ = "0.1.0"

_LAZY = {"Artifact": "._artifact", "load": "._artifact", "export": "._export"}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'torchlax_export' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
