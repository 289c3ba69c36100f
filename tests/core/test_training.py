"""Multi-step training on torchlax matches the same loop on the CPU within float32 tolerance.

Both models start from the same weights (built on the CPU, ``copy.deepcopy``, then
``.to("jax")`` inside ``torchlax_core.enable()``); each step's loss and the final weights are
compared.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchlax_core
from eager_compare import assert_same, to_jax


class TinyGPTBlock(nn.Module):
    """Pre-norm causal self-attention and MLP, written out by hand."""

    def __init__(self, vocab=20, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, dim)
        self.ln1 = nn.LayerNorm(dim)
        # No qkv bias: the key bias gets a zero gradient in exact arithmetic, so its float32
        # rounding noise is all AdamW would see, and it amplifies noise to full-size steps.
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, ids):
        x = self.embed(ids)
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / (d // self.heads) ** 0.5
        mask = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()
        att = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        x = x + self.mlp(self.ln2(x))
        return self.head(x)


def _mlp():
    return nn.Sequential(
        nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4)
    )


def _encoder():
    # bias=False for the reason TinyGPTBlock has no qkv bias.
    layer = nn.TransformerEncoderLayer(
        d_model=16, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True, bias=False
    )
    return nn.Sequential(layer, nn.Linear(16, 4))


OPTIMIZERS = {
    "sgd_momentum": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1),
}


def _data(kind, step):
    g = torch.Generator().manual_seed(100 + step)
    if kind == "gpt":
        ids = torch.randint(0, 20, (3, 7), generator=g)
        return ids, torch.randint(0, 20, (3, 7), generator=g)
    if kind == "encoder":
        return torch.randn(3, 5, 16, generator=g), torch.randint(0, 4, (3, 5), generator=g)
    return torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g)


def _loss(kind, model, x, y):
    out = model(x)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def _train(kind, model, make_optimizer, steps, move):
    optimizer = make_optimizer(model.parameters())
    losses = []
    for step in range(steps):
        x, y = (move(t) for t in _data(kind, step))
        optimizer.zero_grad()
        loss = _loss(kind, model, x, y)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return losses


@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
@pytest.mark.parametrize("kind", ["mlp", "gpt", "encoder"])
def test_training_loop_matches_cpu(kind, opt):
    torch.manual_seed(0)
    cpu = {"mlp": _mlp, "gpt": TinyGPTBlock, "encoder": _encoder}[kind]()
    jx = copy.deepcopy(cpu)
    with torchlax_core.enable():
        jx.to("jax")
        jax_losses = _train(kind, jx, OPTIMIZERS[opt], 4, to_jax)
        for p in jx.parameters():
            assert isinstance(p, torchlax_core.Tensor) and isinstance(p.grad, torchlax_core.Tensor)
    cpu_losses = _train(kind, cpu, OPTIMIZERS[opt], 4, lambda t: t)
    for step, (a, e) in enumerate(zip(jax_losses, cpu_losses, strict=True)):
        assert_same(a, e, atol=1e-4, rtol=1e-4), step
    for (name, a), (_, e) in zip(jx.named_parameters(), cpu.named_parameters(), strict=True):
        assert_same(a, e, atol=2e-4, rtol=1e-3), name
