"""One-to-one mapping between torch and JAX dtypes.

PyTorch's dtype is the contract: a torchlax Tensor always reports the torch dtype whose JAX
counterpart its array holds. Nothing is narrowed; a dtype JAX cannot hold raises.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch

from ._errors import UnsupportedDtypeError

_TORCH_TO_JAX: dict[torch.dtype, np.dtype] = {
    torch.bool: jnp.dtype(jnp.bool_),
    torch.uint8: jnp.dtype(jnp.uint8),
    torch.uint16: jnp.dtype(jnp.uint16),
    torch.uint32: jnp.dtype(jnp.uint32),
    torch.uint64: jnp.dtype(jnp.uint64),
    torch.int8: jnp.dtype(jnp.int8),
    torch.int16: jnp.dtype(jnp.int16),
    torch.int32: jnp.dtype(jnp.int32),
    torch.int64: jnp.dtype(jnp.int64),
    torch.float16: jnp.dtype(jnp.float16),
    torch.bfloat16: jnp.dtype(jnp.bfloat16),
    torch.float32: jnp.dtype(jnp.float32),
    torch.float64: jnp.dtype(jnp.float64),
    torch.complex64: jnp.dtype(jnp.complex64),
    torch.complex128: jnp.dtype(jnp.complex128),
    torch.float8_e4m3fn: jnp.dtype(jnp.float8_e4m3fn),
    torch.float8_e5m2: jnp.dtype(jnp.float8_e5m2),
    torch.float8_e4m3fnuz: jnp.dtype(jnp.float8_e4m3fnuz),
    torch.float8_e5m2fnuz: jnp.dtype(jnp.float8_e5m2fnuz),
}
_JAX_TO_TORCH: dict[np.dtype, torch.dtype] = {v: k for k, v in _TORCH_TO_JAX.items()}

DTYPES: tuple[torch.dtype, ...] = tuple(_TORCH_TO_JAX)
"""Every torch dtype a torchlax Tensor can hold."""

COMPUTE_DTYPES: tuple[torch.dtype, ...] = (
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
)
"""The dtypes PyTorch's CPU kernels compute in (its ``all_types_and_complex_and(bool, float16,
bfloat16)``, what OpInfo samples use): ``DTYPES`` less the wide unsigned and float8 types,
which PyTorch mostly only stores and converts."""


def jax_dtype(dtype: torch.dtype) -> np.dtype:
    """The JAX dtype that holds torch ``dtype`` exactly; raises for one JAX cannot hold."""
    try:
        return _TORCH_TO_JAX[dtype]
    except KeyError:
        raise UnsupportedDtypeError(
            f"torch dtype {dtype} has no JAX counterpart, so a torchlax Tensor cannot hold it. "
            f"Convert the tensor to a supported dtype first (supported: "
            f"{', '.join(str(d) for d in _TORCH_TO_JAX)}).",
            dtype=dtype,
        ) from None


def torch_dtype(dtype) -> torch.dtype:
    """The torch dtype for a JAX/NumPy dtype; raises for one torch cannot hold."""
    try:
        return _JAX_TO_TORCH[np.dtype(dtype)]
    except (KeyError, TypeError):
        raise UnsupportedDtypeError(
            f"JAX dtype {dtype} has no torch counterpart, so it cannot become a torchlax Tensor."
        ) from None


# PyTorch's names of dtypes in its error messages (c10's ScalarType names: "Long" for int64),
# one map for every message torchlax writes in PyTorch's words. It names the dtypes a promotion
# reaches that no torchlax Tensor holds (complex32, ...) too.
_SCALAR_TYPE_NAMES: dict[torch.dtype, str] = {
    torch.bool: "Bool",
    torch.uint8: "Byte",
    torch.uint16: "UInt16",
    torch.uint32: "UInt32",
    torch.uint64: "UInt64",
    torch.int8: "Char",
    torch.int16: "Short",
    torch.int32: "Int",
    torch.int64: "Long",
    torch.float16: "Half",
    torch.bfloat16: "BFloat16",
    torch.float32: "Float",
    torch.float64: "Double",
    torch.complex32: "ComplexHalf",
    torch.complex64: "ComplexFloat",
    torch.complex128: "ComplexDouble",
    torch.float8_e4m3fn: "Float8_e4m3fn",
    torch.float8_e5m2: "Float8_e5m2",
    torch.float8_e4m3fnuz: "Float8_e4m3fnuz",
    torch.float8_e5m2fnuz: "Float8_e5m2fnuz",
}
if hasattr(torch, "bcomplex32"):  # (bfloat16 + 1j promotes to it, in recent PyTorch)
    _SCALAR_TYPE_NAMES[torch.bcomplex32] = "BComplex32"  # pyright: ignore[reportAttributeAccessIssue]  (absent from older torch stubs)


def scalar_type_name(x) -> str:
    """PyTorch's name of a dtype in its error messages (``'Long'``, ``'ComplexFloat'``): ``x`` a
    torch dtype, a JAX/NumPy dtype, or an array (its dtype)."""
    if not isinstance(x, torch.dtype):
        dtype = np.dtype(getattr(x, "dtype", x))
        x = _JAX_TO_TORCH.get(dtype)
        if x is None:  # (a JAX dtype torch lacks: int4, ...)
            return dtype.name
    return _SCALAR_TYPE_NAMES.get(x, str(x).removeprefix("torch."))
