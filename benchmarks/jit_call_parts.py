"""Where one repeated ``torchlax.jit`` forward call's time goes, against ``jax.jit``'s (issue 14).

    uv run python benchmarks/jit_call_parts.py [--width 8 512] [--calls 3000]

The MLP of ``run.py`` (256 -> width -> width -> 10, batch 64) under ``torch.no_grad()``, and
the same forward written in JAX. Each variant is called once per round, in turn, after the
previous call's result was ready (as ``run.py`` calls them), so a busy stretch of the machine
lands on all alike. Per variant: the calling thread's CPU time until the call returns (what our
Python and the launch cost; unlike wall time it does not count the waits of a loaded machine),
and the wall time until the result is ready (what ``run.py``'s "forward: MLP" row measures).

Variants beside the whole call take one part away, so their difference to it is that part's
cost inside a real call: the layout's checks (``_Layout.forward_guard``), the launch (the
executable's result memoised: our Python alone). Timing a part on its own in a loop misleads:
a call follows an XLA computation and starts with cold caches, so reading an object costs
several times what it costs in a warm loop (a C++ check of the same objects, Dynamo's guard
manager, was 3x faster warm and no faster in a call).
"""

# ruff: noqa: B023  (each closure is timed in the round that made it)

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import torch
import torchlax
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench  # noqa: E402  (benchmarks/run.py: the MLP written in JAX)


def mlp(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(256, width), nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 10)
    )


def hand_written(model: nn.Module):
    params, forward = bench.hand_written_mlp(model)
    return params, jax.jit(forward)


def parts(width: int, calls: int) -> None:
    torch.manual_seed(0)
    model = mlp(width).eval()
    x_cpu = torch.randn(64, 256)
    params, fast = hand_written(model)
    x_jax = jnp.asarray(x_cpu.numpy())
    with torchlax.enable():
        jmodel = model.to("jax")
        x = x_cpu.to("jax")
    jitted = torchlax.jit(jmodel)
    with torch.no_grad():
        for _ in range(3):
            jitted(x)
        repeat = jitted._last.plan
        assert repeat is not None, "the forward was not recorded as repeatable"
        entry = repeat.entry
        executable, launch = entry.executable, entry._launch
        memo = executable(repeat.state_arrays, [], [x.jax()], entry.key())

        def memoised(*args):
            return memo

        def without(set_up: Callable[[], None], tear_down: Callable[[], None]):
            def call():
                set_up()
                try:
                    return jitted(x)
                finally:
                    tear_down()

            return call

        guard = repeat.holds

        def unchecked():
            repeat.holds = lambda: True

        def checked():
            repeat.holds = guard

        plain = getattr(repeat, "plain", None)  # (the launcher a repeated forward calls, its key)

        def memoise():
            entry._executable = entry._launch = memoised
            if plain is not None:
                repeat.plain = (memoised, plain[1])

        def unmemoise():
            entry._executable, entry._launch = executable, launch
            if plain is not None:
                repeat.plain = plain

        variants = {
            "torchlax.jit": lambda: jitted(x),
            "  without the layout's checks": without(unchecked, checked),
            "  launch memoised (our Python alone)": without(memoise, unmemoise),
            "jax.jit, hand-written": lambda: fast(params, x_jax),
        }
        # Each part's call follows a whole call (its XLA computation over the same objects),
        # as the whole call follows itself; the memoised launch would otherwise follow no
        # computation at all.
        whole = variants["torchlax.jit"]
        after = {name: whole for name in variants if name.startswith("  ")}
        cpu, ready = bench.cpu_and_ready_times(variants, calls, after)
    hand = "jax.jit, hand-written"
    print(f"\nwidth {width}: {calls} rounds (min / median us)")
    print(f"  {'':<38} {'CPU until it returns':>22} {'until ready':>18} {'ready / JAX':>14}")
    for name in variants:
        c, r = cpu[name], ready[name]
        ratio = statistics.median(r) / statistics.median(ready[hand])
        print(
            f"  {name:<38} {min(c) * 1e6:9.1f} / {statistics.median(c) * 1e6:8.1f}"
            f" {min(r) * 1e6:8.1f} / {statistics.median(r) * 1e6:7.1f} {ratio:13.3f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, nargs="+", default=[8, 512])
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    for width in args.width:
        parts(width, args.calls)


if __name__ == "__main__":
    main()
