"""``python -m torchlax doctor``: what a plugin author (or a bug report) needs to know; and
``python -m torchlax cache [clear]``: torchlax's compilation cache."""

from __future__ import annotations

import importlib.metadata
import platform
import sys

LAYERS = (
    "torchlax",
    "torchlax-core",
    "torchlax-ops",
    "torchlax-interop",
    "torchlax-dynamo",
    "torchlax-export",
)


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def report() -> str:
    """The doctor's report as text."""
    import jax
    import torchlax_core

    lines = ["torchlax doctor", "", "Versions:"]
    lines.append(f"  python      {platform.python_version()} ({sys.executable})")
    for dist in ("torch", "jax", "jaxlib", *LAYERS):
        lines.append(f"  {dist:<17} {_version(dist)}")
    lines += ["", f"JAX devices ({jax.default_backend()}):"]
    lines += [f"  {d.id}: {d}" for d in jax.devices()]

    try:
        env = torchlax_core.default_env()
        problem = None
    except Exception as exc:  # strict mode (TORCHLAX_STRICT_PLUGINS=1) makes a bad plugin fatal
        problem = exc
        env = torchlax_core.Environment(strict_plugins=False)  # to list what loads and what not
    counts = env.lowering_counts()
    records = env.plugins()
    lines += ["", "Plugins (load order):"]
    for record in records:
        if record.status != "loaded":
            continue
        per = counts.get(record.name, {})
        summary = ", ".join(f"{n} {kind}s" for kind, n in sorted(per.items())) or "no ops"
        source = (
            f"{record.distribution} {record.version or ''}".strip()
            if record.distribution
            else "registered at run time"
        )
        lines.append(f"  {record.name:<20} {source:<30} {summary}")
    blocked = [r for r in records if r.status == "blocked"]
    lines += ["", "Blocked plugins (TORCHLAX_BLOCK_PLUGINS):"]
    lines += [f"  {r.name} ({r.distribution or 'unknown distribution'})" for r in blocked] or [
        "  none"
    ]
    failed = [r for r in records if r.status == "failed"]
    lines += ["", "Failed plugins:"]
    if not failed:
        lines.append("  none")
    for r in failed:
        last = (r.error or "").strip().splitlines()[-1:] or ["?"]
        lines.append(f"  {r.name} ({r.distribution or 'unknown distribution'}): {last[0]}")
    if failed:
        lines.append(
            "  (skipped; the rest loaded. Fix or uninstall them, or block them with "
            "TORCHLAX_BLOCK_PLUGINS.)"
        )
    if problem is not None:
        first = str(problem).strip().splitlines()[:1] or [""]
        lines += [
            "",
            "torchlax.default_env() raises (TORCHLAX_STRICT_PLUGINS=1):",
            f"  {type(problem).__name__}: {first[0]}",
        ]
    return "\n".join(lines)


_USAGE = "usage: python -m torchlax doctor | cache [clear]"


def cache(argv: list[str]) -> int:
    """``python -m torchlax cache``: where the compilation cache is and what it holds;
    ``cache clear`` empties torchlax's directory."""
    import torchlax_core
    from torchlax_core.internal import compilation_cache_directory, compilation_cache_entries

    if argv not in ([], ["clear"]):
        print(_USAGE, file=sys.stderr)
        return 2
    directory = compilation_cache_directory()
    if argv == ["clear"]:
        files, size = torchlax_core.clear_compilation_cache()
        print(
            f"removed {files} compilation cache entries ({size / 2**20:.1f} MiB) from {directory}"
        )
        return 0
    entries = compilation_cache_entries()
    size = sum(p.stat().st_size for p in entries)
    print(f"torchlax's compilation cache: {directory or 'off (TORCHLAX_COMPILATION_CACHE)'}")
    print(f"  {len(entries)} entries, {size / 2**20:.1f} MiB")
    print(f"in use by JAX in this process: {torchlax_core.compilation_cache_dir() or 'none'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["cache"]:
        return cache(argv[1:])
    if argv[:1] != ["doctor"]:
        print(_USAGE, file=sys.stderr)
        return 2
    print(report())
    return 0
