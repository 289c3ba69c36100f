"""torchlax on a CUDA GPU: models forward and training, and DLPack promotion, in one process.

    uv sync --group cuda                       # JAX's CUDA plugin (torchlax[cuda])
    uv run python benchmarks/gpu.py            # or benchmarks/gpu_check.sh, tests included
    uv run python benchmarks/gpu.py --quick    # fewer repetitions

ResNet-18 and GPT-2, forward and training step, under PyTorch eager (CUDA),
``torch.compile`` (inductor), ``torch.compile(backend="torchlax")`` on CUDA tensors, and
``torchlax.jit`` on the JAX GPU; then ``from_torch``/``to_torch`` (and the ``torch.compile``
backend's own promotion) for sizes from 1 KiB to 1 GiB, against a plain copy. Float32 at full
precision on both sides (no TF32). Writes ``benchmarks/results/gpu.json`` with the GPU's
name. Timings are medians of steady-state calls, each followed by a device synchronisation;
the first (compiling) call is reported apart. ``--budget-s`` bounds the whole run: what is
left when it runs out is recorded as skipped.
"""

# ruff: noqa: B023  (each closure is timed at once, inside the loop iteration that made it)

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

# torch and XLA share the GPU in one process: XLA must not reserve most of it up front.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"

#: Where the benchmark runs: "cuda" (torch) and "gpu" (JAX), or the CPU under ``--smoke``.
DEVICE = {"torch": "cuda", "jax": "gpu"}
#: Model and data sizes; ``--smoke`` shrinks them to check the script itself on a CPU.
SCALE = {
    "gpt2_layers": 6,
    "gpt2_width": 512,
    "gpt2_tokens": (8, 256),
    "resnet_batch": 32,
    "resnet_size": 224,
}


def sync() -> None:
    if DEVICE["torch"] == "cuda":
        torch.cuda.synchronize()


def gpu_missing() -> str | None:
    if not torch.cuda.is_available():
        return "PyTorch sees no CUDA device (torch.cuda.is_available() is False)."
    try:
        jax.devices("gpu")
    except RuntimeError:
        return (
            "JAX has no GPU backend. Install JAX's CUDA plugin: `uv sync --group cuda` in "
            'this repository, or `pip install "torchlax[cuda]"`.'
        )
    return None


def ready(x):
    """Block until a result (torch CUDA, torchlax or JAX, or a tuple of them) is computed."""
    import torchlax

    if isinstance(x, tuple | list):
        for item in x:
            ready(item)
    elif isinstance(x, torchlax.Tensor):
        x.jax().block_until_ready()
    elif isinstance(x, jax.Array):
        x.block_until_ready()
    elif hasattr(x, "logits"):
        ready(x.logits)
    sync()
    return x


class Bench:
    def __init__(self, quick: bool, budget_s: float, save: Callable[[list[dict]], None]):
        self.quick = quick
        self.deadline = time.monotonic() + budget_s
        self.rows: list[dict] = []
        self._save = save

    def add(self, row: dict) -> dict:
        """Record a row, and save all rows so far (a run killed midway keeps its results)."""
        self.rows.append(row)
        self._save(self.rows)
        return row

    def out_of_time(self) -> bool:
        return time.monotonic() > self.deadline

    def measure(self, group: str, variant: str, fn: Callable[[], object], *, size: str = ""):
        """Time ``fn`` (which must block until its result is ready)."""
        row = {"group": group, "variant": variant, "size": size}
        if self.out_of_time():
            row["skipped"] = "time budget spent"
        else:
            print(f"  {group} · {variant} ...", file=sys.stderr, flush=True)
            try:
                start = time.perf_counter()
                fn()
                row["first_s"] = time.perf_counter() - start
                budget = 0.3 if self.quick else 1.5
                times: list[float] = []
                begin = time.perf_counter()
                while len(times) < 3 or (time.perf_counter() - begin < budget and len(times) < 200):
                    t0 = time.perf_counter()
                    fn()
                    times.append(time.perf_counter() - t0)
                row.update(median_s=statistics.median(times), runs=len(times))
            except Exception as exc:  # a failing variant is reported, not hidden
                row["error"] = f"{type(exc).__name__}: {exc}"[:400]
        return self.add(row)


