"""Where a ``torchlax.jit(step)`` training step's per-call time goes, per state array (issue 14).

    uv run python benchmarks/jit_step_parts.py [--calls 400] [--depths 2 8 32] [--mlp] [--gpt2]

A whole training step (``zero_grad``, forward, ``backward``, ``opt.step()``) of tiny models, so
that XLA computes next to nothing and what is left is the call's own Python: MLPs of ``depth``
``Linear(8, 8)`` layers (2 state arrays per layer under SGD: weight and bias; 4 more under
AdamW: ``exp_avg``, ``exp_avg_sq``, ``step`` per parameter, and the ``.grad``s), and
optionally the 2-layer GPT-2 of ``run.py`` with AdamW. Against each, the same step in JAX +
optax (``run.optax_baseline``: ``jax.jit``'s C++ call with the donated pytree).

Each variant is called once per round, in turn, after the previous call's result was ready,
so a busy stretch of the machine lands on all alike. Per variant: the calling thread's CPU
time until the call returns (our Python and the launch; unlike wall time it does not count a
loaded machine's waits), and the wall time until the loss is ready.

``--parts``: one more pass over the torchlax steps alone, with the call's parts wrapped in
timers (the guards, assembling the state, the launch, wrapping the outputs, the write-back):
each part's CPU time inside real calls. The wrappers add ~0.3 us each; the whole call is
timed too, so "other" is what no wrapper covers.
"""

# ruff: noqa: B023  (each closure is timed in the round that made it)

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench  # noqa: E402  (benchmarks/run.py: steps and the optax baseline)


def deep_mlp(depth: int) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(8, 8), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def mlp_case(depth: int):
    def case():
        x, y = torch.randn(4, 8), torch.randint(0, 8, (4,))
        return deep_mlp(depth), (x, y), lambda m, x, y: nn.functional.cross_entropy(m(x), y)

    return case


def state_arrays(jitted) -> int:
    """How many state arrays the jitted step passes (the last state signature it computed)."""
    return len(jitted._state_sig[0])


def variants_of(name: str, make_case, optimizer: str) -> dict[str, Callable[[], Any]]:
    make_opt, make_optax = bench.OPTIMIZERS[optimizer]
    torch.manual_seed(0)
    model, (x, y), loss_fn = make_case()
    model.train()
    whole = bench.torchlax_jit_step(model, make_opt, loss_fn, x, y)
    for _ in range(3):
        bench.ready(whole())
    _, run, _, _ = bench.optax_baseline(name, model, x, y, make_optax)
    label = f"{name} + {optimizer} ({state_arrays(whole)} state arrays)"
    return {label: lambda: whole(), f"  JAX + optax ({label.split(' (')[0]})": run}


def interleaved(variants: dict[str, Callable[[], Any]], calls: int) -> None:
    cpu, ready = bench.cpu_and_ready_times(variants, calls)
    print(f"\n{calls} rounds (min / median us)")
    print(f"  {'':<46} {'CPU until it returns':>22} {'until ready':>20}  ready / JAX")
    names = list(variants)
    for i, name in enumerate(names):
        c, r = cpu[name], ready[name]
        line = (
            f"  {name:<46} {min(c) * 1e6:9.1f} / {statistics.median(c) * 1e6:9.1f}"
            f" {min(r) * 1e6:9.1f} / {statistics.median(r) * 1e6:9.1f}"
        )
        if i % 2 == 1:
            ours = ready[names[i - 1]]
            line += f"  {statistics.median(ours) / statistics.median(r):6.3f}x"
            line += f" (min {min(ours) / min(r):.3f}x)"
        print(line)


# -- the parts of a call -----------------------------------------------------------------------


