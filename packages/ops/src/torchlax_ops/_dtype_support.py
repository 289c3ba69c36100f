"""The dtypes PyTorch's CPU kernels do not implement an op for, and the check that follows them.

``softmax`` of integers, ``abs`` of bools, ``x - 1`` on a bool tensor: PyTorch raises
``NotImplementedError`` (or ``RuntimeError``) where JAX would compute something. ``REJECTED``
(generated from PyTorch's OpInfo samples by ``packages/ops/tools/gen_dtype_support.py``; rerun it
after a PyTorch upgrade) maps an ATen overload to the dtypes of its first tensor argument that
PyTorch rejects, with PyTorch's exception type and message. ``guard`` wraps a lowering of such
an overload: one dtype lookup in a frozen set per call, and eagerly the op cache compiles the
guarded lowering once per signature, so a supported call pays nothing after its first.

The table knows the first tensor's dtype only. Where the op's other tensors have other dtypes,
PyTorch may promote first and compute (``torch.clamp(bool_tensor, int_min, int_max)`` is an
int64 clamp) or still refuse (``bool_tensor - int_tensor``): then PyTorch's CPU kernel is asked,
on one-element stand-ins of the arguments' dtypes and ranks.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import torch
from torch.utils._pytree import tree_leaves, tree_map

_EXCEPTIONS = {
    "NotImplementedError": NotImplementedError,
    "RuntimeError": RuntimeError,
    "TypeError": TypeError,
    "ValueError": ValueError,
}


def _first_tensor_position(op) -> int | None:
    """Position of the op's first plain ``Tensor`` argument (not a list, not kwarg-only)."""
    for i, argument in enumerate(op._schema.arguments):
        if argument.kwarg_only:
            return None
        if isinstance(argument.type, torch.TensorType):
            return i
        if "Tensor" in str(argument.type):  # a Tensor[] or Tensor? first: not checked
            return None
    return None


# Dtypes the CPU kernel refuses and PyTorch's CUDA kernel computes, which the jax device (an
# accelerator to the libraries that test ``device.type``) computes too: transformers' MoE
# routing takes ``histc`` of integer expert ids on any device but CPU and MPS.
AS_ON_CUDA = {"aten.histc.default": frozenset({"int8", "uint8", "int16", "int32", "int64"})}


@functools.cache
def _rejected(name: str) -> dict[Any, tuple[type[BaseException], str]]:
    from torchlax_core import jax_dtype

    out = {}
    computed = AS_ON_CUDA.get(name, frozenset())
    for dtype_name, (exc, message) in REJECTED.get(name, {}).items():
        if dtype_name in computed:
            continue
        dtype = getattr(torch, dtype_name)
        # Keyed by both: lowerings see jax arrays, decompositions torch Tensors.
        out[dtype] = out[jax_dtype(dtype)] = (_EXCEPTIONS.get(exc, RuntimeError), message)
    return out


def guard(op: Any, fn: Callable) -> Callable:
    """``fn`` (a lowering or decomposition of ``op``), raising as PyTorch does for the dtypes
    PyTorch's CPU kernels reject; ``fn`` itself when ``op`` rejects none."""
    if not isinstance(op, torch._ops.OpOverload) or str(op) not in REJECTED:
        return fn
    position = _first_tensor_position(op)
    if position is None:
        return fn
    rejected = _rejected(str(op))
    dtypes = frozenset(rejected)

    @functools.wraps(fn)
    def guarded(*args, **kwargs):
        if len(args) > position:
            dtype = getattr(args[position], "dtype", None)
            if dtype in dtypes:
                exc, message = rejected[dtype]
                if not _mixed(dtype, args, kwargs) or not _pytorch_computes(
                    op, args, kwargs, message
                ):
                    raise exc(message)
        return fn(*args, **kwargs)

    guarded.unguarded = fn  # pyright: ignore[reportAttributeAccessIssue]  (a marker attribute on the wrapper)
    # kept by a plugin's override
    guarded.torchlax_contract = functools.partial(guard, op)  # pyright: ignore[reportAttributeAccessIssue]  (a marker attribute on the wrapper)
    return guarded


