"""The memory of a bfloat16 training step under ``torchlax.jit``, read from its compiled program.

    uv run python benchmarks/step_memory.py --model mlp
    uv run python benchmarks/step_memory.py --model gpt2 --layers 2 --batch 2 --seq 512
    uv run python benchmarks/step_memory.py --model gpt2 --activation gelu_pytorch_tanh \\
        --hlo /tmp/step.hlo.txt

The step is zero_grad, the forward with its loss, ``loss.backward()`` and an AdamW step, on a
bf16 model (weights random, from a config, dropout 0), jitted whole and called three times. Of
the steady step's executable (the one that takes the optimizer's state as arguments), it
reports XLA's ``memory_analysis`` (temporaries; peak = arguments + outputs - donated aliases +
temporaries), how long XLA took to compile it (wall time, in the thread that compiled it: the
first call compiles the steady step's program beside its own; torchlax's persistent compilation
cache off unless ``TORCHLAX_COMPILATION_CACHE`` says otherwise), what is alive at its peak
(``tpu_profile_report.live_at_peak``: the scheduled entry computation's buffers from their
instruction to their last use), and how many float32 arrays as large as an activation are among
them: float32 copies of activations kept from the forward for the backward (PyTorch keeps bf16
ones), and on the CPU also the operands of bf16 weight-gradient products, which XLA's CPU
backend up-casts and computes in float32 (the TPU does not).

Models: ``mlp``, ``--layers`` residual blocks ``x + fc2(act(fc1(ln(x))))`` (width ``--width``,
hidden 4 x width) under a float32 mean-square loss, batch ``--batch`` x ``--seq`` rows;
``gpt2``, transformers' GPT2LMHeadModel with ``labels=`` the input ids. ``--activation`` is a
transformers activation name: ``gelu_new`` (GPT-2's own, written as elementwise ops),
``gelu`` (``F.gelu``), ``gelu_pytorch_tanh`` (``F.gelu(approximate="tanh")``), ``silu``, ...
``--hlo PATH`` keeps the optimized HLO text (the input of ``tpu_profile_report.py --live``).
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import jax
import torch
from torch import nn
from transformers.activations import ACT2FN

# Every compile timed is a compile: torchlax's persistent cache (on where torchlax_core is
# imported) would load a program an earlier run compiled.
os.environ.setdefault("TORCHLAX_COMPILATION_CACHE", "off")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from tpu_profile_report import live_at_peak  # noqa: E402  (benchmarks/: a script beside this one)


class Block(nn.Module):
    """``x + fc2(act(fc1(ln(x))))``, ``act`` transformers' activation of that name."""

    def __init__(self, width: int, activation: str):
        super().__init__()
        self.ln = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 4 * width)
        self.act = ACT2FN[activation]
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.fc2(self.act(self.fc1(self.ln(x))))


def activation_sizes(args: argparse.Namespace) -> dict[str, int]:
    """The element counts of the model's activations, by name."""
    rows = args.batch * args.seq
    sizes = {"width": rows * args.width, "hidden": rows * 4 * args.width}
    if args.model == "gpt2":
        sizes["logits"] = rows * args.vocab
        sizes["logits[:-1]"] = args.batch * (args.seq - 1) * args.vocab
    return sizes


def build(args: argparse.Namespace) -> tuple[nn.Module, Any]:
    """The bf16 model on the CPU and its loss (``loss(model) -> tensor``)."""
    torch.manual_seed(0)
    if args.model == "mlp":
        net = nn.Sequential(*(Block(args.width, args.activation) for _ in range(args.layers)))
        x = torch.randn(args.batch, args.seq, args.width)

        def mlp_loss(m):
            return m(x.to(m[0].fc1.weight)).float().square().mean()

        return net.to(torch.bfloat16), mlp_loss
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=args.layers,
        n_embd=args.width,
        n_head=args.width // 64,
        vocab_size=args.vocab,
        n_positions=max(1024, args.seq),
        activation_function=args.activation,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    net = GPT2LMHeadModel(config)
    net.config.use_cache = False
    ids = torch.randint(0, args.vocab, (args.batch, args.seq))

    def lm_loss(m):
        jids = ids.to(m.lm_head.weight.device)
        return m(input_ids=jids, labels=jids, use_cache=False).loss

    return net.to(torch.bfloat16), lm_loss


