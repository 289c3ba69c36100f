"""The training step under ``torch.compile(step, backend="torchlax")`` against JAX + optax.

A shorter, interleaved companion of ``run.py --only training`` for the backend rows (issue #14):
per model and optimizer, the hand-written JAX + optax step, the canonical PyTorch step (it
returns the loss undetached) and the same step with the loss detached before ``opt.step()``,
all timed round-robin in one process, each call waited for until the state it writes is ready.
Both PyTorch steps are two XLA programs (Dynamo traces ``loss.backward()`` into the forward's
graph; the undetached loss is handed out with a ``grad_fn`` that raises, docs/dynamo.md), so
their difference is the cost of that hand-out.

    uv run python benchmarks/backend_step.py [--rounds 15] [--steps 10] [--models MLP ...]
    uv run python benchmarks/backend_step.py --width 8 --models MLP   # the fixed cost per step
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch
import torchlax
import torchlax_dynamo
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench  # noqa: E402  (benchmarks/run.py: models, optimizers, the optax step)


def _case(name: str, width: int | None):
    if name == "MLP" and width is not None:
        model = nn.Sequential(
            nn.Linear(256, width), nn.GELU(), nn.Linear(width, width), nn.GELU(),
            nn.Linear(width, 10),
        )  # fmt: skip
        x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
        return model, (x, y), lambda m, x, y: nn.functional.cross_entropy(m(x), y)
    return bench._training_cases()[name]()


def measure(name: str, opt_name: str, rounds: int, steps: int, width: int | None) -> None:
    make_opt, make_optax = bench.OPTIMIZERS[opt_name]
    torch.manual_seed(0)
    model, (x, y), loss_fn = _case(name, width)
    model.train()
    variants = {}
    for label, make_step in (
        ("backend, return loss (2 programs)", bench.training_step),
        ("backend, loss detached (2 programs)", bench.detached_training_step),
    ):
        with torchlax.enable():
            dm = copy.deepcopy(model).to("jax")
            jx, jy = x.to("jax"), y.to("jax")
        opt = make_opt(dm.parameters())
        step = torch.compile(make_step(dm, opt, loss_fn, jx, jy), backend="torchlax")
        before = torchlax_dynamo.counters["xla_programs"]
        for _ in range(3):
            step()
        state = bench._torchlax_state(dm, opt)
        programs = torchlax_dynamo.counters["xla_programs"] - before
        variants[f"{label} [{programs} built]"] = lambda step=step, state=state: bench.ready(
            (step(), state())
        )
    label, run, _, _ = bench.optax_baseline(name, model, x, y, make_optax)
    variants = {label: run, **variants}
    compiled = torchlax_dynamo.counters["xla_programs"]
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(rounds):
        for key, fn in variants.items():
            start = time.perf_counter()
            for _ in range(steps):
                fn()
            times[key].append((time.perf_counter() - start) / steps)
    assert torchlax_dynamo.counters["xla_programs"] == compiled, "compiled while timing"
    base_min, base_med = min(times[label]), statistics.median(times[label])
    print(f"\n{name} + {opt_name}" + (f" (width {width})" if width else ""))
    for key, ts in times.items():
        lo, med = min(ts), statistics.median(ts)
        print(
            f"  {key:48s} min {1e3 * lo:7.3f} ms ({lo / base_min:4.2f}x)   "
            f"median {1e3 * med:7.3f} ms ({med / base_med:4.2f}x)"
        )
    torch._dynamo.reset()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--models", nargs="*", default=["MLP", "GPT-2 (2 layers)"])
    parser.add_argument("--optimizers", nargs="*", default=list(bench.OPTIMIZERS))
    parser.add_argument("--width", type=int, default=None, help="MLP hidden width")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for name in args.models:
        for opt_name in args.optimizers:
            measure(name, opt_name, args.rounds, args.steps, args.width)


if __name__ == "__main__":
    main()
