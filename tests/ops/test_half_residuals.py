"""What JAX's autodiff keeps from a half-precision forward (``torchlax_ops._recompute``).

PyTorch computes a bfloat16/float16 GELU, LayerNorm, softmax or attention in float32 and
keeps half-precision tensors for its backward; differentiated by JAX (``jax.vjp`` over
``call_torch``, as ``torchlax.functional`` + ``jax.grad`` do), the lowerings must not keep
float32 copies of the activation either. The gradients are those of the same float32
computation written in JAX.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch.nn.functional as F
from torchlax_interop import call_torch

SHAPE = (2, 16, 64)  # the activation; every float32 residual must be smaller than it


def _layer_norm(x, w, b):
    return F.layer_norm(x, (SHAPE[-1],), w, b)


def _attention(x, _w, _b):
    q = x[:, None]  # (batch, 1 head, length, dim): the fused overrideable op
    return F.scaled_dot_product_attention(q, q, q, is_causal=True)[:, 0]


def _math_attention(x, w, b):
    # Composite form (export/dynamo graphs keep it whole): the lowering called directly.
    import torch

    q = x[:, None]
    return torch.ops.aten.scaled_dot_product_attention(q, q, q, is_causal=True)[:, 0]


def _new_gelu(x, _w, _b):
    # GPT-2's activation in transformers (NewGELUActivation): elementwise ops, each computing
    # half precision in float32 (the promotion path rather than opmath).
    import torch

    return 0.5 * x * (1.0 + torch.tanh(0.7978845608 * (x + 0.044715 * torch.pow(x, 3.0))))


OPS = {
    "new_gelu": _new_gelu,
    "gelu": lambda x, w, b: F.gelu(x),
    "gelu_tanh": lambda x, w, b: F.gelu(x, approximate="tanh"),
    "layer_norm": _layer_norm,
    "softmax": lambda x, w, b: F.softmax(x, -1),
    "log_softmax": lambda x, w, b: F.log_softmax(x, -1),
    "silu": lambda x, w, b: F.silu(x),
    "attention": _attention,
    "math_attention": _math_attention,
}


def _inputs(dtype):
    keys = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(keys[0], SHAPE).astype(dtype)
    w = (1 + 0.1 * jax.random.normal(keys[1], SHAPE[-1:])).astype(dtype)
    b = (0.1 * jax.random.normal(keys[2], SHAPE[-1:])).astype(dtype)
    return x, w, b


def _residuals(fn, *args):
    _, vjp = jax.vjp(lambda *a: call_torch(fn, *a), *args)
    return [leaf for leaf in jax.tree.leaves(vjp) if isinstance(leaf, jax.Array)]


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("name", sorted(OPS))
def test_half_forward_keeps_no_float32_activation(name, dtype):
    kept = _residuals(OPS[name], *_inputs(dtype))
    size = int(np.prod(SHAPE))
    wide = [(str(r.dtype), r.shape) for r in kept if r.dtype == jnp.float32 and r.size >= size]
    assert not wide, f"{name} in {jnp.dtype(dtype).name} keeps float32 activations: {wide}"
    assert any(r.dtype == dtype and r.size >= size for r in kept), "the half input is kept"


def _reference_grads(name, x, w, b):
    """The same float32 computation in JAX, rounded back to the half dtype."""
    up = [a.astype(jnp.float32) for a in (x, w, b)]

    def ln(x, w, b):
        mean = jnp.mean(x, -1, keepdims=True)
        centered = x - mean
        rstd = jax.lax.rsqrt(jnp.mean(centered * centered, -1, keepdims=True) + 1e-5)
        return centered * rstd * w + b

    fns = {
        "gelu": lambda x, w, b: jax.nn.gelu(x, approximate=False),
        "gelu_tanh": lambda x, w, b: jax.nn.gelu(x, approximate=True),
        "layer_norm": ln,
        "softmax": lambda x, w, b: jax.nn.softmax(x, -1),
        "log_softmax": lambda x, w, b: jax.nn.log_softmax(x, -1),
        "silu": lambda x, w, b: x * jax.nn.sigmoid(x),
    }
    fn = fns[name]
    return jax.grad(lambda *a: jnp.sum(fn(*a).astype(x.dtype) * _weights(x)), (0, 1, 2))(*up)


def _weights(x):
    return jnp.linspace(-1, 1, x.size).reshape(x.shape).astype(x.dtype)


@pytest.mark.parametrize("name", ["gelu", "gelu_tanh", "layer_norm", "softmax", "log_softmax"])
def test_half_gradients_are_the_float32_computations(name):
    x, w, b = _inputs(jnp.bfloat16)

    def loss(x, w, b):
        return jnp.sum(call_torch(OPS[name], x, w, b) * _weights(x))

    got = jax.jit(jax.grad(loss, (0, 1, 2)))(x, w, b)
    want = jax.jit(lambda *a: _reference_grads(name, *a))(x, w, b)
    for g, r in zip(got, want, strict=True):
        if g is None or name != "layer_norm" and g.shape != SHAPE:
            continue  # (w and b are used by layer_norm only)
        np.testing.assert_allclose(
            np.asarray(g.astype(jnp.float32)), np.asarray(r.astype(g.dtype).astype(jnp.float32))
        )
