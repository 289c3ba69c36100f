"""Print the README's speed table from a ``benchmarks/run.py`` results file.

    uv run python benchmarks/readme_table.py [benchmarks/results/results.json]

One row per measurement, one column per way of running it; the ratio in brackets is against
the row's reference (hand-written JAX, jax.numpy, or ``torchlax.jit`` for the GPT-2 forward
under the Dynamo backend), so the README shows the figures exactly as one run measured them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "results.json"

COLUMNS = (
    "PyTorch eager",
    "inductor",
    "torchlax eager",
    "`torchlax.jit`",
    '`backend="torchlax"`',
    "hand-written JAX",
)

# README row label -> the results group it is read from.
ROWS = {
    "`a + b`, 1000 floats": "eager op: add 1000 floats",
    "`a @ b`, 256×256": "eager op: matmul 256x256",
    "MLP forward (256→512→512→10, batch 64)": "forward: MLP",
    "MLP forward, per call until it returns": (
        "per call: MLP forward (no_grad), until the call returns"
    ),
    "GPT-2 forward (2 layers, 4×64 tokens)": "forward: GPT-2 (2 layers)",
    "GPT-2 forward (4 layers, width 256, 4×128 tokens)": (
        "forward: GPT-2 (4 layers, width 256, 128 positions)"
    ),
    "ResNet-18 forward (4×3×64×64)": "forward: ResNet-18",
    "MLP training step, SGD, eagerly": "training step: MLP",
    "MLP training step, SGD": "training step: MLP + SGD",
    "MLP training step, AdamW": "training step: MLP + AdamW",
    "GPT-2 training step, SGD": "training step: GPT-2 (2 layers) + SGD",
    "GPT-2 training step, AdamW": "training step: GPT-2 (2 layers) + AdamW",
    "ResNet-18 training step, SGD": "training step: ResNet-18 + SGD",
    "ResNet-18 training step, AdamW": "training step: ResNet-18 + AdamW",
}


def column(variant: str) -> str | None:
    """The table column a results variant belongs in (None: not shown in the table)."""
    if variant.startswith("PyTorch"):
        return COLUMNS[0]
    if "inductor" in variant:
        return COLUMNS[1]
    if variant == "torchlax eager":
        return COLUMNS[2]
    if variant in ("torchlax.jit", "torchlax.jit(step)", "torchlax.jit (grad enabled)"):
        return COLUMNS[3]
    if 'backend="torchlax"' in variant:
        return COLUMNS[4]
    if variant in ("hand-written JAX", "JAX + optax (torchlax.functional)", "jax.numpy"):
        return COLUMNS[5]
    return None


# Groups whose compiled variants compile something other than the row's measurement (the eager
# MLP step's group also times the model's forward compiled, with backward and SGD eager).
ONLY = {"training step: MLP": (COLUMNS[0], COLUMNS[2], COLUMNS[5])}


def duration(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.3g} µs"
    return f"{seconds * 1e3:.3g} ms"


def table(rows: list[dict]) -> str:
    lines = [
        "| measurement | " + " | ".join(COLUMNS) + " |",
        "| --- |" + " --- |" * len(COLUMNS),
    ]
    for label, group in ROWS.items():
        cells: dict[str, float] = {}
        for row in rows:
            if row["group"] == group and "median_s" in row:
                name = column(row["variant"])
                if name is not None and name not in cells and name in ONLY.get(group, COLUMNS):
                    cells[name] = row["median_s"]
        if not cells:
            continue
        shown = []
        for name in COLUMNS:
            if name not in cells:
                shown.append("")
                continue
            text = duration(cells[name])
            reference = cells.get(COLUMNS[5])
            if group == "forward: GPT-2 (2 layers)":  # issue 14: the backend against the jit
                reference = cells.get(COLUMNS[3]) if name == COLUMNS[4] else None
            if reference and name in (COLUMNS[2], COLUMNS[3], COLUMNS[4]):
                text += f" ({cells[name] / reference:.2f}×)"
            shown.append(text)
        lines.append(f"| {label} | " + " | ".join(shown) + " |")
    return "\n".join(lines)


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS
    results = json.loads(path.read_text())
    print(f"<!-- {results['machine']} -->")
    print(table(results["rows"]))


if __name__ == "__main__":
    main()