def _timed_parts() -> tuple[dict[str, list[int]], Callable[[], None]]:
    """Wrap the parts of ``_Jitted._call`` in CPU timers; returns the totals and an undo."""
    from torchlax_core.internal import CompiledProgram
    from torchlax_interop.jit import _call as _jit
    from torchlax_interop.jit import _program, _repeated
    from torchlax_interop.jit import _state as _jit_state

    totals: dict[str, list[int]] = {}
    undo: list[Callable[[], None]] = []
    thread_ns = time.thread_time_ns

    def wrap(owner, attribute: str, part: str) -> None:
        original = getattr(owner, attribute)
        times = totals.setdefault(part, [0, 0])

        def timed(*args, **kwargs):
            start = thread_ns()
            try:
                return original(*args, **kwargs)
            finally:
                times[0] += thread_ns() - start
                times[1] += 1

        setattr(owner, attribute, timed)
        undo.append(lambda: setattr(owner, attribute, original))

    wrap(_jit._Jitted, "__call__", "whole call")
    wrap(_jit_state._Layout, "holds", "guards (_Layout.holds)")
    if hasattr(_repeated, "_StepPlan"):  # (after issue 14's repeated step)
        wrap(_repeated._StepPlan, "call", "repeated step (its own checks and all)")
    wrap(_jit_state._Layout, "assemble", "state (_Layout.assemble)")
    wrap(_jit_state._StateSet, "without_grads", "state less dead grads")
    wrap(_jit._Jitted, "_state_signature", "state signature")
    wrap(_program._Program, "entry", "entry lookup")
    wrap(CompiledProgram, "run", "launch (CompiledProgram.run)")
    wrap(_repeated, "donatable", "arrays to donate (donatable)")
    wrap(_repeated, "_to_tensors", "output wrapping")  # (the general path's and a repeat's)
    # (every step's write-back, the general path's too, is _StepPlan's: _repeated's name)
    wrap(_repeated, "_write_state", "write-back (_write_state)")

    def restore() -> None:
        for step in reversed(undo):
            step()

    return totals, restore


def parts(steps: dict[str, Callable[[], Any]], calls: int) -> None:
    for name, step in steps.items():
        totals, restore = _timed_parts()
        try:
            for _ in range(calls):
                bench.ready(step())
        finally:
            restore()
        whole = totals["whole call"][0]
        print(f"\n{name}: CPU per call, mean us over {calls} calls (timers included)")
        covered = 0
        for part, (ns, count) in totals.items():
            if count:
                print(f"  {part:<36} {ns / calls / 1e3:8.1f}  ({count / calls:.0f}x per call)")
                if part != "whole call" and not part.startswith(("  ", "repeated step")):
                    covered += ns  # (a part inside another is counted in that one)
        print(f"  {'other':<36} {(whole - covered) / calls / 1e3:8.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--depths", type=int, nargs="*", default=[2, 8, 32])
    parser.add_argument("--optimizers", nargs="*", default=["SGD", "AdamW"])
    parser.add_argument("--gpt2", action="store_true", help="the 2-layer GPT-2 with AdamW too")
    parser.add_argument(
        "--mlp", action="store_true", help="run.py's MLP (256 -> 512 -> 512 -> 10) with AdamW too"
    )
    parser.add_argument("--parts", action="store_true", help="time the call's parts too")
    args = parser.parse_args()
    variants: dict[str, Callable[[], Any]] = {}
    for depth in args.depths:
        for optimizer in args.optimizers:
            variants.update(variants_of(f"MLP x{depth}", mlp_case(depth), optimizer))
    if args.mlp:
        variants.update(variants_of("MLP", bench._training_cases()["MLP"], "AdamW"))
    if args.gpt2:
        gpt2 = bench._training_cases()["GPT-2 (2 layers)"]
        variants.update(variants_of("GPT-2 (2 layers)", gpt2, "AdamW"))
    interleaved(variants, args.calls)
    if args.parts:
        parts({k: v for k, v in variants.items() if not k.startswith(" ")}, args.calls)


if __name__ == "__main__":
    main()
