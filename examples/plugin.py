"""A third-party plugin at work: a new op, an override, and device placement.

The plugin is the package in examples/plugins/torchlax-example-plugin (installed in this
workspace). torchlax found it through its entry point; nothing here registers it.

    uv run python examples/plugin.py
"""

import jax
import torch
import torchlax
import torchlax_example_plugin as example
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        return torch.softmax(example.scaled_swish(self.proj(x), 1.5), dim=-1)


env = torchlax.default_env()
for op in (torch.ops.example.scaled_swish.default, torch.ops.aten._softmax.default):
    print(f"{op} is lowered by plugin {env.lowering_for(op).plugin!r}")

torch.manual_seed(0)
model, x = Block(), torch.randn(4, 8)
expected = model(x)  # the plain PyTorch op on the CPU

with torchlax.enable():
    jax_model, jx = model.to("jax"), x.to("jax")  # the new op runs as a JAX lowering
    eager, jitted = jax_model(jx), torchlax.jit(jax_model)(jx)
for name, got in (("eager", eager), ("torchlax.jit", jitted)):
    torch.testing.assert_close(got.cpu(), expected.detach())
    print(f"{name:<13} matches PyTorch")

example.place_on(jax.devices()[-1])  # the plugin's placement hook decides where tensors go
with torchlax.enable():
    print("new tensors land on", torch.zeros(2, device="jax").device)
example.place_on(None)