# -- models --------------------------------------------------------------------------------------


def gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=SCALE["gpt2_layers"],
        n_head=8,
        n_embd=SCALE["gpt2_width"],
        vocab_size=8192,
        n_positions=256,
        bos_token_id=0,
        eos_token_id=0,
    )
    config._attn_implementation = "eager"  # the same attention (matmul + softmax) everywhere
    return GPT2LMHeadModel(config)


def resnet18() -> nn.Module:
    import torchvision

    return torchvision.models.resnet18(num_classes=1000)


def _gpt2_batch(g):
    tokens = torch.randint(0, 8192, SCALE["gpt2_tokens"], device=DEVICE["torch"], generator=g)
    return (tokens,), tokens


def _resnet_batch(g):
    n, size = SCALE["resnet_batch"], SCALE["resnet_size"]
    images = torch.randn(n, 3, size, size, device=DEVICE["torch"], generator=g)
    return (images,), torch.randint(0, 1000, (n,), device=DEVICE["torch"], generator=g)


MODELS = {
    "GPT-2 (6 layers, 512 wide, 8x256 tokens)": (gpt2, _gpt2_batch),
    "ResNet-18 (32x3x224x224)": (resnet18, _resnet_batch),
}


def _loss(out, target):
    logits = out.logits if hasattr(out, "logits") else out
    if logits.dim() == 3:  # language model: next-token prediction
        logits, target = logits[:, :-1].flatten(0, 1), target[:, 1:].flatten()
    return nn.functional.cross_entropy(logits, target)


def bench_models(b: Bench, only: set[str]) -> None:
    import torchlax

    for name, (build, batch) in MODELS.items():
        torch.manual_seed(0)
        model = build().to(DEVICE["torch"])
        inputs, target = batch(torch.Generator(DEVICE["torch"]).manual_seed(1))
        if "forward" in only:
            group = f"forward: {name}"
            model.eval()
            with torch.no_grad():
                b.measure(group, "PyTorch eager (CUDA)", lambda: ready(model(*inputs)))
                torch._dynamo.reset()
                inductor = torch.compile(model)
                b.measure(group, "torch.compile inductor", lambda: ready(inductor(*inputs)))
                torch._dynamo.reset()
                backend = torch.compile(copy.deepcopy(model), backend="torchlax")
                b.measure(
                    group, 'torch.compile backend="torchlax"', lambda: ready(backend(*inputs))
                )
                torch._dynamo.reset()
                with torchlax.enable():
                    jmodel = copy.deepcopy(model).to("jax")
                    jinputs = tuple(t.to("jax") for t in inputs)
                jitted = torchlax.jit(jmodel)
                b.measure(group, "torchlax.jit (JAX GPU)", lambda: ready(jitted(*jinputs)))
                del inductor, backend, jmodel, jitted
        if "training" in only:
            bench_training(b, f"training step: {name}", model.train(), inputs, target)


def _step(model, optimizer, inputs, target, forward=None):
    def step():
        optimizer.zero_grad()
        loss = _loss((model if forward is None else forward)(*inputs), target)
        loss.backward()
        optimizer.step()
        return ready(loss)

    return step


