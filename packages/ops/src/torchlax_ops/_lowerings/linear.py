"""``F.linear`` of an input with three or more dimensions as one N-D product.

PyTorch's composite ``linear`` flattens the input's leading dimensions (``view(-1, in)``, ``mm``,
``view`` back). In a traced program XLA then sees reshapes around a 2-D product: it cannot move
what follows (a slice such as ``logits[:, :-1]``, its gradient's pad) into the product, and on
a TPU it lays the result out again (GPT-2's logits: three extra copies). On the jax device the
decomposition below calls ``torchlax_ops::linear`` instead, a product over the last dimension
as ``jnp.einsum`` or a hand-written JAX model writes it. Its backward is products of the same
kind (the input's gradient another ``linear``, the weight's one contracting every leading
dimension, ``linear_weight_grad``), so the program stays N-D both ways; values are those of
the flattened product. Eager calls, and anything else (2-D inputs, mixed dtypes, shapes that do
not match), take PyTorch's composite, with its errors.
"""

from __future__ import annotations

import jax
import jax.core
import torch
from torchlax_core import Tensor, unwrap

from .. import _aten
from .._precision import product_precision
from .._promotion import accumulator
from .._table import decomposition, lowering

aten = _aten.aten  # (an op this torch lacks: a Missing, skipped)


@torch.library.custom_op("torchlax_ops::linear", mutates_args=())
def _linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    # Off the jax device (a fake or CPU tensor reaching the op): PyTorch's own.
    return torch.nn.functional.linear(input, weight, bias)


@torch.library.custom_op("torchlax_ops::linear_weight_grad", mutates_args=())
def _linear_weight_grad(grad: torch.Tensor, input: torch.Tensor) -> torch.Tensor:
    return grad.reshape(-1, grad.shape[-1]).t() @ input.reshape(-1, input.shape[-1])


@_linear.register_fake
def _linear_fake(input, weight, bias):
    return input.new_empty((*input.shape[:-1], weight.shape[0]))


@_linear_weight_grad.register_fake
def _linear_weight_grad_fake(grad, input):
    return grad.new_empty((grad.shape[-1], input.shape[-1]))


def _linear_setup(ctx, inputs, output):
    input, weight, bias = inputs
    ctx.save_for_backward(input, weight)
    ctx.has_bias = bias is not None


def _linear_backward(ctx, grad):
    input, weight = ctx.saved_tensors
    wants_input, wants_weight, wants_bias = ctx.needs_input_grad
    return (
        torch.ops.torchlax_ops.linear(grad, weight.t(), None) if wants_input else None,
        torch.ops.torchlax_ops.linear_weight_grad(grad, input) if wants_weight else None,
        grad.sum(tuple(range(grad.dim() - 1))) if ctx.has_bias and wants_bias else None,
    )


def _weight_grad_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _weight_grad_backward(ctx, grad):
    # d(gᵀx)/dg = x·Hᵀ and d(gᵀx)/dx = g·H for an upstream H of the weight's shape.
    out_grad, input = ctx.saved_tensors
    wants_grad, wants_input = ctx.needs_input_grad
    return (
        torch.ops.torchlax_ops.linear(input, grad, None) if wants_grad else None,
        torch.ops.torchlax_ops.linear(out_grad, grad.t(), None) if wants_input else None,
    )


_linear.register_autograd(_linear_backward, setup_context=_linear_setup)
_linear_weight_grad.register_autograd(_weight_grad_backward, setup_context=_weight_grad_setup)


def _traced(input) -> bool:
    # Eagerly every op is a program of its own: the N-D product buys nothing there, and the
    # custom op's dispatch costs more than the composite's three ops.
    if torch.compiler.is_compiling():  # torchlax.jit, torch.compile
        return True
    return isinstance(input, Tensor) and isinstance(unwrap(input), jax.core.Tracer)


def _kept_whole(input, weight, bias) -> bool:
    """Whether ``linear(input, weight, bias)`` is one N-D product with PyTorch's values, in a
    traced program."""
    return (
        input.dim() >= 3
        and weight.dim() == 2
        and input.is_floating_point()
        and weight.dtype == input.dtype
        and input.shape[-1] == weight.shape[1]
        and (bias is None or (bias.dtype == input.dtype and bias.shape == weight.shape[:1]))
        and _traced(input)
    )


@decomposition(aten.linear.default)
def linear(input, weight, bias=None):
    if _kept_whole(input, weight, bias):
        return torch.ops.torchlax_ops.linear(input, weight, bias)
    return aten.linear.default.decompose(input, weight, bias)


# -- lowerings ----------------------------------------------------------------------------------


def _product(a, b, contracting):
    """``a`` and ``b`` contracted over ``contracting``, accumulated as PyTorch's kernels do."""
    return jax.lax.dot_general(
        a,
        b,
        (contracting, ((), ())),
        precision=product_precision(a.dtype),
        preferred_element_type=accumulator(a.dtype),
    )


@lowering(torch.ops.torchlax_ops.linear.default)
def linear_nd(input, weight, bias=None):
    out = _product(input, weight, ((input.ndim - 1,), (1,)))
    if bias is not None:
        out = out + bias.astype(out.dtype)  # in the accumulator, rounded once (as addmm)
    return out.astype(input.dtype)


@lowering(torch.ops.torchlax_ops.linear_weight_grad.default)
def linear_weight_grad(grad, input):
    leading = tuple(range(grad.ndim - 1))
    return _product(grad, input, (leading, leading)).astype(grad.dtype)
