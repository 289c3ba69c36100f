"""Every op family's lowerings; importing this package fills ``torchlax_ops._table``."""

from .. import _decompositions  # noqa: F401  (torch._decomp decompositions)
from . import (  # noqa: F401
    asserts,
    attention,
    backward,
    elementwise,
    factories,
    fft,
    foreach,
    indexing,
    linalg,
    nn,
    random,
    reductions,
    shape,
    spatial,
    special,
    torchvision,
)
