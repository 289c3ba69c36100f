"""Read what ``benchmarks/tpu.py --profile DIR`` brought back from the chip: per HLO op time
from a profile (``NAME.xplane.pb.gz``; needs ``xprof``, e.g. ``uv run --with xprof``), and
from an optimized HLO text (``NAME.N.hlo.txt``) the bytes its top-level instructions write,
by instruction kind and output shape (a static proxy for memory traffic when no profile came
back), and with ``--live`` what is alive at the program's memory peak: the scheduled entry
computation's buffers, each from its instruction to its last use (through bitcasts and tuple
elements), in HBM only (an approximation of XLA's buffer assignment: it shows which arrays
make the peak, not its exact size). Compare two variants by giving both files.

    uv run --with xprof python benchmarks/tpu_profile_report.py DIR/gpt2-jit.xplane.pb.gz
    python benchmarks/tpu_profile_report.py DIR/gpt2-jit.1.hlo.txt DIR/gpt2-torchax.0.hlo.txt
    python benchmarks/tpu_profile_report.py --live DIR/gpt2-jit.1.hlo.txt
"""

from __future__ import annotations

import collections
import gzip
import json
import re
import sys
import tempfile
from pathlib import Path

_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "s32": 4, "u32": 4, "s64": 8, "u64": 8, "pred": 1}
_SKIP = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast"}
_INSTRUCTION = re.compile(r"\s*(?:ROOT )?%\S+ = (\(.*?\)|\S+) ([a-z\-]+)\(")
_ARRAY = re.compile(r"\b(bf16|f16|f32|s32|u32|s64|u64|pred)\[([0-9,]*)\]")


def _nbytes(shape: str) -> int:
    total = 0
    for dtype, dims in _ARRAY.findall(shape):
        n = _BYTES[dtype]
        for d in filter(None, dims.split(",")):
            n *= int(d)
        total += n
    return total


def hlo_bytes(path: Path, top: int = 25) -> None:
    """The entry computation's instructions: bytes written, by kind and by (kind, shape)."""
    text = path.read_text()
    entry = re.search(r"^ENTRY .*?^}", text, re.S | re.M)
    if entry is None:
        raise SystemExit(f"{path}: no ENTRY computation (not an HLO module's text?)")
    kinds: collections.Counter = collections.Counter()
    shapes: collections.Counter = collections.Counter()
    for line in entry.group(0).splitlines()[1:]:
        match = _INSTRUCTION.match(line)
        if match is None or match.group(2) in _SKIP:
            continue
        shape, kind = match.groups()
        if kind.endswith("-start"):  # ((operands), result, context): the result is written
            arrays = _ARRAY.findall(re.sub(r"^\(\(.*?\)", "(", shape))
            shape = "{}[{}]".format(*arrays[0]) if arrays else ""
        n = _nbytes(shape.split("{")[0] if not shape.startswith("(") else shape)
        kinds[kind] += n
        shapes[(kind, re.sub(r"\{[^}]*\}", "", shape))] += n
    print(f"== {path.name}: {sum(kinds.values()) / 1e9:.1f} GB written by top-level instructions")
    print("   " + ", ".join(f"{k} {v / 1e9:.1f}" for k, v in kinds.most_common(8)))
    for (kind, shape), n in shapes.most_common(top):
        print(f"   {n / 1e9:7.2f} GB  {kind:12s} {shape}")


_ALIASES = {"bitcast", "get-tuple-element", "tuple", "copy-done", "async-done"}
_FREE = _ALIASES | {"parameter", "constant"}
_OPERAND = re.compile(r"%[\w.\-]+")


def _hbm_bytes(shape: str) -> int:
    """Bytes of ``shape``'s arrays that live in HBM (a layout's ``S(n)`` is another memory)."""
    total = 0
    for array in re.finditer(
        r"\b(?:bf16|f16|f32|s32|u32|s64|u64|pred)\[[0-9,]*\](\{[^}]*\})?", shape
    ):
        if not (array.group(1) and re.search(r"S\(\d+\)", array.group(1))):
            total += _nbytes(array.group(0))
    return total


