"""Train a PyTorch model with jax.grad and optax, then hand the weights back to PyTorch.

    uv run python examples/jax_training.py

`torchlax.functional(model)` turns an `nn.Module` into a pure JAX function of a dict of
weights. The training step is then ordinary JAX: `jax.value_and_grad`, an optax optimizer and
`jax.jit` around the whole step. The same model trained with `torch.optim.Adam` follows the same
loss curve; at the end the trained arrays go back into the module without copies.
"""

import copy

import jax
import optax
import torch
import torchlax
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(2, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 2))
reference = copy.deepcopy(model)  # trained with torch.optim, for comparison

# Two interleaved spirals: a small problem a linear model cannot solve.
t = torch.linspace(0.5, 3.5, 128)
spiral = torch.stack([t * torch.cos(2 * t), t * torch.sin(2 * t)], dim=1) / 3.5
inputs = torch.cat([spiral, -spiral])
labels = torch.cat([torch.zeros(128, dtype=torch.int64), torch.ones(128, dtype=torch.int64)])

params, buffers, apply = torchlax.functional(model)  # name -> jax.Array, shared with the model
optimizer = optax.adam(0.02)
opt_state = optimizer.init(params)
x, y = torchlax.jax_view(inputs), torchlax.jax_view(labels)  # zero-copy views of the data


def loss_fn(params, x, y):
    logits = apply(params, x)  # the PyTorch forward, run as JAX operations
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


@jax.jit
def train_step(params, opt_state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


torch_optimizer = torch.optim.Adam(reference.parameters(), lr=0.02)
for step in range(1, 201):
    params, opt_state, loss = train_step(params, opt_state, x, y)
    torch_optimizer.zero_grad()
    torch_loss = nn.functional.cross_entropy(reference(inputs), labels)
    torch_loss.backward()
    torch_optimizer.step()
    if step in (1, 10, 50, 100, 200):
        print(
            f"step {step:3d}: loss jax+optax {float(loss):.4f}   torch.optim {torch_loss.item():.4f}"
        )

# The trained weights back into the PyTorch module (shared memory, then copied by load).
model.load_state_dict({name: torchlax.to_torch(value) for name, value in params.items()})
accuracy = (model(inputs).argmax(dim=1) == labels).float().mean().item()
reference_accuracy = (reference(inputs).argmax(dim=1) == labels).float().mean().item()
print(f"accuracy after training: jax+optax {accuracy:.1%}, torch.optim {reference_accuracy:.1%}")
assert abs(float(loss) - torch_loss.item()) < 1e-2, "the two trainings should agree"
assert accuracy > 0.9
print("jax.grad + optax trained the PyTorch model as torch.optim did.")