class CompileTimes:
    """Wall seconds of each ``jax.stages.Lowered.compile`` call, by the executable it made."""

    def __init__(self):
        self.seconds: list[tuple[Any, float]] = []
        self._original = jax.stages.Lowered.compile
        times = self

        def timed(lowered, *a, **k):
            t0 = time.perf_counter()
            compiled = times._original(lowered, *a, **k)
            times.seconds.append((compiled, time.perf_counter() - t0))
            return compiled

        jax.stages.Lowered.compile = timed

    def of(self, compiled: Any) -> float:
        return next((s for c, s in self.seconds if c is compiled), math.nan)


def steady_step(args: argparse.Namespace) -> tuple[Any, float]:
    """The steady step's executable and its compile seconds."""
    import torchlax

    times = CompileTimes()
    net, loss_of = build(args)
    with torchlax.enable():
        jnet = net.to("jax")
    opt = torch.optim.AdamW(jnet.parameters(), lr=1e-4)

    def step():
        opt.zero_grad()
        loss = loss_of(jnet)
        loss.backward()
        opt.step()
        return loss.detach()

    jitted = torchlax.jit(step)
    for _ in range(3):
        jitted().cpu()
    executables = [c for p in jitted.programs.values() for c in p.compiled.values()]
    # The steady step takes the optimizer's state; the first call's program makes it.
    steady = max(executables, key=lambda c: c.memory_analysis().argument_size_in_bytes)
    return steady, times.of(steady)


_ARRAY = re.compile(r"\b(f32|bf16|f16)\[([0-9,]*)\]")


def float32_activations(alive: list, shapes: dict[str, int]) -> dict[str, tuple[int, int]]:
    """(count, bytes) of the float32 arrays alive at the peak with as many elements as an
    activation of each name (a tuple-shaped buffer counts each of its arrays)."""
    found: dict[str, tuple[int, int]] = {}
    for _, _, _, shape in alive:
        for dtype, dims in _ARRAY.findall(shape):
            n = math.prod(int(d) for d in dims.split(",") if d)
            for name, size in shapes.items():
                if dtype == "f32" and n == size:
                    count, nbytes = found.get(name, (0, 0))
                    found[name] = (count + 1, nbytes + 4 * n)
    return found


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=("mlp", "gpt2"), default="mlp")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--activation", default="gelu_new")
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--hlo", default="", help="write the steady step's optimized HLO here")
    args = p.parse_args(argv)
    compiled, seconds = steady_step(args)
    text = compiled.as_text()
    if args.hlo:
        Path(args.hlo).write_text(text)
    stats = compiled.memory_analysis()
    peak = (
        stats.argument_size_in_bytes
        + stats.output_size_in_bytes
        - stats.alias_size_in_bytes
        + stats.temp_size_in_bytes
    )
    mib = 2**20
    print(
        f"{args.model} {args.layers} layers, width {args.width}, {args.batch} x {args.seq}, "
        f"{args.activation}: compile {seconds:.1f} s, temporaries "
        f"{stats.temp_size_in_bytes / mib:.1f} MiB, peak {peak / mib:.1f} MiB"
    )
    live, at, alive = live_at_peak(text)
    groups: collections.Counter = collections.Counter()
    for _, _, size, shape in alive:
        groups[shape] += size
    print(f"alive at the liveness pass's peak (instruction {at}): {live / mib:.1f} MiB")
    for shape, n in groups.most_common(args.top):
        print(f"  {n / mib:8.1f} MiB  {shape}")
    for name, (count, nbytes) in float32_activations(alive, activation_sizes(args)).items():
        print(
            f"float32 arrays of the {name} activation's size at the peak: {count}, "
            f"{nbytes / mib:.1f} MiB"
        )


if __name__ == "__main__":
    main()
