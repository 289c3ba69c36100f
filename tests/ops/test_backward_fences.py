"""Backward ops that up-cast a half-precision activation again, in one ``torchlax.jit`` program.

PyTorch's GELU and LayerNorm compute a bf16 input in float32, and so do their backward ops
(``gelu_backward``, ``native_layer_norm_backward``) from the same saved bf16 tensors. In a
program holding both passes, XLA would merge the backward's float32 computation with the
forward's (common-subexpression elimination) and keep the float32 array from the forward until
the backward, in every layer; the backward ops read their half-precision inputs through an
optimization barrier (``fenced=True`` in their stanzas). Each case trains a stack of bf16
blocks in one compiled step: the values match eager PyTorch on the CPU, and the step's
temporaries grow per layer by less than a float32 copy of the activation more than the fenced
program keeps.
"""

from __future__ import annotations

import pytest
import torch
import torchlax
import torchlax_core
from torch import nn

ROWS, WIDTH = 512, 128


class _Gelu(nn.Sequential):
    # (per layer: the activation is the (ROWS, 4 * WIDTH) product before the GELU)
    def __init__(self, approximate: str):
        super().__init__(
            nn.Linear(WIDTH, 4 * WIDTH),
            nn.GELU(approximate=approximate),
            nn.Linear(4 * WIDTH, WIDTH),
        )


class _LayerNorm(nn.Module):
    # (per layer: the activation is the (ROWS, WIDTH) input of the LayerNorm)
    def __init__(self):
        super().__init__()
        self.norm, self.linear = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return x + self.linear(self.norm(x))


# name: (block, elements of the activation, bytes an element per layer that the step keeps at
# most). On XLA's CPU backend the fenced programs keep 7 (GELU: the bf16 product and the
# GELU's bf16 output, 4, and a relayout), 7 (tanh GELU) and 10 (LayerNorm) bytes; merged
# with the forward's, GELU kept two float32 arrays more (15), tanh GELU and LayerNorm one (11,
# 14): the bound lies halfway to one float32 array more.
CASES = {
    "gelu": (lambda: _Gelu("none"), ROWS * 4 * WIDTH, 9),
    "gelu_tanh": (lambda: _Gelu("tanh"), ROWS * 4 * WIDTH, 9),
    "layer_norm": (_LayerNorm, ROWS * WIDTH, 12),
}


def _model(name: str, layers: int) -> nn.Module:
    torch.manual_seed(0)
    block = CASES[name][0]
    return nn.Sequential(*(block() for _ in range(layers))).to(torch.bfloat16)


def _input() -> torch.Tensor:
    return torch.randn(ROWS, WIDTH, generator=torch.Generator().manual_seed(1)).bfloat16()


def _loss(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return net(x).float().square().mean()


def _jitted_step(net: nn.Module, x: torch.Tensor):
    """One call of the compiled step (forward, loss, backward); its loss and executable."""

    def step():
        loss = _loss(net, x)
        loss.backward()
        return loss.detach()

    jitted = torchlax.jit(step)
    loss = jitted()
    (program,) = [c for p in jitted.programs.values() for c in p.compiled.values()]
    return loss, program


@pytest.mark.parametrize("name", sorted(CASES))
def test_values_match_eager_pytorch(name):
    net, x = _model(name, 2), _input()
    expected = _loss(net, x)
    expected.backward()
    with torchlax_core.enable():
        jax_net, jax_x = _model(name, 2).to("jax"), x.to("jax")
        loss, _ = _jitted_step(jax_net, jax_x)
    torch.testing.assert_close(loss.cpu(), expected.detach(), atol=1e-2, rtol=1e-2)
    for (where, p), e in zip(jax_net.named_parameters(), net.parameters(), strict=True):
        assert p.grad is not None and p.grad.dtype == torch.bfloat16, where
        torch.testing.assert_close(p.grad.cpu(), e.grad, atol=2e-2, rtol=2e-2, msg=where)


@pytest.mark.parametrize("name", sorted(CASES))
def test_backward_keeps_no_float32_copy_of_the_activation(name):
    _, elements, bound = CASES[name]
    temporaries = {}
    for layers in (2, 4):
        with torchlax_core.enable():
            _, program = _jitted_step(_model(name, layers).to("jax"), _input().to("jax"))
        temporaries[layers] = program.memory_analysis().temp_size_in_bytes
    per_element = (temporaries[4] - temporaries[2]) / 2 / elements
    assert per_element < bound, (
        f"{name}: the compiled step keeps {per_element:.1f} bytes an activation element per "
        f"layer (at most {bound}): a float32 copy of the activation is kept for the backward"
    )
