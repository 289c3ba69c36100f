"""Where ``torchlax.jit``'s first call of a training step spends its time (CPU or any device).

For each model (``mlp``: Linear-ReLU-Linear; ``gpt2``: the tiny GPT-2 of tests/models, 2
layers, width 64; ``gpt2-4``: 4 layers, width 256, 128 positions), each with AdamW, it times
the first call (everything up to its result being ready), the second, and lists the traces and
XLA compilations that ``TORCHLAX_LOG=info`` reports, with the thread that made each, so a
compile that runs in the background shows as such. The persistent compilation cache is off
(``TORCHLAX_COMPILATION_CACHE=off`` before torchlax is imported): every compile is a real one.

    uv run python benchmarks/first_call.py [mlp gpt2 gpt2-4] [--repeat N]

Each model runs in a fresh subprocess (op caches, JAX's caches: a new process, as a user's
first step is).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any


class _Lines(logging.Handler):
    def __init__(self, t0: float):
        super().__init__(logging.INFO)
        self.t0 = t0
        self.rows: list[tuple[float, str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.rows.append(
            (time.perf_counter() - self.t0, threading.current_thread().name, record.getMessage())
        )


def _build(name: str) -> tuple[Any, tuple, Callable]:
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    if name == "mlp":
        model = torch.nn.Sequential(
            torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
        )
        g = torch.Generator().manual_seed(1)
        batch = (torch.randn(32, 256, generator=g), torch.randint(0, 10, (32,), generator=g))
        return model, batch, lambda m, x, y: F.cross_entropy(m(x), y)
    from transformers import GPT2Config, GPT2LMHeadModel

    layers, width, positions = (2, 64, 12) if name == "gpt2" else (4, 256, 128)
    config = GPT2Config(
        n_layer=layers,
        n_head=4,
        n_embd=width,
        vocab_size=128,
        n_positions=max(positions, 64),
        pad_token_id=0,
    )
    config.use_cache = False
    model = GPT2LMHeadModel(config)
    ids = torch.randint(0, 128, (2, positions), generator=torch.Generator().manual_seed(1))
    return model, (ids,), lambda m, ids: m(input_ids=ids, labels=ids).loss


def _child(name: str) -> dict:
    import jax
    import torch
    import torchlax

    model, batch, loss_fn = _build(name)
    with torchlax.enable():
        model = model.to("jax")
        batch = tuple(t.to("jax") for t in batch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)

    def step(*b):
        opt.zero_grad()
        loss = loss_fn(model, *b)
        loss.backward()
        opt.step()
        return loss.detach()

    jitted = torchlax.jit(step)
    t0 = time.perf_counter()
    lines = _Lines(t0)
    logger = logging.getLogger("torchlax")
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    row: dict = {"model": name}
    loss = jitted(*batch)
    jax.block_until_ready(loss.jax())
    row["first_s"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    loss = jitted(*batch)
    jax.block_until_ready(loss.jax())
    row["second_s"] = time.perf_counter() - t1
    row["events"] = [
        (round(t, 3), thread, msg)
        for t, thread, msg in lines.rows
        if msg.startswith(("traced", "XLA compiled", "torchlax.jit"))
    ]
    row["compilations"] = jitted.compilations  # pyright: ignore[reportFunctionMemberAccess]
    return row


def _seconds(msg: str) -> float:
    found = re.search(r"in ([0-9.]+) s", msg)
    return float(found.group(1)) if found else 0.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("models", nargs="*", default=["mlp", "gpt2", "gpt2-4"])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child)))
        return
    env = {**os.environ, "TORCHLAX_COMPILATION_CACHE": "off", "TORCHLAX_COMPILE_PROGRESS": "off"}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    for name in args.models:
        for _ in range(args.repeat):
            out = subprocess.run(
                [sys.executable, __file__, "--child", name],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            row = json.loads(out.strip().splitlines()[-1])
            traces = sum(_seconds(m) for _, _, m in row["events"] if m.startswith("traced"))
            compiles = [_seconds(m) for _, _, m in row["events"] if m.startswith("XLA")]
            print(
                f"{name:7s} first {row['first_s']:6.2f} s  second {row['second_s']:6.3f} s  "
                f"traces {traces:5.2f} s  compiles {' + '.join(f'{c:.2f}' for c in compiles)} s  "
                f"(jit programs {row['compilations']})"
            )
            for t, thread, msg in row["events"]:
                print(f"    {t:7.2f}  {thread:12.12s}  {msg[:110]}")


if __name__ == "__main__":
    main()
