"""Backward ops no forward family lowers: the gradients of views and of weight norm.

Each is the ``jax.vjp`` of its forward (exact: the view forwards are linear, so the pullback is
their transpose, a scatter-add XLA fuses).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .. import _aten
from .._table import lowering

aten = _aten.aten  # (an op this torch lacks: a Missing, skipped)


def _pullback(forward, input_sizes, dtype, grad):
    """The transpose of the linear map ``forward`` (on arrays of ``input_sizes``) at ``grad``."""
    _, pull = jax.vjp(forward, jnp.zeros(tuple(input_sizes), dtype))
    return pull(grad)[0]


@lowering(aten.diagonal_backward.default)
def diagonal_backward(grad_output, input_sizes, offset, dim1, dim2):
    def diagonal(x):
        return jnp.diagonal(x, offset, dim1, dim2)

    return _pullback(diagonal, input_sizes, grad_output.dtype, grad_output)


def _unfold(x, dimension, size, step):
    """Tensor.unfold: windows of ``size`` every ``step`` along ``dimension``, as a last dim."""
    if x.ndim == 0:
        return x.reshape(1)
    windows = (x.shape[dimension] - size) // step + 1
    index = jnp.arange(windows)[:, None] * step + jnp.arange(size)[None, :]
    return jnp.moveaxis(jnp.take(x, index, axis=dimension), dimension + 1, -1)


@lowering(aten.unfold_backward.default)
def unfold_backward(grad_in, input_size, dimension, size, step):
    dimension = dimension % max(len(input_size), 1)

    def unfold(x):
        return _unfold(x, dimension, size, step)

    return _pullback(unfold, input_size, grad_in.dtype, grad_in)


@lowering(aten._weight_norm_interface_backward.default)
def _weight_norm_interface_backward(grad_w, saved_v, saved_g, saved_norms, dim):
    # w = v * (g / ||v||), the norm over every dim but ``dim`` (PyTorch's fused kernel takes
    # only the first or the last dim).
    axes = tuple(a for a in range(saved_v.ndim) if a != dim % saved_v.ndim)

    def weight(v, g):
        norm = jnp.sqrt(jnp.sum(v * v, axis=axes, keepdims=True))
        return v * (g / norm)

    _, pull = jax.vjp(weight, saved_v, saved_g)
    grad_v, grad_g = pull(grad_w.astype(saved_v.dtype))
    return grad_v, grad_g
