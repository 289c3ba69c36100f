"""Pointwise ops: arithmetic, comparisons, math functions."""

from __future__ import annotations

import jax.numpy as jnp
import torch

from .._promotion import Promotion, elementwise
from .._table import lowering

aten = torch.ops.aten


def _scaled(other, alpha):
    return other if alpha == 1 else other * alpha


@lowering(aten.add.Tensor, aten.add.Scalar)
@elementwise(("self", "other"), Promotion.DEFAULT)
def add(self, other, *, alpha=1):
    return jnp.add(self, _scaled(other, alpha))


@lowering(aten.sub.Tensor, aten.sub.Scalar)
@elementwise(("self", "other"), Promotion.DEFAULT)
def sub(self, other, *, alpha=1):
    return jnp.subtract(self, _scaled(other, alpha))


@lowering(aten.mul.Tensor, aten.mul.Scalar)
@elementwise(("self", "other"), Promotion.DEFAULT)
def mul(self, other):
    return jnp.multiply(self, other)
