"""Every op family's lowerings; importing this package fills ``torchlax_ops._table``."""

from .. import _decompositions  # noqa: F401  (torch._decomp decompositions)
from . import (  # noqa: F401
    activations,
    asserts,
    attention,
    backward,
    convolution,
    elementwise,
    embedding,
    factories,
    fft,
    foreach,
    indexing,
    linalg,
    losses,
    normalization,
    padding,
    pooling,
    random,
    reductions,
    resampling,
    shape,
    special,
    torchvision,
)
