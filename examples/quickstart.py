"""torchlax in one minute: a PyTorch model run on JAX, eagerly and under jit.

uv run python examples/quickstart.py
"""

import copy

import torch
import torchlax
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(
    nn.Linear(16, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 10), nn.LogSoftmax(dim=-1)
)
x = torch.randn(8, 16)
expected = model(x)  # eager PyTorch on the CPU: the reference

with torchlax.enable():
    jax_model = copy.deepcopy(model).to("jax")  # parameters are now torchlax Tensors
    jx = x.to("jax")

    eager = jax_model(jx)  # each op dispatched to jax.numpy, one by one
    jitted_model = torchlax.jit(jax_model)  # the whole forward as one XLA program
    jitted = jitted_model(jx)

# Float32 agrees to rounding (1e-5) on a CPU or GPU. A TPU's float32 transcendentals (exp, log,
# tanh, erf: here GELU and LogSoftmax) are accurate to about 1e-4 relative, so on a TPU the
# comparison is at 2e-4 (docs/tpu.md).
platform = next(iter(jx.jax().devices())).platform
tolerance = 2e-4 if platform == "tpu" else 1e-5

print(
    f"input on {jx.device} ({platform}); output {type(eager).__name__} {tuple(eager.shape)} {eager.dtype}"
)
for name, result in (("eager", eager), ("jit", jitted)):
    torch.testing.assert_close(result.cpu(), expected.detach(), rtol=tolerance, atol=tolerance)
    diff = (result.cpu() - expected).abs().max().item()
    print(f"torchlax {name:<5} matches eager PyTorch (max abs difference {diff:.2e})")
