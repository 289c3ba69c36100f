"""The torchlax plugin ``interop``: lowers this package's custom ops for torchlax Tensors.

On torchlax Tensors ``call_jax`` needs no DLPack: the lowering hands the arrays (concrete or
traced) straight to the JAX function.
"""

from __future__ import annotations

import torch
from torchlax_core import hookimpl

from . import _call_jax


@hookimpl
def torchlax_register_lowerings(registry):
    registry.register_lowering(torch.ops.torchlax_interop.call_jax.default, _call_jax.run_jax)
    registry.register_lowering(
        torch.ops.torchlax_interop.call_jax_vjp.default, _call_jax.run_jax_vjp
    )
