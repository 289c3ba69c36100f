"""Train a small PyTorch model on JAX with torchlax: unchanged PyTorch code, device "jax".

Fits a two-layer MLP classifier to a synthetic dataset with AdamW, eagerly on torchlax
Tensors, and runs the identical loop on the CPU to show the losses agree.

    uv run python examples/train.py [--steps 50]
"""

from __future__ import annotations

import argparse
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchlax_core


def make_data(n=256, features=10, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(classes, features, generator=g) * 2
    labels = torch.randint(0, classes, (n,), generator=g)
    points = centers[labels] + torch.randn(n, features, generator=g)
    return points, labels


def train(model, points, labels, steps, device):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=1e-2)
    points, labels = points.to(device), labels.to(device)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(points), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    with torch.no_grad():
        accuracy = (model(points).argmax(-1) == labels).float().mean().item()
    return losses, accuracy


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()

    torch.manual_seed(0)
    cpu_model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 3))
    jax_model = copy.deepcopy(cpu_model)  # same initial weights
    points, labels = make_data()

    with torchlax_core.enable():
        jax_model.to("jax")
        jax_losses, jax_accuracy = train(jax_model, points, labels, args.steps, "jax")
        print(
            f"parameters live on: {next(jax_model.parameters()).device} "
            f"({type(next(jax_model.parameters())).__module__})"
        )
    cpu_losses, cpu_accuracy = train(cpu_model, points, labels, args.steps, "cpu")

    for step in range(0, args.steps, max(1, args.steps // 10)):
        print(f"step {step:4d}  loss jax {jax_losses[step]:.6f}  cpu {cpu_losses[step]:.6f}")
    print(f"final accuracy  jax {jax_accuracy:.3f}  cpu {cpu_accuracy:.3f}")
    worst = max(abs(a - b) for a, b in zip(jax_losses, cpu_losses, strict=True))
    print(f"largest loss difference jax vs cpu: {worst:.2e}")


if __name__ == "__main__":
    main()
