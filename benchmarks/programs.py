"""Compare the XLA program of ``torchlax.jit(step)`` with the JAX + optax step, kernel by kernel.

    uv run python benchmarks/programs.py "GPT-2 (2 layers)" AdamW           # HLO diff only
    uv run python benchmarks/programs.py ResNet-18 SGD --profile --top 20    # + kernel times

Builds both training steps with ``run.py``'s builders, writes their optimized HLO to
``$TMPDIR/torchlax_programs/<model>_<optimizer>_{torchlax,optax}.hlo``, prints the instructions of
each ``ENTRY`` computation by kind where the counts differ (on CPU each one is a kernel), and
with ``--profile`` the kernels that take the most time: XLA:CPU records one profiler event per
thunk, so durations summed by name are the time of each kernel. Wall times on a shared machine
mean little; ``--calls`` alternates the two executables and reports process CPU time too.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run  # noqa: E402  (this directory's benchmark module)

OUT = Path(tempfile.gettempdir()) / "torchlax_programs"


def build(name: str, optimizer: str):
    """Both steps, compiled and warmed up: ``(torchlax call, its executable, optax call, its)``."""
    model, (x, y), loss_fn, make_opt, make_optax = run.training_case(name, optimizer)
    whole = run.torchlax_jit_step(model, make_opt, loss_fn, x, y)
    for _ in range(2):  # compile, steady state
        run.ready(whole())
    programs = getattr(whole, "programs")  # noqa: B009  (set on the jitted function)
    entry = next(iter(next(iter(programs.values())).core._entries.values()))
    _, optax_call, jitted, example = run.optax_baseline(name, model, x, y, make_optax)
    with jax.enable_x64(name != "MLP"):
        optax_executable = jitted.lower(*example).compile()
    return (lambda: run.ready(whole())), entry.executable, optax_call, optax_executable


def entry_kinds(hlo: str) -> collections.Counter:
    entry = hlo[hlo.index("\nENTRY") :]
    kinds = collections.Counter()
    for line in entry.splitlines()[1:]:
        match = re.search(r"=\s*\S+\s+([a-z][\w-]*)\(", line)
        if match:
            kinds[match.group(1)] += 1
    return kinds


def profile(call, calls: int) -> dict[str, float]:
    """Seconds per call of each kernel (profiler events summed by name)."""
    with tempfile.TemporaryDirectory() as folder:
        with jax.profiler.trace(folder, create_perfetto_trace=True):
            for _ in range(calls):
                call()
        trace = next(Path(folder).rglob("*.trace.json.gz"))
        events = json.load(gzip.open(trace))
    events = events["traceEvents"] if isinstance(events, dict) else events
    totals: dict[str, float] = collections.defaultdict(float)
    runtime = ("$", "Thunk", "Pjit", "Execute", "donation")  # Python frames, runtime spans
    for event in events:
        name = event.get("name", "")
        if event.get("ph") == "X" and not any(word in name for word in runtime):
            totals[name] += event.get("dur", 0) / 1e6 / calls
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("model", choices=list(run._training_cases()))
    parser.add_argument("optimizer", choices=list(run.OPTIMIZERS))
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--calls", type=int, default=0, help="alternating timed calls")
    args = parser.parse_args()

    torchlax_call, torchlax_exe, optax_call, optax_exe = build(args.model, args.optimizer)
    OUT.mkdir(exist_ok=True)
    stem = re.sub(r"\W+", "_", f"{args.model}_{args.optimizer}").strip("_")
    texts = {"torchlax": torchlax_exe.as_text(), "optax": optax_exe.as_text()}
    for label, text in texts.items():
        (OUT / f"{stem}_{label}.hlo").write_text(text)
    ours, theirs = entry_kinds(texts["torchlax"]), entry_kinds(texts["optax"])
    print(f"ENTRY instructions: torchlax {sum(ours.values())}, optax {sum(theirs.values())}")
    for kind in sorted(set(ours) | set(theirs)):
        if ours[kind] != theirs[kind]:
            print(f"  {kind:24s} {ours[kind]:5d} {theirs[kind]:5d}")

    if args.calls:
        times = {"torchlax": ([], []), "optax": ([], [])}
        for _ in range(args.calls):
            for label, call in (("torchlax", torchlax_call), ("optax", optax_call)):
                wall, cpu = time.perf_counter(), time.process_time()
                call()
                times[label][0].append(time.perf_counter() - wall)
                times[label][1].append(time.process_time() - cpu)
        for label, (wall, cpu) in times.items():
            print(
                f"{label:9s} wall median {statistics.median(wall) * 1e3:8.2f} ms, "
                f"CPU median {statistics.median(cpu) * 1e3:8.2f} ms"
            )

    if args.profile:
        for label, call in (("torchlax", torchlax_call), ("optax", optax_call)):
            totals = profile(call, 5)
            print(f"{label}: kernels sum to {sum(totals.values()) * 1e3:.2f} ms per call")
            for name, seconds in sorted(totals.items(), key=lambda kv: -kv[1])[: args.top]:
                print(f"  {seconds * 1e3:8.3f} ms  {name}")


if __name__ == "__main__":
    main()
