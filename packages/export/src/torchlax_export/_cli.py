"""``python -m torchlax_export MODULE:FACTORY --example-shapes 2x3,4 -o out/``.

``FACTORY`` (a callable attribute of the importable ``MODULE``) returns the ``torch.nn.Module``
to export; it is exported in eval mode unless ``--train``. One example input is made per
comma-separated shape (``2x3`` is a 2-by-3 tensor, ``scalar`` a 0-d one), random normal for
float dtypes and random 0/1 for integer ones. ``--dynamic-batch`` makes dim 0 of every input a
symbolic dimension ``batch``. Progress goes to stderr, a summary of the artifact to stdout.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time


def _parse_shapes(text: str) -> list[tuple[int, ...]]:
    shapes = []
    for part in text.split(","):
        part = part.strip()
        if part in ("scalar", "()"):
            shapes.append(())
            continue
        try:
            shape = tuple(int(d) for d in part.split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"bad shape {part!r} in --example-shapes: write sizes joined by 'x', inputs "
                "separated by commas, e.g. 2x3,4 (or 'scalar')."
            ) from None
        if any(d < 0 for d in shape):
            raise argparse.ArgumentTypeError(f"negative size in shape {part!r}.")
        shapes.append(shape)
    return shapes


def _parse_range(text: str) -> tuple[int, int | None]:
    low, _, high = text.partition(":")
    try:
        return int(low or 1), (int(high) if high else None)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bad range {text!r}: write MIN:MAX, e.g. 1:1024."
        ) from None


def _load_factory(spec: str):
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SystemExit(
            f"torchlax-export: {spec!r} is not MODULE:FACTORY (e.g. mypkg.models:make_mlp)."
        )
    if "" not in sys.path:
        sys.path.insert(0, "")  # as `python -m` does: modules in the current directory import
    try:
        obj = importlib.import_module(module_name)
    except ImportError as exc:
        raise SystemExit(f"torchlax-export: cannot import module {module_name!r}: {exc}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise SystemExit(
                f"torchlax-export: module {module_name!r} has no attribute {attr!r}."
            ) from None
    if not callable(obj):
        raise SystemExit(
            f"torchlax-export: {spec} is not callable; it should return a torch.nn.Module."
        )
    return obj


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m torchlax_export",
        description="Export a PyTorch module to a StableHLO artifact that runs with JAX alone.",
    )
    parser.add_argument(
        "factory",
        metavar="MODULE:FACTORY",
        help="importable module and a callable in it returning the torch.nn.Module",
    )
    parser.add_argument(
        "--example-shapes",
        required=True,
        type=_parse_shapes,
        help="shapes of the example inputs, e.g. 2x3,4",
    )
    parser.add_argument(
        "--dtype", default="float32", help="dtype of the example inputs (default float32)"
    )
    parser.add_argument("-o", "--output", required=True, help="directory to write the artifact to")
    parser.add_argument(
        "--dynamic-batch",
        nargs="?",
        const="1:",
        default=None,
        type=_parse_range,
        metavar="MIN:MAX",
        help="make dim 0 of every input dynamic (named 'batch')",
    )
    parser.add_argument("--train", action="store_true", help="export in train mode (default: eval)")
    parser.add_argument(
        "--platform",
        action="append",
        dest="platforms",
        help="lower for this JAX platform (repeatable; default: the current backend)",
    )
    options = parser.parse_args(argv)

    def report(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    start = time.perf_counter()
    report("torchlax-export: importing torch and torchlax ...")
    import torch

    from ._export import _step, export

    dtype = getattr(torch, options.dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise SystemExit(f"torchlax-export: unknown dtype {options.dtype!r} (e.g. float32, int64).")
    factory = _load_factory(options.factory)
    with _step(report, f"building the module ({options.factory})"):
        module = factory()
    if not isinstance(module, torch.nn.Module):
        raise SystemExit(
            f"torchlax-export: {options.factory}() returned {type(module).__name__}, "
            "not a torch.nn.Module."
        )
    module.train(options.train)
    gen = torch.Generator().manual_seed(0)
    if dtype.is_floating_point or dtype.is_complex:
        example = [torch.randn(s, dtype=dtype, generator=gen) for s in options.example_shapes]
    else:
        example = [torch.randint(0, 2, s, generator=gen).to(dtype) for s in options.example_shapes]
    dynamic = None
    if options.dynamic_batch is not None:
        low, high = options.dynamic_batch
        batch = torch.export.Dim("batch", min=max(low, 1), max=high)
        dynamic = tuple({0: batch} if len(s) else None for s in options.example_shapes)
    artifact = export(
        module,
        tuple(example),
        dynamic_shapes=dynamic,
        progress=report,
        platforms=tuple(options.platforms) if options.platforms else None,
    )
    with _step(report, "serializing"):
        path = artifact.save(options.output)
    report(f"torchlax-export: done in {time.perf_counter() - start:.1f} s")
    print(f"wrote {path}: {artifact!r}")
    return 0
