"""``F.linear`` of an N-D input (N >= 3) on the jax device is one N-D product, both ways.

PyTorch's composite flattens the leading dimensions around a 2-D ``mm``; torchlax keeps the
product N-D (``torchlax_ops::linear``, packages/ops ``_lowerings/linear.py``) so that XLA can
fuse a following slice or its gradient's pad into it. Values, dtypes, gradients (also second
order) and errors are PyTorch's; the programs are read from their StableHLO.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest
import torch
import torch.nn.functional as F
import torchlax
import torchlax_core
from _compare_cpu import assert_same, stablehlo_with_grads, to_jax
from torchlax_core.internal import tracing


def _traced(fn, *tensors):
    """``fn`` of ``tensors`` moved to the jax device, traced by ``jax.jit`` (None passes)."""
    env = torchlax_core.default_env()
    present = [t for t in tensors if t is not None]
    spec = {}

    def program(*arrays):
        with tracing(env):
            moved = iter(torchlax.torch_view(a).requires_grad_() for a in arrays)
            out = fn(*[None if t is None else next(moved) for t in tensors])
            spec["tree"] = out
            return torchlax.jax_view(out)

    with torchlax_core.enable():
        arrays = jax.jit(program)(
            *[
                jnp.asarray(t.detach().float().numpy()).astype(torchlax_core.jax_dtype(t.dtype))
                for t in present
            ]
        )
        return torchlax.torch_view(arrays)


def _grads(x, w, b):
    out = F.linear(x, w, b)
    g = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape).to(out.device)
    wanted = [t for t in (x, w, b) if t is not None]
    return out, torch.autograd.grad(out, wanted, g)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(2, 5, 4), (3, 2, 2, 4), (2, 0, 4)])
def test_values_and_gradients_match_pytorch(shape, bias, dtype):
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=dtype, requires_grad=True)
    w = torch.randn(3, 4, dtype=dtype, requires_grad=True)
    b = torch.randn(3, dtype=dtype, requires_grad=True) if bias else None
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    assert_same(_traced(_grads, x, w, b), _grads(x, w, b), atol=tol, rtol=tol)


def test_second_order_gradients_match_pytorch():
    torch.manual_seed(0)

    def run(x, w):
        (gx,) = torch.autograd.grad(F.linear(x, w).square().sum(), x, create_graph=True)
        return torch.autograd.grad(gx.square().sum(), (x, w))

    x = torch.randn(2, 3, 4, requires_grad=True)
    w = torch.randn(5, 4, requires_grad=True)
    assert_same(_traced(run, x, w), run(x, w), atol=1e-4, rtol=1e-4)


def _program(fn, *shapes):
    return stablehlo_with_grads(fn, [jnp.ones(s, jnp.float32) for s in shapes])


_DOT = re.compile(r"stablehlo\.dot_general.*")


def _product_operand_ranks(text):
    ranks = []
    for line in _DOT.findall(text):
        operands = line.rsplit(" : ", 1)[1].split("->")[0]
        ranks.append(tuple(t.count("x") for t in re.findall(r"tensor<([^>]*)>", operands)))
    return ranks


def test_forward_and_backward_products_keep_the_leading_dimensions():
    def logits(x, w):
        return F.linear(x, w)[:, :-1]  # a following slice, as a causal LM's loss takes

    text = _program(logits, (2, 6, 8), (5, 8))
    # forward x·wᵀ and the input's gradient g·w: (2, 6, ·) with (5, 8); the weight's
    # gradient contracts both leading dimensions of g and x.
    assert sorted(_product_operand_ranks(text)) == [(3, 2), (3, 2), (3, 3)]
    assert "stablehlo.reshape" not in text


def test_two_dimensional_inputs_keep_pytorchs_product():
    text = _program(F.linear, (6, 8), (5, 8))
    assert _product_operand_ranks(text) and all(r == (2, 2) for r in _product_operand_ranks(text))


def test_bad_input_raises_pytorchs_error_and_leaves_tensors_alone():
    cases = [
        (torch.randn(2, 3, 4), torch.randn(5, 3), None),  # in_features mismatch
        (torch.randn(2, 3, 4), torch.randn(5, 4, dtype=torch.float64), None),  # mixed dtypes
        (torch.randn(2, 3, 4), torch.randn(5, 4), torch.randn(4)),  # bias of the wrong size
    ]
    for x, w, b in cases:
        with pytest.raises(RuntimeError) as expected:
            F.linear(x, w, b)
        with torchlax_core.enable():
            xj, wj, bj = to_jax((x, w, b))
            before = [t.cpu().clone() for t in (xj, wj, bj) if t is not None]
            with pytest.raises(type(expected.value)) as actual:
                F.linear(xj, wj, bj)
            after = [t.cpu() for t in (xj, wj, bj) if t is not None]
        # (torchlax's message goes on to name the op that raised it)
        assert str(actual.value).startswith(str(expected.value).split("\n")[0])
        for a, e in zip(after, before, strict=True):
            assert torch.equal(a, e)


def test_eager_calls_keep_pytorchs_composite():
    with torchlax_core.enable():
        x, w = to_jax((torch.randn(2, 3, 4, requires_grad=True), torch.randn(5, 4)))
        out = F.linear(x, w)
    assert "torchlax" not in type(out.grad_fn).__name__


def test_cpu_tensors_keep_pytorchs_composite():
    x = torch.randn(2, 3, 4, requires_grad=True)
    out = F.linear(x, torch.randn(5, 4))
    assert "torchlax" not in type(out.grad_fn).__name__


def test_the_op_off_the_jax_device_is_pytorchs_linear():
    x, w, b = torch.randn(2, 3, 4), torch.randn(5, 4), torch.randn(5)
    torch.testing.assert_close(torch.ops.torchlax_ops.linear(x, w, b), F.linear(x, w, b))
    g = torch.randn(2, 3, 5)
    expected = torch.einsum("bso,bsi->oi", g, x)
    torch.testing.assert_close(torch.ops.torchlax_ops.linear_weight_grad(g, x), expected)
