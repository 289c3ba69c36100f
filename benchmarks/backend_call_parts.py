"""Where one GPT-2 forward call under ``torch.compile(backend="torchlax")`` goes, against the
same forward under ``torchlax.jit`` (issue 14: backend / jit <= 1.10x).

    uv run python benchmarks/backend_call_parts.py [--rounds 300]

``run.py``'s "forward: GPT-2 (2 layers)" case: HF ``GPT2Model``, 2 layers, width 128, tokens
(4, 64), ``torch.no_grad()``; the backend runs the CPU model on CPU tokens, the jit the model
moved to ``jax``. Each round calls every variant once, in turn, each waited for until its
result is ready, so a busy stretch of the machine lands on all alike.

The backend's call is cut into parts by timestamps taken inside real calls (a part timed alone
in a warm loop costs several times less than inside a call, which starts with caches cold
after XLA ran): wrappers around the callable AOT autograd returns to Dynamo, around
``XlaProgram.__call__`` and around ``CompiledProgram.run`` (the launch). Dynamo's guards are
the difference between the call and the same call under
``torch.compiler.set_stance(skip_guard_eval_unsafe=True)`` (unsafe: for measuring only).
"Program alone" launches the two executables directly on the same arrays and waits.
``--guard-filter NAME`` compiles with ``options={"guard_filter_fn": torch.compiler.NAME}``
(e.g. ``skip_guard_on_all_nn_modules_unsafe``): what a user's own trade of guards for speed
would save.
"""

# ruff: noqa: B023  (each closure is called in the round that made it)

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import jax
import torch
import torch._dynamo.backends.common as dynamo_backends
import torchlax
from torchlax_core.internal import CompiledProgram
from torchlax_dynamo import XlaProgram

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench  # noqa: E402  (benchmarks/run.py: the model and ready())

stamps: dict[str, float] = {}
_clock = time.perf_counter


def _stamped(name: str, fn):
    def call(*args, **kwargs):
        stamps[name + "_enter"] = _clock()
        out = fn(*args, **kwargs)
        stamps[name + "_exit"] = _clock()
        return out

    return call


def _install_stamps() -> list:
    """Stamp AOT autograd's compiled callable, XlaProgram calls and launches; returns the
    XlaPrograms made (to launch the backend's executable alone)."""
    aot_autograd = dynamo_backends.aot_autograd

    def stamping_aot_autograd(**kwargs):
        compiler = aot_autograd(**kwargs)
        return lambda gm, inputs: _stamped("aot", compiler(gm, inputs))

    dynamo_backends.aot_autograd = stamping_aot_autograd
    made: list = []
    init, call, launch = XlaProgram.__init__, XlaProgram.__call__, CompiledProgram.run

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    def stamped_call(self, *args):
        stamps["program_args"] = args  # pyright: ignore[reportArgumentType]  (kept for the launch alone)
        return _stamped("program", call)(self, *args)

    XlaProgram.__init__ = recording_init
    XlaProgram.__call__ = stamped_call
    CompiledProgram.run = _stamped("launch", launch)  # pyright: ignore[reportAttributeAccessIssue]
    return made


def parts(rounds: int, guard_filter: str | None = None) -> None:
    made = _install_stamps()
    torch.manual_seed(0)
    model = bench.small_gpt2().eval()
    tokens = torch.randint(0, 512, (4, 64))
    options = {"guard_filter_fn": getattr(torch.compiler, guard_filter)} if guard_filter else None
    backend = torch.compile(copy.deepcopy(model), backend="torchlax", options=options)
    with torchlax.enable():
        jmodel = copy.deepcopy(model).to("jax")
        jtokens = tokens.to("jax")
    jitted = torchlax.jit(jmodel)
    with torch.no_grad():
        for _ in range(3):
            bench.ready(backend(tokens))
            bench.ready(jitted(jtokens))
    (program,) = made
    (plan,) = program._plans.values()
    entry = plan.memo.entry
    arrays = program._inputs.get_all(stamps["program_args"])
    (jit_program,) = jitted.programs.values()
    (jit_entry,) = jit_program.forward_core._entries.values()
    jit_args: list = []
    jit_run = jit_program.forward_core.run

    def capture(entry, *args, key=None):
        jit_args[:] = args
        return jit_run(entry, *args, key=key)

    jit_program.forward_core.run = capture
    with torch.no_grad():
        bench.ready(jitted(jtokens))
    del jit_program.forward_core.run

    samples: dict[str, list[float]] = {}

    def add(name: str, seconds: float) -> None:
        samples.setdefault(name, []).append(seconds)

    with torch.no_grad():
        for _ in range(rounds):
            t0 = _clock()
            out = backend(tokens)
            t1 = _clock()
            bench.ready(out)
            add("backend: whole call, until ready", _clock() - t0)
            add("  Dynamo before the graph (frame, guards, prologue)", stamps["aot_enter"] - t0)
            add("  AOT autograd's wrapper, before", stamps["program_enter"] - stamps["aot_enter"])
            add(
                "  inputs (DLPack views, cached) and signature",
                stamps["launch_enter"] - stamps["program_enter"],
            )
            add("  launch", stamps["launch_exit"] - stamps["launch_enter"])
            add(
                "  wait for XLA, outputs to torch (DLPack)",
                stamps["program_exit"] - stamps["launch_exit"],
            )
            add("  AOT autograd's wrapper, after", stamps["aot_exit"] - stamps["program_exit"])
            add("  Dynamo after the graph (ModelOutput, DynamicCache)", t1 - stamps["aot_exit"])
            with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
                t0 = _clock()
                out = backend(tokens)
                bench.ready(out)
                add("backend, guards skipped (unsafe; measuring only)", _clock() - t0)
                add("  Dynamo before the graph, guards skipped", stamps["aot_enter"] - t0)
            t0 = _clock()
            out = jitted(jtokens)
            t1 = _clock()
            bench.ready(out)
            add("torchlax.jit: whole call, until ready", _clock() - t0)
            add("  until the call returns", t1 - t0)
            t0 = _clock()
            jax.block_until_ready(entry._launch(arrays, entry._unused_key))
            add("program alone: backend's", _clock() - t0)
            t0 = _clock()
            jax.block_until_ready(jit_entry._launch(*jit_args, jit_entry._unused_key))
            add("program alone: torchlax.jit's", _clock() - t0)
    print(f"GPT-2 (2 layers) forward, {rounds} rounds, us (min / median):")
    for name, times in samples.items():
        print(f"  {name:60s} {min(times) * 1e6:8.0f} {statistics.median(times) * 1e6:8.0f}")
    whole, jit = (
        samples["backend: whole call, until ready"],
        samples["torchlax.jit: whole call, until ready"],
    )
    print(
        f"backend / jit: {min(whole) / min(jit):.3f}x min, "
        f"{statistics.median(whole) / statistics.median(jit):.3f}x median"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--guard-filter", help="a guard filter of torch.compiler, by name")
    arguments = parser.parse_args()
    parts(arguments.rounds, arguments.guard_filter)