def bench_training(b: Bench, group: str, model: nn.Module, inputs, target) -> None:
    import torchlax

    def sgd(m):
        return torch.optim.SGD(m.parameters(), lr=1e-3)

    eager = copy.deepcopy(model)
    b.measure(group, "PyTorch eager (CUDA)", _step(eager, sgd(eager), inputs, target))
    torch._dynamo.reset()
    ind = copy.deepcopy(model)
    b.measure(
        group, "torch.compile inductor", _step(ind, sgd(ind), inputs, target, torch.compile(ind))
    )
    torch._dynamo.reset()
    tl = copy.deepcopy(model)
    b.measure(
        group,
        'torch.compile backend="torchlax"',
        _step(tl, sgd(tl), inputs, target, torch.compile(tl, backend="torchlax")),
    )
    torch._dynamo.reset()
    with torchlax.enable():
        jm = copy.deepcopy(model).to("jax")
        jinputs = tuple(t.to("jax") for t in inputs)
        jtarget = target.to("jax")
    jitted = torchlax.jit(jm)
    with torchlax.enable():  # forward and backward jitted, SGD step eager (on the JAX GPU)
        b.measure(
            group, "torchlax.jit forward + backward", _step(jm, sgd(jm), jinputs, jtarget, jitted)
        )
    del eager, ind, tl, jm, jitted


# -- DLPack --------------------------------------------------------------------------------------


SIZES = {"1 KiB": 1 << 10, "1 MiB": 1 << 20, "256 MiB": 1 << 28, "1 GiB": 1 << 30}


