"""torch.compile(model, backend="torchlax"): PyTorch code as XLA programs, unchanged.

Run: uv run python examples/compile.py
"""

import jax
import torch

# No torchlax import is needed for the backend: it is found by name through its entry point.
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
compiled = torch.compile(model, backend="torchlax")

# 1. Plain CPU tensors in, plain CPU tensors out (handed to and from XLA through DLPack).
x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
with torch.no_grad():
    print("max |compiled - eager|:", (compiled(x) - model(x)).abs().max().item())

# 2. Training: forward and backward both run as XLA programs; torch.optim works as usual.
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
for step in range(5):
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(compiled(x), y)
    loss.backward()
    optimizer.step()
    print(f"step {step}: loss {loss.item():.4f}")

# 3. JAX inside compiled code: call_jax is one op of the graph, inlined into the XLA program.
import torchlax  # noqa: E402  (from here on we use torchlax's own API)


def jax_block(h):
    return jax.nn.silu(h) * 2


@torch.compile(backend="torchlax", fullgraph=True)
def head(x):
    return torchlax.call_jax(jax_block, model[0](x)).sum(-1)


with torch.no_grad():
    print("call_jax in a compiled graph:", head(x)[:3])

# 4. torchlax Tensors in, torchlax Tensors out: the data stays in JAX, nothing is copied.
with torchlax.enable():
    jax_model = torch.nn.Linear(16, 4).to("jax")
    xj = torch.randn(8, 16, device="jax")
out = torch.compile(jax_model, backend="torchlax")(xj)
print(type(out).__name__, out.device, out.shape)