def _is_array(x) -> bool:
    return isinstance(x, torch.Tensor | jax.Array)


def _mixed(dtype, args, kwargs) -> bool:
    """Whether another tensor argument has another dtype than ``dtype`` (the first's)."""
    leaves = tree_leaves((args, kwargs))
    return any(_is_array(x) and x.dtype != dtype for x in leaves)


def _pytorch_computes(op, args, kwargs, message: str) -> bool:
    """Whether PyTorch's CPU kernel accepts these arguments' dtypes (it may promote them out of
    the rejected dtype); ``False`` when it raises the table's error, or any other."""
    from torchlax_core import torch_dtype

    def stand_in(x):
        if isinstance(x, torch.device):
            return torch.device("cpu")
        if not _is_array(x):
            return x
        dtype = x.dtype if isinstance(x, torch.Tensor) else torch_dtype(x.dtype)
        return torch.zeros([1] * len(x.shape), dtype=dtype)

    try:
        op(*tree_map(stand_in, args), **tree_map(stand_in, kwargs))
    except Exception:  # noqa: BLE001  the table's answer stands
        return False
    return True


# -- generated by packages/ops/tools/gen_dtype_support.py; do not edit below --

REJECTED: dict[str, dict[str, tuple[str, str]]] = {
    "aten._log_softmax.default": {
        "bool": (
            "NotImplementedError",
            "\"log_softmax_lastdim_kernel_impl\" not implemented for 'Bool'",
        ),
        "complex128": (
            "NotImplementedError",
            "\"log_softmax_lastdim_kernel_impl\" not implemented for 'ComplexDouble'",
        ),
        "complex64": (
            "NotImplementedError",
            "\"log_softmax_lastdim_kernel_impl\" not implemented for 'ComplexFloat'",
        ),
        "int16": (
            "NotImplementedError",
            "\"log_softmax_lastdim_kernel_impl\" not implemented for 'Short'",
        ),
        "int32": (
            "NotImplementedError",
            "\"log_softmax_lastdim_kernel_impl\" not implemented for 'Int'",
        ),
        "int64": (
            "NotImplementedError",
            "\"log_softmax_lastdim_kernel_impl\" not implemented for 'Long'",
        ),
        "int8": (
            "NotImplementedError",
            "\"log_softmax_lastdim_kernel_impl\" not implemented for 'Char'",
        ),
        "uint8": (
            "NotImplementedError",
            "\"log_softmax_lastdim_kernel_impl\" not implemented for 'Byte'",
        ),
    },
    "aten._softmax.default": {
        "bool": (
            "NotImplementedError",
            "\"softmax_lastdim_kernel_impl\" not implemented for 'Bool'",
        ),
        "complex128": (
            "NotImplementedError",
            "\"softmax_lastdim_kernel_impl\" not implemented for 'ComplexDouble'",
        ),
        "complex64": (
            "NotImplementedError",
            "\"softmax_lastdim_kernel_impl\" not implemented for 'ComplexFloat'",
        ),
        "int16": (
            "NotImplementedError",
            "\"softmax_lastdim_kernel_impl\" not implemented for 'Short'",
        ),
        "int32": (
            "NotImplementedError",
            "\"softmax_lastdim_kernel_impl\" not implemented for 'Int'",
        ),
        "int64": (
            "NotImplementedError",
            "\"softmax_lastdim_kernel_impl\" not implemented for 'Long'",
        ),
        "int8": (
            "NotImplementedError",
            "\"softmax_lastdim_kernel_impl\" not implemented for 'Char'",
        ),
        "uint8": (
            "NotImplementedError",
            "\"softmax_lastdim_kernel_impl\" not implemented for 'Byte'",
        ),
    },
    "aten._unique2.default": {
        "complex128": ("NotImplementedError", "\"unique\" not implemented for 'ComplexDouble'"),
        "complex64": ("NotImplementedError", "\"unique\" not implemented for 'ComplexFloat'"),
    },
    "aten.abs.default": {"bool": ("NotImplementedError", "\"abs_cpu\" not implemented for 'Bool'")},
    "aten.addcmul.default": {
        "bool": ("NotImplementedError", "\"addcmul_cpu_out\" not implemented for 'Bool'")
    },
    "aten.amax.default": {
        "complex128": (
            "NotImplementedError",
            "\"max_values_cpu\" not implemented for 'ComplexDouble'",
        ),
        "complex64": (
            "NotImplementedError",
            "\"max_values_cpu\" not implemented for 'ComplexFloat'",
        ),
    },
    "aten.amin.default": {
        "complex128": (
            "NotImplementedError",
            "\"min_values_cpu\" not implemented for 'ComplexDouble'",
        ),
        "complex64": (
            "NotImplementedError",
            "\"min_values_cpu\" not implemented for 'ComplexFloat'",
        ),
    },
    "aten.aminmax.default": {
        "complex128": (
            "NotImplementedError",
            "\"aminmax_cpu\" not implemented for 'ComplexDouble'",
        ),
        "complex64": ("NotImplementedError", "\"aminmax_cpu\" not implemented for 'ComplexFloat'"),
    },
    "aten.argmax.default": {
        "bool": ("RuntimeError", "argmax(): does not support bool input"),
        "complex128": ("RuntimeError", "argmax(): does not support complex input"),
        "complex64": ("RuntimeError", "argmax(): does not support complex input"),
    },
    "aten.argmin.default": {
        "bool": ("RuntimeError", "argmin(): does not support bool input"),
        "complex128": ("RuntimeError", "argmin(): does not support complex input"),
        "complex64": ("RuntimeError", "argmin(): does not support complex input"),
    },
    "aten.bmm.default": {"bool": ("NotImplementedError", "\"bmm\" not implemented for 'Bool'")},
    "aten.bucketize.Tensor": {
        "complex128": (
            "NotImplementedError",
            "\"searchsorted_out_cpu\" not implemented for 'ComplexDouble'",
        ),
        "complex64": (
            "NotImplementedError",
            "\"searchsorted_out_cpu\" not implemented for 'ComplexFloat'",
        ),
    },
    "aten.ceil.default": {
        "bool": ("NotImplementedError", "\"ceil_vml_cpu\" not implemented for 'Bool'"),
        "complex128": ("NotImplementedError", "ceil is not supported for complex inputs"),
        "complex64": ("NotImplementedError", "ceil is not supported for complex inputs"),
    },
    "aten.clamp.Tensor": {
        "bool": ("NotImplementedError", "\"clamp_cpu\" not implemented for 'Bool'"),
        "complex128": ("NotImplementedError", "clamp is not supported for complex types"),
        "complex64": ("NotImplementedError", "clamp is not supported for complex types"),
    },
    "aten.clamp.default": {
        "complex128": ("NotImplementedError", "clamp is not supported for complex types"),
        "complex64": ("NotImplementedError", "clamp is not supported for complex types"),
    },
    "aten.clamp_max.Tensor": {
        "complex128": (
            "NotImplementedError",
            "\"minimum_cpu\" not implemented for 'ComplexDouble'",
        ),
        "complex64": ("NotImplementedError", "\"minimum_cpu\" not implemented for 'ComplexFloat'"),
    },
    "aten.clamp_max.default": {
        "complex128": ("NotImplementedError", "clamp is not supported for complex types"),
        "complex64": ("NotImplementedError", "clamp is not supported for complex types"),
    },
    "aten.clamp_min.Tensor": {
        "complex128": (
            "NotImplementedError",
            "\"maximum_cpu\" not implemented for 'ComplexDouble'",
        ),
        "complex64": ("NotImplementedError", "\"maximum_cpu\" not implemented for 'ComplexFloat'"),
    },
    "aten.clamp_min.default": {
        "complex128": ("NotImplementedError", "clamp is not supported for complex types"),
        "complex64": ("NotImplementedError", "clamp is not supported for complex types"),
    },
    "aten.cummax.default": {
        "complex128": ("NotImplementedError", "\"cummax_cpu\" not implemented for 'ComplexDouble'"),
        "complex64": ("NotImplementedError", "\"cummax_cpu\" not implemented for 'ComplexFloat'"),
    },
    "aten.cummin.default": {
        "complex128": ("NotImplementedError", "\"cummin_cpu\" not implemented for 'ComplexDouble'"),
        "complex64": ("NotImplementedError", "\"cummin_cpu\" not implemented for 'ComplexFloat'"),
    },
    "aten.dot.default": {"bool": ("NotImplementedError", "\"dot\" not implemented for 'Bool'")},
    "aten.erf.default": {
        "complex128": (
            "NotImplementedError",
            "\"erf_vml_cpu\" not implemented for 'ComplexDouble'",
        ),
        "complex64": ("NotImplementedError", "\"erf_vml_cpu\" not implemented for 'ComplexFloat'"),
    },
    "aten.floor.default": {
        "bool": ("NotImplementedError", "\"floor_vml_cpu\" not implemented for 'Bool'"),
        "complex128": ("NotImplementedError", "floor is not supported for complex inputs"),
        "complex64": ("NotImplementedError", "floor is not supported for complex inputs"),
    },
    "aten.fmax.default": {
        "complex128": ("RuntimeError", "fmax not implemented for complex tensors."),
        "complex64": ("RuntimeError", "fmax not implemented for complex tensors."),
    },
    "aten.fmin.default": {
        "complex128": ("RuntimeError", "fmin not implemented for complex tensors."),
        "complex64": ("RuntimeError", "fmin not implemented for complex tensors."),
    },
    "aten.frac.default": {
        "bool": ("NotImplementedError", "\"frac_cpu\" not implemented for 'Bool'"),
        "complex128": ("NotImplementedError", "\"frac_cpu\" not implemented for 'ComplexDouble'"),
        "complex64": ("NotImplementedError", "\"frac_cpu\" not implemented for 'ComplexFloat'"),
        "int16": ("NotImplementedError", "\"frac_cpu\" not implemented for 'Short'"),
        "int32": ("NotImplementedError", "\"frac_cpu\" not implemented for 'Int'"),
        "int64": ("NotImplementedError", "\"frac_cpu\" not implemented for 'Long'"),
        "int8": ("NotImplementedError", "\"frac_cpu\" not implemented for 'Char'"),
        "uint8": ("NotImplementedError", "\"frac_cpu\" not implemented for 'Byte'"),
    },
    "aten.ge.Tensor": {
        "complex128": ("NotImplementedError", "\"ge_cpu\" not implemented for 'ComplexDouble'"),
        "complex64": ("NotImplementedError", "\"ge_cpu\" not implemented for 'ComplexFloat'"),
    },
    "aten.gelu.default": {
        "bool": ("NotImplementedError", "\"GeluKernelImpl\" not implemented for 'Bool'"),
        "complex128": (
            "NotImplementedError",
            "\"GeluKernelImpl\" not implemented for 'ComplexDouble'",
        ),
        "complex64": (
            "NotImplementedError",
            "\"GeluKernelImpl\" not implemented for 'ComplexFloat'",
        ),
        "int16": ("NotImplementedError", "\"GeluKernelImpl\" not implemented for 'Short'"),
        "int32": ("NotImplementedError", "\"GeluKernelImpl\" not implemented for 'Int'"),
        "int64": ("NotImplementedError", "\"GeluKernelImpl\" not implemented for 'Long'"),
        "int8": ("NotImplementedError", "\"GeluKernelImpl\" not implemented for 'Char'"),
        "uint8": ("NotImplementedError", "\"GeluKernelImpl\" not implemented for 'Byte'"),
    },
    "aten.gt.Tensor": {
        "complex128": ("NotImplementedError", "\"gt_cpu\" not implemented for 'ComplexDouble'"),
        "complex64": ("NotImplementedError", "\"gt_cpu\" not implemented for 'ComplexFloat'"),
    },
    "aten.hardtanh.default": {
        "bool": ("NotImplementedError", "Bool inputs not supported for hardtanh"),
        "complex128": ("NotImplementedError", "clamp is not supported for complex types"),
        "complex64": ("NotImplementedError", "clamp is not supported for complex types"),
    },
    "aten.heaviside.default": {
        "complex128": ("RuntimeError", "heaviside is not yet implemented for complex tensors."),
        "complex64": ("RuntimeError", "heaviside is not yet implemented for complex tensors."),
    },
    "aten.histc.default": {
        "bool": ("NotImplementedError", "\"linspace_cpu\" not implemented for 'Bool'"),
        "complex128": (
            "NotImplementedError",
            "\"histogram_cpu\" not implemented for 'ComplexDouble'",
        ),
        "complex64": (
            "NotImplementedError",
            "\"histogram_cpu\" not implemented for 'ComplexFloat'",
        ),
        "int16": ("NotImplementedError", "\"histogram_cpu\" not implemented for 'Short'"),
        "int32": ("NotImplementedError", "\"histogram_cpu\" not implemented for 'Int'"),
        "int64": ("NotImplementedError", "\"histogram_cpu\" not implemented for 'Long'"),
        "int8": ("NotImplementedError", "\"histogram_cpu\" not implemented for 'Char'"),
        "uint8": ("NotImplementedError", "\"histogram_cpu\" not implemented for 'Byte'"),
    },
    "aten.isin.Tensor_Tensor": {
        "bool": ("RuntimeError", "Unsupported input type encountered for isin(): Bool"),
        "complex128": (
            "RuntimeError",
            "Unsupported input type encountered for isin(): ComplexDouble",
        ),
        "complex64": (
            "RuntimeError",
            "Unsupported input type encountered for isin(): ComplexFloat",
        ),
    },
    "aten.kthvalue.default": {
        "bool": ("NotImplementedError", "\"kthvalue_cpu\" not implemented for 'Bool'"),
        "complex128": (
            "NotImplementedError",
            "\"kthvalue_cpu\" not implemented for 'ComplexDouble'",
        ),
        "complex64": ("NotImplementedError", "\"kthvalue_cpu\" not implemented for 'ComplexFloat'"),
    },
    "aten.le.Tensor": {
        "complex128": ("NotImplementedError", "\"le_cpu\" not implemented for 'ComplexDouble'"),
        "complex64": ("NotImplementedError", "\"le_cpu\" not implemented for 'ComplexFloat'"),
    },
    "aten.lt.Tensor": {
        "complex128": ("NotImplementedError", "\"lt_cpu\" not implemented for 'ComplexDouble'"),
        "complex64": ("NotImplementedError", "\"lt_cpu\" not implemented for 'ComplexFloat'"),
    },
    "aten.max.default": {
        "complex128": ("NotImplementedError", "\"max_all\" not implemented for 'ComplexDouble'"),
        "complex64": ("NotImplementedError", "\"max_all\" not implemented for 'ComplexFloat'"),
    },
    "aten.max.dim": {
        "complex128": ("RuntimeError", "max(): does not support complex input"),
        "complex64": ("RuntimeError", "max(): does not support complex input"),
    },
    "aten.maximum.default": {
        "complex128": ("RuntimeError", "maximum not implemented for complex tensors."),
        "complex64": ("RuntimeError", "maximum not implemented for complex tensors."),
    },
    "aten.median.default": {
        "bool": ("NotImplementedError", "\"median_cpu\" not implemented for 'Bool'"),
        "complex128": ("NotImplementedError", "\"median_cpu\" not implemented for 'ComplexDouble'"),
        "complex64": ("NotImplementedError", "\"median_cpu\" not implemented for 'ComplexFloat'"),
    },
    "aten.median.dim": {
        "bool": ("NotImplementedError", "\"median_out\" not implemented for 'Bool'"),
        "complex128": ("NotImplementedError", "\"median_out\" not implemented for 'ComplexDouble'"),
        "complex64": ("NotImplementedError", "\"median_out\" not implemented for 'ComplexFloat'"),
    },
    "aten.min.default": {
        "complex128": ("NotImplementedError", "\"min_all\" not implemented for 'ComplexDouble'"),
        "complex64": ("NotImplementedError", "\"min_all\" not implemented for 'ComplexFloat'"),
    },
    "aten.min.dim": {
        "complex128": ("RuntimeError", "min(): does not support complex input"),
        "complex64": ("RuntimeError", "min(): does not support complex input"),
    },
    "aten.minimum.default": {
        "complex128": ("RuntimeError", "minimum not implemented for complex tensors."),
        "complex64": ("RuntimeError", "minimum not implemented for complex tensors."),
    },
    "aten.mm.default": {
        "bool": ("NotImplementedError", "\"addmm_impl_cpu_\" not implemented for 'Bool'")
    },
    "aten.mode.default": {
        "complex128": ("NotImplementedError", "\"mode_cpu\" not implemented for 'ComplexDouble'"),
        "complex64": ("NotImplementedError", "\"mode_cpu\" not implemented for 'ComplexFloat'"),
    },
    "aten.mv.default": {
        "bool": ("NotImplementedError", "\"addmv_impl_cpu\" not implemented for 'Bool'")
    },
    "aten.nanmedian.default": {
        "bool": ("NotImplementedError", "\"median_cpu\" not implemented for 'Bool'"),
        "complex128": ("NotImplementedError", "\"median_cpu\" not implemented for 'ComplexDouble'"),
        "complex64": ("NotImplementedError", "\"median_cpu\" not implemented for 'ComplexFloat'"),
    },
    "aten.nanmedian.dim": {
        "bool": ("NotImplementedError", "\"median_out\" not implemented for 'Bool'"),
        "complex128": ("NotImplementedError", "\"median_out\" not implemented for 'ComplexDouble'"),
        "complex64": ("NotImplementedError", "\"median_out\" not implemented for 'ComplexFloat'"),
    },
    "aten.neg.default": {
        "bool": (
            "NotImplementedError",
            "Negation, the `-` operator, on a bool tensor is not supported. If "
            "you are trying to invert a mask, use the `~` or `logical_not()` "
            "operator instead.",
        )
    },
    "aten.relu.default": {
        "bool": ("NotImplementedError", "Boolean inputs not supported for relu"),
        "complex128": ("NotImplementedError", "clamp is not supported for complex types"),
        "complex64": ("NotImplementedError", "clamp is not supported for complex types"),
    },
    "aten.round.decimals": {
        "bool": ("NotImplementedError", "\"round_vml_cpu\" not implemented for 'Bool'"),
        "complex128": (
            "NotImplementedError",
            "\"round_vml_cpu\" not implemented for 'ComplexDouble'",
        ),
        "complex64": (
            "NotImplementedError",
            "\"round_vml_cpu\" not implemented for 'ComplexFloat'",
        ),
        "int16": ("NotImplementedError", "\"round_vml_cpu\" not implemented for 'Short'"),
        "int32": ("NotImplementedError", "\"round_vml_cpu\" not implemented for 'Int'"),
        "int64": ("NotImplementedError", "\"round_vml_cpu\" not implemented for 'Long'"),
        "int8": ("NotImplementedError", "\"round_vml_cpu\" not implemented for 'Char'"),
        "uint8": ("NotImplementedError", "\"round_vml_cpu\" not implemented for 'Byte'"),
    },
    "aten.round.default": {
        "bool": ("NotImplementedError", "\"round_vml_cpu\" not implemented for 'Bool'"),
        "complex128": (
            "NotImplementedError",
            "\"round_vml_cpu\" not implemented for 'ComplexDouble'",
        ),
        "complex64": (
            "NotImplementedError",
            "\"round_vml_cpu\" not implemented for 'ComplexFloat'",
        ),
    },
    "aten.rsub.Tensor": {
        "bool": (
            "NotImplementedError",
            "Subtraction, the `-` operator, with two bool tensors is not "
            "supported. Use the `^` or `logical_xor()` operator instead.",
        )
    },
    "aten.searchsorted.Tensor": {
        "complex128": (
            "NotImplementedError",
            "\"searchsorted_out_cpu\" not implemented for 'ComplexDouble'",
        ),
        "complex64": (
            "NotImplementedError",
            "\"searchsorted_out_cpu\" not implemented for 'ComplexFloat'",
        ),
    },
    "aten.sign.default": {
        "complex128": (
            "NotImplementedError",
            "Unlike NumPy, torch.sign is not intended to support complex "
            "numbers. Please use torch.sgn instead.",
        ),
        "complex64": (
            "NotImplementedError",
            "Unlike NumPy, torch.sign is not intended to support complex "
            "numbers. Please use torch.sgn instead.",
        ),
    },
    "aten.silu.default": {
        "bool": ("NotImplementedError", "\"silu_cpu\" not implemented for 'Bool'"),
        "int16": ("NotImplementedError", "\"silu_cpu\" not implemented for 'Short'"),
        "int32": ("NotImplementedError", "\"silu_cpu\" not implemented for 'Int'"),
        "int64": ("NotImplementedError", "\"silu_cpu\" not implemented for 'Long'"),
        "int8": ("NotImplementedError", "\"silu_cpu\" not implemented for 'Char'"),
        "uint8": ("NotImplementedError", "\"silu_cpu\" not implemented for 'Byte'"),
    },
    "aten.sort.default": {
        "complex128": ("RuntimeError", " Sort does not support complex dtypes on CPU"),
        "complex64": ("RuntimeError", " Sort does not support complex dtypes on CPU"),
    },
    "aten.sort.stable": {
        "complex128": ("RuntimeError", " Sort does not support complex dtypes on CPU"),
        "complex64": ("RuntimeError", " Sort does not support complex dtypes on CPU"),
    },
    "aten.sub.Tensor": {
        "bool": (
            "NotImplementedError",
            "Subtraction, the `-` operator, with two bool tensors is not "
            "supported. Use the `^` or `logical_xor()` operator instead.",
        )
    },
    "aten.topk.default": {
        "bool": ("RuntimeError", "topk does not support bool dtypes on CPU"),
        "complex128": ("RuntimeError", " topk does not support complex dtypes on CPU"),
        "complex64": ("RuntimeError", " topk does not support complex dtypes on CPU"),
    },
    "aten.trunc.default": {
        "bool": ("NotImplementedError", "\"trunc_vml_cpu\" not implemented for 'Bool'"),
        "complex128": ("NotImplementedError", "trunc is not supported for complex inputs"),
        "complex64": ("NotImplementedError", "trunc is not supported for complex inputs"),
    },
    "aten.unique_consecutive.default": {
        "complex128": ("NotImplementedError", "\"unique\" not implemented for 'ComplexDouble'"),
        "complex64": ("NotImplementedError", "\"unique\" not implemented for 'ComplexFloat'"),
    },
    "aten.unique_dim.default": {
        "complex128": ("NotImplementedError", "\"unique_dim\" not implemented for 'ComplexDouble'"),
        "complex64": ("NotImplementedError", "\"unique_dim\" not implemented for 'ComplexFloat'"),
    },
}
