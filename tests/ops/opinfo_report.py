"""Run the OpInfo harness in-process and print coverage; optionally regenerate the failure table.

    uv run python tests/ops/opinfo_report.py [-j 2] [-k SUBSTRING] [--write-table] [--slowest 20]

An op passes in a mode when every dtype it was tested at passes. ``--write-table`` rewrites
``opinfo_expected_failures.py`` from this run (dtype and shape mismatches are never written:
they stay failures). Run it over all cases (no ``-k``) before writing the table.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The report covers the whole matrix: jit mode at every dtype too (the suite runs one per op).
os.environ["TORCHLAX_OPINFO_JIT_DTYPES"] = "all"
os.environ["TORCHLAX_OPINFO_HALF_OPS"] = "all"  # and float16 on every op (the suite: some)

import test_opinfo as harness  # noqa: E402
import torchlax_core  # noqa: E402

TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "opinfo_expected_failures.py")


def classify(exc: BaseException) -> str:
    if isinstance(exc, torchlax_core.OpNotLoweredError):
        name = torchlax_core._registry.op_name(exc.op) if exc.op is not None else "?"
        return f"not lowered yet: {name}"
    if isinstance(exc, harness.DtypeMismatch):
        return f"DTYPE MISMATCH: {exc}"
    if isinstance(exc, harness.ShapeMismatch):
        return f"SHAPE MISMATCH: {exc}"
    if type(exc) is AssertionError:
        return "values differ from PyTorch"
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first[:120]}"


def run_one(index: int):
    case = harness.CASES[index]
    torchlax_core.default_env().config.fallback_to_torch = False
    start = time.perf_counter()
    try:
        harness.run_case(case)
        outcome = None
    except RecursionError:
        outcome = "RecursionError"
    except Exception as exc:  # noqa: BLE001  (every failure is a finding)
        outcome = classify(exc)
        if os.environ.get("OPINFO_TRACEBACKS"):
            print(f"---- {case.id}", file=sys.stderr)
            traceback.print_exc()
        elif os.environ.get("OPINFO_MESSAGES"):
            print(f"---- {case.id}: {str(exc)[:600]}", file=sys.stderr)
    return index, outcome, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("-j", "--jobs", type=int, default=1)
    parser.add_argument("-k", default=None, help="only cases whose id contains this")
    parser.add_argument("--ops", default=None, help="comma-separated OpInfo names (with variant)")
    parser.add_argument("--mode", choices=harness.MODES, default=None)
    parser.add_argument("--write-table", action="store_true")
    parser.add_argument(
        "--prune-table",
        action="store_true",
        help="rerun only the table's cases and drop the entries that now pass",
    )
    parser.add_argument("--failures", action="store_true", help="list every failing case")
    parser.add_argument("--slowest", type=int, default=0)
    parser.add_argument("--start", type=int, default=0, help="first case index (to split a run)")
    parser.add_argument("--stop", type=int, default=None, help="case index to stop before")
    parser.add_argument("--log", default=None, help="append 'case-id<TAB>outcome' per case")
    opts = parser.parse_args()

    indices = [
        i
        for i, c in enumerate(harness.CASES[: opts.stop])
        if i >= opts.start and (not opts.prune_table or harness.expected_failure(c) is not None)
    ]
    indices = [
        i
        for i in indices
        if (c := harness.CASES[i])
        if (opts.k is None or opts.k in c.id)
        and (opts.ops is None or harness.case_name(c.op) in opts.ops.split(","))
        and (opts.mode is None or c.mode == opts.mode)
    ]
    start = time.perf_counter()
    if opts.jobs > 1:
        with multiprocessing.get_context("spawn").Pool(opts.jobs) as pool:
            results = pool.map(run_one, indices, chunksize=8)
    else:
        results = []
        for i in indices:
            results.append(run_one(i))
            if opts.log:
                with open(opts.log, "a") as f:
                    f.write(f"{harness.CASES[i].id}\t{results[-1][1]}\n")
    wall = time.perf_counter() - start

    per_op = collections.defaultdict(dict)  # (mode, case name) -> {dtype: outcome}
    reasons = collections.Counter()
    for index, outcome, _ in results:
        case = harness.CASES[index]
        per_op[(case.mode, harness.case_name(case.op))][harness.dtype_name(case.dtype)] = outcome
        if outcome is not None:
            reasons[outcome.split(":")[0] if outcome.startswith("not lowered") else outcome] += 1

    print(f"{len(results)} cases in {wall:.0f}s wall ({opts.jobs} process(es))")
    for mode in harness.MODES:
        ops = {name: d for (m, name), d in per_op.items() if m == mode}
        if not ops:
            continue
        passed = sum(all(o is None for o in d.values()) for d in ops.values())
        cases = [o for d in ops.values() for o in d.values()]
        ok = sum(o is None for o in cases)
        print(
            f"{mode:5s}: ops {passed}/{len(ops)} pass ({100 * passed / len(ops):.1f}%), "
            f"cases {ok}/{len(cases)} ({100 * ok / len(cases):.1f}%)"
        )
    mismatches = [(harness.CASES[i].id, o) for i, o, _ in results if o and "MISMATCH" in o]
    print(f"dtype/shape mismatches: {len(mismatches)}")
    for case_id, outcome in mismatches:
        print(f"  {case_id}: {outcome}")
    print("failure reasons:")
    for reason, count in reasons.most_common(40):
        print(f"  {count:5d}  {reason}")
    if opts.failures:
        for index, outcome, _ in results:
            if outcome is not None:
                print(f"  FAIL {harness.CASES[index].id}: {outcome}")
    if opts.slowest:
        print("slowest cases:")
        for index, _, seconds in sorted(results, key=lambda r: -r[2])[: opts.slowest]:
            print(f"  {seconds:6.2f}s {harness.CASES[index].id}")
    if opts.write_table or opts.prune_table:
        write_table(results)


def write_table(results) -> None:
    """One entry per failing case; a dtype of None where all of an op's dtypes fail alike."""
    groups = collections.defaultdict(dict)  # (name, variant, mode) -> {dtype: outcome}
    tested = collections.defaultdict(set)  # every dtype a group is tested at, run or not
    for case in harness.CASES:
        name, variant, dtype, mode = case.key
        tested[(name, variant, mode)].add(dtype)
    for index, outcome, _ in results:
        case = harness.CASES[index]
        name, variant, dtype, mode = case.key
        groups[(name, variant, mode)][dtype] = outcome
    entries = {}
    for (name, variant, mode), outcomes in groups.items():
        failing = {d: o for d, o in outcomes.items() if o is not None and "MISMATCH" not in o}
        if not failing:
            continue
        if set(failing) == tested[(name, variant, mode)] and len(set(failing.values())) == 1:
            entries[(name, variant, None, mode)] = next(iter(failing.values()))
        else:
            for dtype, outcome in failing.items():
                entries[(name, variant, dtype, mode)] = outcome
    for key in [k for k in entries if k in harness.MACHINE_FAILURES]:
        del entries[key]  # listed in opinfo_machine_failures.py, for the machines they fail on
    for key in entries:  # a hand-written reason outlives a regeneration
        if key in harness.EXPECTED_FAILURES:
            entries[key] = harness.EXPECTED_FAILURES[key]
    with open(TABLE) as f:
        head = f.read().split("EXPECTED_FAILURES")[0].split("\n_")[0]
    lines = [
        head.rstrip() + "\n",
        "",
        "EXPECTED_FAILURES: dict[tuple[str, str | None, str | None, str], str] = {",
    ]
    by_reason = collections.defaultdict(list)
    for key, reason in entries.items():
        group = reason.split(":")[0] if reason.startswith("not lowered") else reason
        by_reason[group].append((key, reason))
    for group in sorted(by_reason, key=lambda g: (-len(by_reason[g]), g)):
        lines.append(f"    # {group}")
        for key, reason in sorted(by_reason[group], key=lambda kr: tuple(str(k) for k in kr[0])):
            lines.append(f"    {key!r}: {reason!r},")
    lines.append("}")
    with open(TABLE, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {len(entries)} entries to {TABLE}")


if __name__ == "__main__":
    main()