def _buffers(lines: list[str]) -> list[tuple[int, int, int, str]]:
    """(first, last, bytes, shape) of each buffer the entry computation allocates."""
    defined: dict[str, tuple[int, str, str]] = {}
    users: dict[str, list[str]] = collections.defaultdict(list)
    last: dict[str, int] = {}
    for i, line in enumerate(lines):
        match = re.match(r"\s*(?:ROOT )?(%\S+) = (\(.*?\)|\S+) ([a-z\-]+)\((.*)", line)
        if match is None:
            continue
        name, shape, kind, rest = match.groups()
        defined[name] = (i, shape, kind)
        last[name] = len(lines) if line.lstrip().startswith("ROOT") else i
        for operand in _OPERAND.findall(rest.split("kind=")[0].split(", metadata=")[0]):
            users[operand].append(name)
    for name in reversed(list(defined)):  # an alias keeps what it aliases alive
        for user in users[name]:
            alias = defined[user][2] in _ALIASES
            last[name] = max(last[name], last[user] if alias else defined[user][0])
    buffers = []
    for name, (i, shape, kind) in defined.items():
        if kind in _FREE:
            continue
        size = _hbm_bytes(shape if not kind.endswith("-start") else shape.split("}, ")[1])
        if size:
            buffers.append((i, last[name], size, re.sub(r"\{[^}]*\}", "", shape)[:80] + " " + kind))
    return buffers


def hlo_live(path: Path, top: int = 15) -> None:
    """What is alive at the scheduled program's peak, grouped by shape (``--live``)."""
    entry = re.search(r"^ENTRY .*?^}", path.read_text(), re.S | re.M)
    if entry is None:
        raise SystemExit(f"{path}: no ENTRY computation (not an HLO module's text?)")
    buffers = _buffers(entry.group(0).splitlines()[1:])
    delta: collections.Counter = collections.Counter()
    for first, end, size, _ in buffers:
        delta[first] += size
        delta[end + 1] -= size
    live = peak = at = 0
    for t in sorted(delta):
        live += delta[t]
        if live > peak:
            peak, at = live, t
    groups: collections.Counter = collections.Counter()
    for first, end, size, shape in buffers:
        if first <= at <= end:
            groups[shape] += size
    print(f"== {path.name}: {peak / 2**30:.2f} GiB of temporaries alive at instruction {at}")
    for shape, n in groups.most_common(top):
        print(f"   {n / 2**30:7.3f} GiB  {shape}")


def profile_ops(path: Path, top: int = 30) -> None:
    """The profile's ``hlo_stats`` table (xprof): the ops that took the most device time."""
    from xprof.convert import raw_to_tool_data

    with tempfile.TemporaryDirectory() as tmp:
        xspace = Path(tmp) / "host.xplane.pb"
        xspace.write_bytes(gzip.decompress(path.read_bytes()))
        data, _ = raw_to_tool_data.xspace_to_tool_data([str(xspace)], "hlo_stats", {})
    table = json.loads(data)
    table = table[0] if isinstance(table, list) else table
    columns = [c["id"] for c in table["cols"]]
    rows = [dict(zip(columns, (c["v"] for c in r["c"]), strict=False)) for r in table["rows"]]
    time_key = next(c for c in columns if "total_self_time" in c)
    rows.sort(key=lambda r: -(r.get(time_key) or 0))
    print(f"== {path.name}: {sum(r.get(time_key) or 0 for r in rows) / 1e3:.1f} ms of HLO ops")
    for r in rows[:top]:
        name = str(r.get("hlo_op_name", r.get("hlo_op_expression", "?")))[:60]
        print(f"   {(r.get(time_key) or 0) / 1e3:8.2f} ms  {r.get('category', '')!s:20s} {name}")


def main(paths: list[str]) -> None:
    live = "--live" in paths
    for p in (Path(a) for a in paths if a != "--live"):
        if p.name.endswith(".xplane.pb.gz"):
            profile_ops(p)
        else:
            (hlo_live if live else hlo_bytes)(p)


if __name__ == "__main__":
    main(sys.argv[1:])