def _median_s(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        times.append(fn())
    return statistics.median(times)


def bench_dlpack(b: Bench, quick: bool) -> None:
    """Each timed call promotes a tensor it has never seen (no reuse of an earlier array)."""
    import jax.numpy as jnp
    import torchlax
    from torchlax_dynamo._dlpack import torch_to_jax

    repeat = 5 if quick else 15
    group = "DLPack promotion (GPU)"
    for label, nbytes in SIZES.items():
        if b.out_of_time():
            b.add({"group": group, "variant": "all", "size": label, "skipped": "time budget spent"})
            continue
        print(f"  {group} · {label} ...", file=sys.stderr, flush=True)
        numel = nbytes // 4

        shared: dict[str, list[bool]] = {}

        def timed(variant, promote):
            def run():
                t = torch.ones(numel, device=DEVICE["torch"])
                address = t.data_ptr()  # before promotion makes it copy-on-write
                sync()
                start = time.perf_counter()
                array = promote(t)
                array.block_until_ready()
                elapsed = time.perf_counter() - start
                shared.setdefault(variant, []).append(array.unsafe_buffer_pointer() == address)
                return elapsed

            return run

        seconds = {
            "from_torch": _median_s(
                timed("from_torch", lambda t: torchlax.from_torch(t).jax()), repeat
            ),
            "torch.compile backend input": _median_s(
                timed("torch.compile backend input", torch_to_jax), repeat
            ),
        }
        array = jnp.ones(numel, jnp.float32, device=jax.devices(DEVICE["jax"])[0])
        array.block_until_ready()

        def back():
            start = time.perf_counter()
            out = torchlax.to_torch(array)
            elapsed = time.perf_counter() - start
            shared.setdefault("to_torch", []).append(
                out.data_ptr() == array.unsafe_buffer_pointer()
            )
            return elapsed

        seconds["to_torch"] = _median_s(back, repeat)
        source = torch.ones(numel, device=DEVICE["torch"])

        def clone():
            sync()
            start = time.perf_counter()
            source.clone()
            sync()
            return time.perf_counter() - start

        seconds["copy (tensor.clone())"] = _median_s(clone, repeat)
        for variant, median in seconds.items():
            row = {
                "group": group,
                "variant": variant,
                "size": label,
                "median_s": median,
                "runs": repeat,
            }
            if variant in shared:
                row["shared"] = all(shared[variant])
            b.add(row)
        array = source = None  # free this size's buffers before the next


# -- report --------------------------------------------------------------------------------------


def _fmt(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def table(rows: list[dict]) -> str:
    lines = []
    for group in dict.fromkeys(r["group"] for r in rows):
        items = [r for r in rows if r["group"] == group]
        base = next(
            (r for r in items if r["variant"].startswith("PyTorch") and "median_s" in r), None
        )
        lines.append(f"\n{group}")
        lines.append(
            f"  {'variant':<36}{'size':>9}{'steady':>12}{'first call':>12}{'vs eager':>10}"
        )
        for r in items:
            head = f"  {r['variant']:<36}{r['size']:>9}"
            if "median_s" not in r:
                lines.append(f"{head}  {r.get('skipped') or 'failed: ' + r['error'][:80]}")
                continue
            ratio = f"{r['median_s'] / base['median_s']:.2f}x" if base else ""
            first = _fmt(r["first_s"]) if "first_s" in r else ""
            lines.append(f"{head}{_fmt(r['median_s']):>12}{first:>12}{ratio:>10}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=600.0,
        help="stop starting new measurements after this many seconds",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"folder for gpu.json (default {RESULTS}; none under --smoke)",
    )
    parser.add_argument("--only", choices=["forward", "training", "dlpack"], action="append")
    parser.add_argument(
        "--smoke", action="store_true", help="check this script on a CPU: tiny models, CPU tensors"
    )
    args = parser.parse_args()
    if args.smoke:
        DEVICE.update(torch="cpu", jax="cpu")
        SCALE.update(
            gpt2_layers=1, gpt2_width=64, gpt2_tokens=(2, 16), resnet_batch=2, resnet_size=32
        )
        for label in ("256 MiB", "1 GiB"):
            del SIZES[label]
        args.quick = True
    else:
        missing = gpu_missing()
        if missing:
            print(
                f"benchmarks/gpu.py needs a CUDA GPU visible to PyTorch and JAX: {missing}",
                file=sys.stderr,
            )
            return 2
    # Float32 as float32 on both sides: no TF32 in cuBLAS/cuDNN, none in XLA's dots and convs.
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    jax.config.update("jax_default_matmul_precision", "highest")
    torch.backends.cudnn.benchmark = True
    only = set(args.only or ["forward", "training", "dlpack"])
    gpu = torch.cuda.get_device_name(0) if DEVICE["torch"] == "cuda" else "none (--smoke)"
    machine = {
        "gpu": gpu,
        "jax_device": jax.devices(DEVICE["jax"])[0].device_kind,
        "cpu": f"{platform.machine()}, {os.cpu_count()} cores",
        "torch": torch.__version__,
        "jax": jax.__version__,
        "cuda (torch)": torch.version.cuda,
        "precision": "float32, TF32 off (torch), jax_default_matmul_precision=highest",
    }
    out = args.out or (None if args.smoke else RESULTS)
    path = out / "gpu.json" if out else None
    state = {"complete": False}  # stays False in the file of a run killed midway

    def save(rows):
        if path is not None:
            out.mkdir(parents=True, exist_ok=True)
            path.write_text(
                json.dumps(
                    {"machine": machine, "complete": state["complete"], "rows": rows}, indent=1
                )
            )

    b = Bench(args.quick, args.budget_s, save)
    if "dlpack" in only:  # first: cheap, and the point of the GPU path
        bench_dlpack(b, args.quick)
    if only & {"forward", "training"}:
        bench_models(b, only)
    state["complete"] = True
    save(b.rows)
    print(
        f"\ntorchlax GPU benchmarks on {gpu} ({machine['cpu']}, torch {torch.__version__}, "
        f"jax {jax.__version__})"
    )
    print(table(b.rows))
    if path is not None:
        print(f"\nwrote {path}")
    skipped = [r for r in b.rows if "skipped" in r]
    if skipped:
        print(f"{len(skipped)} measurement(s) skipped: the time budget (--budget-s) was spent")
    failed = [r for r in b.rows if "error" in r]
    copied = [r for r in b.rows if r.get("shared") is False]
    for r in copied:
        print(f"NOT ZERO-COPY: {r['variant']} {r['size']}", file=sys.stderr)
    return 1 if failed or copied else 0


if __name__ == "__main__":
    sys.exit(main())
