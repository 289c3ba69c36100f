"""Where one GPT-2 forward call under ``torch.compile(backend="torchlax")`` goes, against the
same forward under ``torchlax.jit`` (issue 14: backend / jit <= 1.10x).

    uv run python benchmarks/backend_call_parts.py [--rounds 300]

``run.py``'s "forward: GPT-2 (2 layers)" case: HF ``GPT2Model``, 2 layers, width 128, tokens
(4, 64), ``torch.no_grad()``; the backend runs the CPU model on CPU tokens, the jit the model
moved to ``jax``. Each round calls every variant once, in turn, each waited for until its
result is ready, so a busy stretch of the machine lands on all alike.

The backend's call is cut into parts by timestamps taken inside real calls (a part timed alone
in a warm loop costs several times less than inside a call, which starts with caches cold
after XLA ran): wrappers around ``XlaProgram.__call__`` and around the launch a repeated call
takes (``Entry.plain_launch``: JAX's launcher itself). Dynamo's guards are the difference
between the call and the same call under
``torch.compiler.set_stance(skip_guard_eval_unsafe=True)`` (unsafe: for measuring only), and
are also timed alone right after each call (the target row's cache entry checked on the
call's arguments, through Dynamo's private debugging helpers).
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
import torchlax
from torchlax_core.internal import CompiledProgram
from torchlax_dynamo import XlaProgram

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench  # noqa: E402  (benchmarks/run.py: the model and ready())

stamps: dict[str, float] = {}
last_args: dict = {}  # XlaProgram -> the arguments of its last call
_clock = time.perf_counter


def _cpu() -> float:
    return time.thread_time_ns() * 1e-9


def _stamped(name: str, fn):
    def call(*args, **kwargs):
        stamps[name + "_enter"] = _clock()
        out = fn(*args, **kwargs)
        stamps[name + "_exit"] = _clock()
        return out

    return call


def _install_stamps() -> list:
    """Stamp XlaProgram calls and launches; returns the XlaPrograms made (to launch the
    backend's executable alone)."""
    made: list = []
    init, call, launch = XlaProgram.__init__, XlaProgram.__call__, CompiledProgram.run

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    def stamped_call(self, *args):
        last_args[self] = args  # kept for the launch alone
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
    with torch.no_grad():
        bench.ready(backend(tokens))
    program = made[-1]  # the backend variant's
    with torchlax.enable():
        jmodel = copy.deepcopy(model).to("jax")
        jtokens = tokens.to("jax")
    jitted = torchlax.jit(jmodel)
    backend_on_jax = torch.compile(
        copy.deepcopy(jmodel), backend="torchlax", isolate_recompiles=True
    )
    with torch.no_grad():
        for _ in range(3):
            bench.ready(backend(tokens))
            bench.ready(jitted(jtokens))
            bench.ready(backend_on_jax(jtokens))
    (arguments,) = program._plans.values()
    last_plan = arguments.last.plan  # the core's CallPlan of the last call
    entry = last_plan.entry
    # A repeated call launches through JAX's launcher itself (Entry.plain_launch), not run().
    launch, key = last_plan.plain
    last_plan.plain = (_stamped("launch", launch), key)
    check_guards = _guard_check(backend, tokens)
    arrays = program._inputs.get_all(last_args[program])
    (jit_program,) = jitted.programs.values()
    (jit_entry,) = jit_program.forward_core._entries.values()
    jit_args: list = []
    jit_run = jit_program.forward_core.run

    def capture(entry, *args, key=None):
        jit_args[:] = args
        return jit_run(entry, *args, key=key)

    jit_program.forward_core.run = capture
    jitted._last.plan = None  # the general path, which launches through forward_core.run
    with torch.no_grad():
        bench.ready(jitted(jtokens))
    del jit_program.forward_core.run

    samples: dict[str, list[float]] = {}

    def add(name: str, seconds: float) -> None:
        samples.setdefault(name, []).append(seconds)

    def backend_parts(name: str, tag: str, compiled) -> None:
        c0 = _cpu()
        t0 = _clock()
        out = compiled(tokens)
        t1 = _clock()
        add(f"{name}: calling thread's CPU time until the call returns", _cpu() - c0)
        bench.ready(out)
        add(f"{name}: whole call, until ready", _clock() - t0)
        add(f"  {tag}: Dynamo (and AOT's wrapper) before the graph", stamps["program_enter"] - t0)
        add(
            f"  {tag}: inputs (DLPack views, cached) and signature",
            stamps["launch_enter"] - stamps["program_enter"],
        )
        add(f"  {tag}: launch", stamps["launch_exit"] - stamps["launch_enter"])
        add(
            f"  {tag}: wait for XLA, outputs to torch (DLPack)",
            stamps["program_exit"] - stamps["launch_exit"],
        )
        add(f"  {tag}: (AOT's wrapper and) Dynamo after the graph", t1 - stamps["program_exit"])
        t0 = _clock()
        check_guards()
        add(f"  {tag}: Dynamo's guard check alone, right after the call", _clock() - t0)

    def guards_skipped() -> None:
        with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
            t0 = _clock()
            out = backend(tokens)
            bench.ready(out)
            add(GUARDS_SKIPPED, _clock() - t0)
            add("  Dynamo before the graph, guards skipped", stamps["program_enter"] - t0)

    def asynchronous(name: str, fn) -> None:
        t0 = _clock()
        out = fn(jtokens)
        t1 = _clock()
        bench.ready(out)
        add(f"{name}: whole call, until ready", _clock() - t0)
        add(f"  {name}: until the call returns", t1 - t0)

    def programs_alone() -> None:
        t0 = _clock()
        jax.block_until_ready(entry._launch(arrays, entry._unused_key))
        add("program alone: backend's", _clock() - t0)
        t0 = _clock()
        jax.block_until_ready(jit_entry._launch(*jit_args, jit_entry._unused_key))
        add("program alone: torchlax.jit's", _clock() - t0)

    # Each round calls every variant once, starting with another one each round: whichever
    # runs first after the XLA programs of the round before finds colder caches.
    variants = [
        lambda: backend_parts(BACKEND, "backend", backend),
        guards_skipped,
        lambda: asynchronous(ON_JAX, backend_on_jax),
        lambda: asynchronous(JIT, jitted),
        programs_alone,
    ]
    with torch.no_grad():
        for round_ in range(rounds):
            first = round_ % len(variants)
            for variant in variants[first:] + variants[:first]:
                variant()
    print(f"GPT-2 (2 layers) forward, {rounds} rounds, us (min / median):")
    for name in sorted(samples, key=_row_order):
        times = samples[name]
        print(f"  {name:66s} {min(times) * 1e6:8.0f} {statistics.median(times) * 1e6:8.0f}")
    jit = samples[f"{JIT}: whole call, until ready"]
    for name in (BACKEND, GUARDS_SKIPPED, ON_JAX):
        times = samples[name if name == GUARDS_SKIPPED else f"{name}: whole call, until ready"]
        print(
            f"{name} / jit: {min(times) / min(jit):.3f}x min, "
            f"{statistics.median(times) / statistics.median(jit):.3f}x median"
        )


def _guard_check(compiled, tokens):
    """Dynamo's guard check of ``compiled``'s one cache entry, on the arguments of a call with
    ``tokens`` (Dynamo's private debugging helpers; measuring only)."""
    import gc

    from torch._dynamo.convert_frame import input_codes
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    codes = [ref() for ref in list(input_codes.seen)]
    (code,) = [c for c in codes if c is not None and _debug_get_cache_entry_list(c)]
    # transformers' models run through a decorated forward: the frame is its wrapper
    function = next(
        f for f in gc.get_objects() if type(f).__name__ == "function" and f.__code__ is code
    )
    frame_locals = {"self": compiled._orig_mod, "args": (tokens,), "kwargs": {}}
    for name, cell in zip(code.co_freevars, function.__closure__ or (), strict=True):
        frame_locals[name] = cell.cell_contents
    with torch.no_grad():  # the entry whose guards pass: the target row's
        (manager,) = [
            e.guard_manager
            for e in _debug_get_cache_entry_list(code)
            if e.guard_manager.check(frame_locals)
        ]
    return lambda: manager.check(frame_locals)


BACKEND = "backend"
GUARDS_SKIPPED = "backend, guards skipped (unsafe; measuring only)"
ON_JAX = "backend on the model moved to jax"
JIT = "torchlax.jit"


def _row_order(name: str) -> int:
    # Rows stay in the order they were first added, which the rotation changes per round.
    return _ROWS.setdefault(name, len(_ROWS))


_ROWS: dict[str, int] = {}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--guard-filter", help="a guard filter of torch.compiler, by name")
    arguments = parser.parse_args()
    parts(arguments.rounds, arguments.guard_filter)
