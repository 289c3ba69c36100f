"""The ``precision`` of the lowerings' products and convolutions, as PyTorch says it.

PyTorch computes float32 matrix products as ``torch.set_float32_matmul_precision`` says:
"highest" in full float32, "high" with TF32 or bfloat16x3, "medium" with bfloat16. XLA's
``Precision`` names the same choices (on a TPU: six, three or one bfloat16 pass), so a float32
product or convolution (complex64 too) gets ``HIGHEST``, ``HIGH`` or ``DEFAULT`` as the mode is
when it is traced; the core's caches key what they compile on the mode
(``torchlax_core._precision``). Convolutions follow the same mode (PyTorch's CPU ignores the
mode; on a TPU a float32 convolution at ``HIGHEST`` would cost what a product does).

Half-precision operands are multiplied in their own dtype with a float32 accumulator
(``_promotion.accumulator``): one bfloat16 pass is exact for them, so they get ``DEFAULT``.
Every other dtype (float64, integers) keeps ``HIGHEST``, exact as PyTorch's CPU kernels.
"""

from __future__ import annotations

import jax
import numpy as np
from torchlax_core.internal import float32_matmul_precision

from ._promotion import accumulator

__all__ = ["product_precision"]

_MODES = {
    "highest": jax.lax.Precision.HIGHEST,
    "high": jax.lax.Precision.HIGH,
    "medium": jax.lax.Precision.DEFAULT,
}
_FLOAT32 = (np.dtype(np.float32), np.dtype(np.complex64))


def product_precision(dtype) -> jax.lax.Precision:
    """The ``precision`` of a product or convolution of ``dtype`` operands (see the module
    docstring); a float32 one reads the mode, which keys the caches on it."""
    dtype = np.dtype(dtype)
    if dtype in _FLOAT32:
        return _MODES.get(float32_matmul_precision(), jax.lax.Precision.HIGHEST)
    if accumulator(dtype) is not None:  # half precision
        return jax.lax.Precision.DEFAULT
    return jax.lax.Precision.HIGHEST
