"""The torchlax plugin: registered through the ``torchlax`` entry point in pyproject.toml."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from torchlax_core import hookimpl

from . import ops  # noqa: F401  (defines torch.ops.example.scaled_swish)

_placement: dict[str, object] = {"target": None}


def place_on(target) -> None:
    """New ``device="jax"`` tensors go to ``target`` (a jax.Device or Sharding); None resets."""
    import torchlax_core

    _placement["target"] = target
    torchlax_core.default_env().clear_placement_cache()


def scaled_swish(x, beta):
    return x * jax.nn.sigmoid(beta * x)


def softmax_float32(self, dim, half_to_float):
    # Accumulate in at least float32: float16/bfloat16 inputs are computed in float32 (as
    # PyTorch's CPU kernel does), float32 and float64 in their own precision, so the override
    # never changes a result. The output has the input's dtype (float32 when PyTorch's
    # half_to_float asks for it).
    out = jax.nn.softmax(self.astype(jnp.promote_types(self.dtype, jnp.float32)), axis=dim)
    return out if half_to_float else out.astype(self.dtype)


@hookimpl
def torchlax_register_lowerings(registry):
    registry.register_lowering(torch.ops.example.scaled_swish.default, scaled_swish)
    registry.register_lowering(torch.ops.aten._softmax.default, softmax_float32, override=True)


@hookimpl
def torchlax_device_placement(device, env):
    target = _placement["target"]
    if target is not None and (device is None or device.type == "jax"):
        return target
    return None
