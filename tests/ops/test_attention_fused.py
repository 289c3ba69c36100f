"""scaled_dot_product_attention on the jax device as one fused op, forward and backward.

PyTorch's composite would run its math path op by op; the jax device takes the overrideable
fused op instead (attention.py). Each case compares values and gradients with eager CPU PyTorch
and checks which path ran (the autograd node), so a silent fall back to math fails here.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import torchlax
import torchlax_core
from torch.nn.attention import SDPBackend, sdpa_kernel

FUSED = "ScaledDotProductFusedAttentionOverrideableBackward0"


def _inputs(q_heads=2, kv_heads=2, length=5, source=6, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)

    def leaf(*shape):
        return torch.randn(*shape, generator=g).to(dtype).requires_grad_()

    return leaf(2, q_heads, length, 8), leaf(2, kv_heads, source, 8), leaf(2, kv_heads, source, 4)


def _on_jax(tensors):
    with torchlax_core.enable():
        return [t.detach().to("jax").requires_grad_(t.requires_grad) for t in tensors]


def _run(fn, tensors):
    """(output, gradients) of ``fn`` on ``tensors``; the backward seeds a non-uniform gradient."""
    out = fn(*tensors)
    weight = torch.linspace(-1, 1, out.numel(), dtype=torch.float32).reshape(out.shape)
    (out * weight.to(out.device, out.dtype)).sum().backward()
    return out, [t.grad for t in tensors if t.requires_grad]


def _compare(fn, tensors, *, atol=2e-5, rtol=1e-5):
    expected, expected_grads = _run(fn, tensors)
    jax_tensors = _on_jax(tensors)
    with torchlax_core.enable():
        got, grads = _run(fn, jax_tensors)
    assert type(got.grad_fn).__name__ == FUSED
    assert got.dtype == expected.dtype and got.shape == expected.shape
    torch.testing.assert_close(got.detach().cpu(), expected.detach(), atol=atol, rtol=rtol)
    assert len(grads) == len(expected_grads)
    for g, e in zip(grads, expected_grads, strict=True):
        assert g.dtype == e.dtype and g.shape == e.shape
        torch.testing.assert_close(g.cpu(), e, atol=atol, rtol=rtol)


_BOOL_MASK = torch.tensor([[True, False, True, True, False, True]] * 5)
_FLOAT_MASK = torch.linspace(-2, 1, 30).reshape(5, 6)

CASES = {
    "plain": lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
    "causal_scale": lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, is_causal=True, scale=0.3
    ),
    "bool_mask": lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, attn_mask=_BOOL_MASK.to(q.device)
    ),
    "float_mask": lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, attn_mask=_FLOAT_MASK.to(q.device)
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_fused_attention_matches_cpu(name):
    _compare(CASES[name], _inputs())


def test_fully_masked_rows_give_zeros_and_zero_gradients():
    mask = torch.ones(2, 1, 5, 6, dtype=torch.bool)
    mask[0, 0, 1] = False  # a whole row masked out
    mask[1, 0, :, 2:] = False

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.device))

    _compare(fn, _inputs())
    float_mask = torch.zeros(5, 6).masked_fill(~mask[0, 0], float("-inf"))
    _compare(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=float_mask.to(q.device)),
        _inputs(),
    )


def test_gradient_of_a_float_mask():
    bias = torch.randn(2, 1, 5, 6).requires_grad_()
    _compare(
        lambda q, k, v, b: F.scaled_dot_product_attention(q, k, v, attn_mask=b), [*_inputs(), bias]
    )


def test_grouped_query_attention():
    _compare(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
        _inputs(q_heads=4, kv_heads=2, source=5),
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(dtype):
    _compare(CASES["causal_scale"], _inputs(dtype=dtype), atol=2e-2, rtol=2e-2)


def test_dropout_is_seeded_and_backward_uses_the_forward_mask():
    # The output is linear in v: out = Z v with Z the dropped-out weights. With v the identity
    # the output is Z itself, so v's gradient must be Z^T g for the same seed.
    q, k, v = _on_jax(_inputs(length=5, source=6))
    with torchlax_core.enable():
        eye = torch.eye(6, device="jax").expand(2, 2, 6, 6)
        torch.manual_seed(3)
        weights = F.scaled_dot_product_attention(q, k, eye, dropout_p=0.4).detach()
        torch.manual_seed(3)
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.4)
        again = F.scaled_dot_product_attention(q, k, v, dropout_p=0.4)
        grad_out = torch.linspace(-1, 1, out.numel(), device="jax").reshape(out.shape)
        (out * grad_out).sum().backward()
    assert type(out.grad_fn).__name__ == FUSED
    weights, out, again = weights.cpu(), out.detach().cpu(), again.detach().cpu()
    assert bool(((weights == 0).float().mean() > 0.2).item())  # some weights dropped
    assert not torch.allclose(out, again)  # a fresh key per call
    torch.testing.assert_close(out, weights @ v.detach().cpu(), atol=1e-5, rtol=1e-5)
    expected = weights.transpose(-1, -2) @ grad_out.cpu()
    assert v.grad is not None
    torch.testing.assert_close(v.grad.cpu(), expected, atol=1e-5, rtol=1e-5)


def test_sdpa_kernel_math_keeps_the_composite():
    q, k, v = _on_jax(_inputs())
    with torchlax_core.enable(), sdpa_kernel(SDPBackend.MATH):
        out = F.scaled_dot_product_attention(q, k, v)
    assert type(out.grad_fn).__name__ != FUSED


class _Attention(torch.nn.Module):
    def __init__(self, q, k, v):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Parameter(t.detach().clone()) for t in (q, k, v))

    def forward(self):
        return CASES["causal_scale"](self.q, self.k, self.v)


def test_under_torchlax_jit_with_backward():
    tensors = _inputs()
    expected, expected_grads = _run(CASES["causal_scale"], tensors)
    with torchlax_core.enable():
        module = _Attention(*tensors).to("jax")

        def step():
            out = module()
            weight = torch.linspace(-1, 1, out.numel(), device=out.device).reshape(out.shape)
            (out * weight).sum().backward()
            return out.detach()

        got = torchlax.jit(step)()
    torch.testing.assert_close(got.cpu(), expected.detach(), atol=2e-5, rtol=1e-5)
    grads = (module.q.grad, module.k.grad, module.v.grad)
    for g, e in zip(grads, expected_grads, strict=True):
        assert g is not None
        torch.testing.assert_close(g.cpu(), e, atol=2e-5, rtol=1e-5)


def test_backward_recomputes_the_scores_in_one_program():
    # In one torchlax.jit program the backward's recomputed q k^T must stay a product of its
    # own: merged with the forward's (XLA's CSE), the forward's float32 (L, S) scores of every
    # layer would stay alive until the backward (4.5 GiB of GPT-2 small's peak on a TPU).
    import re

    layers, (batch, heads, length, dim) = 3, (2, 2, 128, 32)
    with torchlax_core.enable():
        x = torch.randn(batch, length, heads * dim, dtype=torch.bfloat16, device="jax")
        weights = [
            torch.randn(heads * dim, 3 * heads * dim, dtype=torch.bfloat16, device="jax")
            .div(16)
            .requires_grad_()
            for _ in range(layers)
        ]

    def step():
        out = x
        for w in weights:
            q, k, v = (out @ w).view(batch, length, 3, heads, dim).permute(2, 0, 3, 1, 4)
            attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            out = out + attended.transpose(1, 2).reshape(out.shape)
        out.float().square().mean().backward()
        return out.detach()

    jitted = torchlax.jit(step)
    jitted()
    (program,) = [c for p in jitted.programs.values() for c in p.compiled.values()]
    scores = rf"= f32\[{batch},{heads},{length},{length}\]\{{[^}}]*\}} (?:dot|convolution)\("
    # per layer: the forward's q k^T, the backward's recomputed q k^T, and dO v^T
    assert len(re.findall(scores, program.as_text())) == 3 * layers
