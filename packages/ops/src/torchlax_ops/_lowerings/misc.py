"""Ops real models call that belong to no other family: set membership (``isin``)."""

from __future__ import annotations

import jax.numpy as jnp
import torch

from .._promotion import Promotion, result_dtypes
from .._table import lowering

aten = torch.ops.aten


def _isin(elements, test_elements, invert):
    # Compare in the promoted dtype, as PyTorch does; every element against every test value
    # is one fused broadcast-compare-reduce (static shapes, no sort, no host sync).
    common, _ = result_dtypes((elements, test_elements), Promotion.NO_OPMATH)
    elements = jnp.asarray(elements).astype(common)
    tests = jnp.ravel(jnp.asarray(test_elements).astype(common))
    found = jnp.any(elements[..., None] == tests, axis=-1)
    return jnp.logical_not(found) if invert else found


@lowering(aten.isin.Tensor_Tensor)
def isin_tensor_tensor(elements, test_elements, *, assume_unique=False, invert=False):
    return _isin(elements, test_elements, invert)


@lowering(aten.isin.Tensor_Scalar)
def isin_tensor_scalar(elements, test_element, *, assume_unique=False, invert=False):
    return _isin(elements, test_element, invert)


@lowering(aten.isin.Scalar_Tensor)
def isin_scalar_tensor(element, test_elements, *, assume_unique=False, invert=False):
    return _isin(element, test_elements, invert)
