"""A half-precision softmax/log_softmax reads its input in half precision (``fence=True``).

Traced, the input passes an optimization barrier before its float32 up-cast, so XLA cannot
hoist the up-cast above the reshape a causal LM's loss puts in front of it
(``logits[:, :-1].reshape(-1, V)``) and copy float32 bytes. Values are PyTorch's; eagerly (and
for float32 inputs) there is no barrier.
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
from torchlax_core.internal import tracing


def _loss(logits, labels):
    shifted = logits[:, :-1]
    return F.cross_entropy(shifted.reshape(-1, shifted.shape[-1]), labels)


def _program(dtype):
    env = torchlax_core.default_env()

    def run(x, y):
        with tracing(env):
            logits = torchlax.torch_view(x).requires_grad_()
            loss = _loss(logits, torchlax.torch_view(y))
            (grad,) = torch.autograd.grad(loss, logits)
            return torchlax.jax_view((loss, grad))

    x = jnp.ones((2, 5, 7), dtype)
    return jax.jit(run).lower(x, jnp.zeros((8,), jnp.int32)).as_text()


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_half_input_is_fenced_before_its_up_cast(dtype):
    text = _program(dtype)
    (barrier,) = re.findall(r"stablehlo\.optimization_barrier.*", text)
    assert ("bf16" if dtype == jnp.bfloat16 else "f16") in barrier
    assert "f32" not in barrier.split(" : ")[-1]


def test_float32_input_has_no_barrier():
    assert "optimization_barrier" not in _program(jnp.float32)


@pytest.mark.parametrize("fn", [F.softmax, F.log_softmax])
def test_values_match_pytorch_traced_and_eager(fn):
    torch.manual_seed(0)
    x = torch.randn(3, 4, 9, dtype=torch.bfloat16)
    expected = fn(x.reshape(-1, 9), dim=-1)
    with torchlax_core.enable():
        eager = fn(x.to("jax").reshape(-1, 9), dim=-1).cpu()
        traced = jax.jit(lambda a: torchlax.call_torch(lambda t: fn(t.reshape(-1, 9), dim=-1), a))(
            torchlax.jax_view(x.to("jax"))
        )
    torch.testing.assert_close(eager, expected)
    torch.testing.assert_close(torchlax.torch_view(traced).cpu(), expected)
