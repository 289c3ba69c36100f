"""``torch.autocast("jax")``: PyTorch's CPU autocast policy for the ``jax`` device.

Autocast reaches a device through its own dispatch key (AutocastPrivateUse1), which has no
kernels until a backend installs some. Every op falls through it; the ops of PyTorch's CPU
policy cast their floating-point inputs first: to the autocast dtype for the matrix products
and convolutions (bfloat16 by default), to float32 for the losses and reductions that need the
range. float64 inputs are left alone, as PyTorch leaves them.
"""

from __future__ import annotations

import torch
from torch.utils import _pytree as pytree

_KEY = "AutocastPrivateUse1"

# PyTorch's CPU lists (aten/src/ATen/autocast_mode.cpp), by op packet.
LOWER_PRECISION = (
    "conv1d",
    "conv2d",
    "conv3d",
    "bmm",
    "mm",
    "linalg_vecdot",
    "baddbmm",
    "addmm",
    "addbmm",
    "linear",
    "matmul",
    "conv_tbc",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "prelu",
    "scaled_dot_product_attention",
    "_native_multi_head_attention",
)
FLOAT32 = (
    "binary_cross_entropy_with_logits",
    "mse_loss",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "nll_loss",
    "nll_loss2d",
    "cross_entropy_loss",
    "kl_div",
    "prod",
    "cdist",
    "trace",
)

_libraries: list = []


def _caster(dtype_of):
    def cast(value):
        if (
            isinstance(value, torch.Tensor)
            and value.is_floating_point()
            and value.dtype != torch.float64
            and value.device.type == "jax"
        ):
            return value.to(dtype_of())
        return value

    return cast


def _kernel(op, dtype_of):
    cast = _caster(dtype_of)
    below = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)  # pyright: ignore[reportAttributeAccessIssue]  (torch._C stubs lack this key)

    def kernel(*args, **kwargs):
        args, kwargs = pytree.tree_map(cast, (args, kwargs))
        with torch._C._ExcludeDispatchKeyGuard(below):
            return op(*args, **kwargs)

    return kernel


def install() -> None:
    """Install the fallthrough and the policy's kernels (once per process)."""
    if _libraries:
        return
    fallthrough = torch.library.Library("_", "IMPL")  # noqa: TOR901 - a fallback, not an op
    fallthrough.fallback(torch.library.fallthrough_kernel, dispatch_key=_KEY)
    aten = torch.library.Library("aten", "IMPL")  # noqa: TOR901
    policies = [
        (LOWER_PRECISION, lambda: torch.get_autocast_dtype("jax")),
        (FLOAT32, lambda: torch.float32),
    ]
    for names, dtype_of in policies:
        for name in names:
            packet = getattr(torch.ops.aten, name)
            for overload in packet.overloads():
                op = getattr(packet, overload)
                if op._schema.is_mutable:  # out= variants: autocast leaves them to the op
                    continue
                qualified = name if overload == "default" else f"{name}.{overload}"
                aten.impl(qualified, _kernel(op, dtype_of), _KEY)
    _libraries.extend([fallthrough, aten])
