"""Training steps on a TPU: torchlax against torchax and hand-written JAX, one row per variant.

    python3 benchmarks/tpu.py                      # on a TPU machine (docs/tpu.md)
    python3 benchmarks/tpu.py --models gpt2 --variants torchax,jax,jit
    uv run python benchmarks/tpu.py --smoke        # CI-sized shapes on the CPU, in one process

Models (bf16 weights, random, from configs; dropout 0 so that every variant computes the same
function, and so that attention on a TPU runs a Pallas attention kernel, which draws no
dropout mask: GPT-2's default ``attn_pdrop=0.1`` takes the plain lowering in training; ``--gpt2-dropout
0.1`` measures that): GPT-2 small (transformers' GPT2LMHeadModel, AdamW lr 1e-4, batch 8 x 1024), a
Llama-style decoder of ~400 M parameters (LlamaForCausalLM, AdamW, sequence 2048, the largest
batch of ``--llama-batch``, halved until it fits), ResNet-50 (torchvision, SGD lr 0.1 momentum
0.9, batch 128 x 224 x 224). Variants:

- ``jit``: ``torchlax.jit(step)``, the step being zero_grad, forward, ``loss.backward()``,
  ``opt.step()`` with torch.optim on torchlax Tensors;
- ``compile``: ``torch.compile(step, backend="torchlax")`` on the same step over jax tensors;
- ``functional``: ``torchlax.functional(model)`` + ``jax.value_and_grad`` + optax in one
  ``jax.jit`` (parameters and optimizer state donated);
- ``functional_cpu``: the same, handed a module still on the CPU (what the issue's run did);
- ``jax``: GPT-2 written by hand in JAX (this file) + optax, same weights;
- ``torchax``: ``torchax.extract_jax`` + ``jax.value_and_grad`` + optax (when torchax imports).

Each row: median steady step, tokens (images)/s, MFU against the chip's bf16 peak
(``--peak-tflops``, 197 for a TPU v5e), first-call time (everything up to the first result:
tracing, compiling, running), XLA compilations during the steady steps (0 expected), peak
memory of the step's executable (``memory_analysis``: arguments + outputs - donated aliases +
temporaries) and of the device (``memory_stats()['peak_bytes_in_use']`` after setup, after the
first call and at the end), and the process's host RSS (growth while stepping; a watchdog stops
a variant whose RSS grows by more than ``--rss-limit-gib``).

FLOPs of a step: transformers ``6·N·tokens + 12·L·d·T·tokens`` (N parameters, tied embeddings
once; L layers, d width, T sequence length: forward + backward of every weight product and of
the two attention products, no recomputation); ResNet-50 ``3 x 8.18 GFLOP`` per 224² image
(its forward is 4.09 G multiply-adds; backward twice the forward).

On a TPU each (model, variant) runs in a process of its own (the device's peak counts from the
process's start, and a variant that exhausts memory takes only itself down); results are
written to ``--out`` (JSON) after every variant. ``--smoke`` runs every row in this process.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
MODELS = ("gpt2", "llama", "resnet50")
VARIANTS = ("torchax", "jax", "functional", "jit", "compile", "functional_cpu")
GIB = 1 << 30
_STARTED = time.perf_counter()
#: Where a child process saves its row (set by ``child``): ``progress`` saves after each stage,
#: so a variant stopped at its time limit still says how far it went.
_SAVE: list[Callable[[dict], None]] = []

#: Shapes of the full run and of ``--smoke`` (CI-sized, on the CPU).
FULL = {
    "gpt2": {"layers": 12, "width": 768, "heads": 12, "vocab": 50257, "batch": 8, "seq": 1024},
    "llama": {
        "layers": 22,
        "width": 1024,
        "heads": 16,
        "kv_heads": 8,
        "ffn": 4096,
        "vocab": 32000,
        "batch": 4,
        "seq": 2048,
    },
    "resnet50": {"blocks": (3, 4, 6, 3), "batch": 128, "size": 224},
}
SMOKE = {
    "gpt2": {"layers": 1, "width": 64, "heads": 4, "vocab": 256, "batch": 2, "seq": 32},
    "llama": {
        "layers": 2,
        "width": 64,
        "heads": 4,
        "kv_heads": 2,
        "ffn": 128,
        "vocab": 256,
        "batch": 2,
        "seq": 32,
    },
    "resnet50": {"blocks": (1, 1, 1, 1), "batch": 2, "size": 32},
}


# -- measuring -----------------------------------------------------------------------------------


class Watch:
    """Host memory (anonymous RSS: what the process allocated, not the libraries it maps, which
    on the TPU machine count ~17 GiB as torch's files are paged in), sampled every 0.2 s: the
    largest growth over ``base``; past ``limit`` bytes the process records why and exits (a TPU
    machine that runs out of RAM returns nothing)."""

    def __init__(self, limit: int, on_limit: Callable[[str], None]):
        self.base = self.rss()
        self.peak = self.base
        self.limit = limit
        self.on_limit = on_limit
        threading.Thread(target=self._run, daemon=True).start()

    @staticmethod
    def rss() -> int:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
        return 0

    def rebase(self) -> None:
        self.base = self.peak = self.rss()

    def _run(self) -> None:
        while True:
            rss = self.rss()
            self.peak = max(self.peak, rss)
            if rss - self.base > self.limit:
                self.on_limit(
                    f"host memory (anonymous RSS) grew by {(rss - self.base) / GIB:.1f} GiB: stopped"
                )
                os._exit(3)
            time.sleep(0.2)


class Compilations:
    """XLA compilations seen by JAX's monitoring (every backend compile, jitted or eager op)."""

    def __init__(self):
        import jax

        self.count = 0

        def listener(event: str, *_: Any, **__: Any) -> None:
            if event == "/jax/core/compile/backend_compile_duration":
                self.count += 1

        jax.monitoring.register_event_duration_secs_listener(listener)


def progress(row: dict, stage: str) -> None:
    """Record (and print) that ``stage`` is done, in seconds since the process started."""
    at = round(time.perf_counter() - _STARTED, 1)
    row.setdefault("progress", []).append([stage, at])
    print(f"[tpu] {row.get('model')} {row.get('variant')}: {stage} at {at} s", flush=True)
    for save in _SAVE:
        save(row)


def device_memory() -> dict[str, int]:
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    return {k: stats[k] for k in ("bytes_in_use", "peak_bytes_in_use", "bytes_limit") if k in stats}


def executable_peak(compiled: Any) -> dict[str, int]:
    """Arguments + outputs - donated aliases + temporaries of one executable (and XLA's own
    ``peak_memory_in_bytes`` where the backend reports it)."""
    stats = compiled.memory_analysis()
    if stats is None:
        return {}
    out = {
        "exe_peak_bytes": stats.argument_size_in_bytes
        + stats.output_size_in_bytes
        - stats.alias_size_in_bytes
        + stats.temp_size_in_bytes,
        "exe_temp_bytes": stats.temp_size_in_bytes,
        "exe_argument_bytes": stats.argument_size_in_bytes,
    }
    xla_peak = getattr(stats, "peak_memory_in_bytes", 0)
    if xla_peak:
        out["exe_xla_peak_bytes"] = xla_peak
    return out


def attention_paths() -> list[str]:
    """How this process's attention calls ran: "Pallas kernel", or why the plain lowering
    (what ``TORCHLAX_LOG=info`` says once per kind of call; empty for a model without
    ``scaled_dot_product_attention`` or a variant that is not torchlax's)."""
    try:
        from torchlax_ops import _attention_kernels
    except ImportError:
        return []
    return _attention_kernels.seen()


def attention_choice(chosen: str, row: dict) -> None:
    """``--attention never|always``: ``TORCHLAX_ATTENTION_KERNEL`` for this row (an A/B of the
    Pallas kernel within one benchmark run)."""
    from torchlax_ops import _attention_kernels

    _attention_kernels.choice = chosen
    row["attention_kernel"] = chosen


def profile(name: str, run: Callable, executables: list, folder: Path, row: dict) -> None:
    """``--profile``: each executable's optimized HLO (``folder/name.N.hlo.txt``) and one step
    under JAX's profiler, its XSpace gzipped flat beside them (``folder/name.xplane.pb.gz``:
    the device tool returns files two folders down and 16 MiB at most; xprof reads it)."""
    import gzip
    import shutil

    import jax

    folder.mkdir(parents=True, exist_ok=True)
    for i, compiled in enumerate(executables):
        (folder / f"{name}.{i}.hlo.txt").write_text(compiled.as_text())
    with jax.profiler.trace(str(folder / name)):
        run()
    for i, xspace in enumerate(sorted((folder / name).rglob("*.xplane.pb"))):
        target = folder / f"{name}{'.' + str(i) if i else ''}.xplane.pb.gz"
        with xspace.open("rb") as src, gzip.open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)
    shutil.rmtree(folder / name, ignore_errors=True)
    progress(row, "profiled")


def ready(x: Any) -> Any:
    import jax
    import torchlax

    for leaf in jax.tree.leaves(x, is_leaf=lambda t: isinstance(t, torchlax.Tensor)):
        if isinstance(leaf, torchlax.Tensor):
            leaf.jax().block_until_ready()
        elif isinstance(leaf, jax.Array):
            leaf.block_until_ready()
    return x


# -- models --------------------------------------------------------------------------------------


def build(model: str, shape: dict) -> Any:
    """The model (float32, CPU, seeded), its batch (CPU tensors) and its FLOPs per step."""
    import torch

    torch.manual_seed(0)
    if model == "resnet50":
        from torchvision.models.resnet import Bottleneck, ResNet

        net = ResNet(Bottleneck, list(shape["blocks"]))
        x = torch.randn(shape["batch"], 3, shape["size"], shape["size"])
        y = torch.randint(0, 1000, (shape["batch"],))
        flops = 3 * 8.18e9 * shape["batch"] * (shape["size"] / 224) ** 2
        return net, (x, y), flops, shape["batch"]
    if model == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(
            n_layer=shape["layers"],
            n_embd=shape["width"],
            n_head=shape["heads"],
            vocab_size=shape["vocab"],
            n_positions=max(1024, shape["seq"]),
            resid_pdrop=shape.get("dropout", 0.0),
            embd_pdrop=shape.get("dropout", 0.0),
            attn_pdrop=shape.get("dropout", 0.0),
        )
        net = GPT2LMHeadModel(config)
    else:
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(
            hidden_size=shape["width"],
            intermediate_size=shape["ffn"],
            num_hidden_layers=shape["layers"],
            num_attention_heads=shape["heads"],
            num_key_value_heads=shape["kv_heads"],
            vocab_size=shape["vocab"],
            max_position_embeddings=shape["seq"],
        )
        net = LlamaForCausalLM(config)
    net.config.use_cache = False
    ids = torch.randint(0, shape["vocab"], (shape["batch"], shape["seq"]))
    params = sum(p.numel() for p in net.parameters())  # tied weights once
    tokens = shape["batch"] * shape["seq"]
    flops = 6 * params * tokens + 12 * shape["layers"] * shape["width"] * shape["seq"] * tokens
    return net, (ids,), flops, tokens


class Logits:
    """A causal LM as ``ids -> logits`` (a plain tensor out, for every variant alike)."""

    @staticmethod
    def wrap(net: Any) -> Any:
        import torch

        class LM(torch.nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, ids):
                return self.inner(input_ids=ids, use_cache=False).logits

        return LM(net)


def torch_loss(model: str) -> Callable:
    import torch.nn.functional as F

    if model == "resnet50":
        return lambda m, x, y: F.cross_entropy(m(x), y)

    def lm_loss(m, ids):
        logits = m(ids)[:, :-1]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))

    return lm_loss


def jax_loss(model: str, forward: Callable) -> Callable:
    """``loss(params, batch)`` in JAX over ``forward(params, *inputs) -> logits``."""
    import jax
    import jax.numpy as jnp

    def cross_entropy(logits, labels):
        logp = jax.nn.log_softmax(logits.astype(jnp.float32))
        return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], 1)).astype(logits.dtype)

    if model == "resnet50":
        return lambda p, batch: cross_entropy(forward(p, batch[0]), batch[1])

    def lm_loss(p, batch):
        ids = batch[0]
        logits = forward(p, ids)[:, :-1]
        return cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))

    return lm_loss


def optimizers(model: str) -> tuple[Callable, Any]:
    import optax
    import torch

    if model == "resnet50":
        return (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)), optax.sgd(0.1, momentum=0.9)
    return (lambda ps: torch.optim.AdamW(ps, lr=1e-4)), optax.adamw(1e-4, weight_decay=0.01)


def to_jax(t: Any) -> Any:
    """A CPU tensor as a JAX array on the default device (bf16 through float32: NumPy has none)."""
    import jax.numpy as jnp
    import torch

    if t.dtype == torch.bfloat16:
        return jnp.asarray(t.detach().float().numpy()).astype(jnp.bfloat16)
    return jnp.asarray(t.detach().numpy())


def hand_written_gpt2(net: Any, shape: dict) -> tuple[dict, Callable]:
    """GPT-2 written in JAX over ``net``'s weights (bf16 arrays on the default device)."""
    import jax
    import jax.numpy as jnp

    state = net.inner.state_dict()
    params = {
        k: to_jax(v)
        for k, v in state.items()
        if not k.endswith((".attn.bias", ".attn.masked_bias"))
    }
    params.pop("lm_head.weight", None)  # tied to transformer.wte.weight
    heads = shape["heads"]

    def norm(x, p, name):
        mean = x.mean(-1, keepdims=True)
        var = jnp.square(x - mean).mean(-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(var + 1e-5) * p[name + ".weight"] + p[name + ".bias"]

    def dense(x, p, name):
        return x @ p[name + ".weight"] + p[name + ".bias"]  # GPT-2's Conv1D: (in, out)

    def forward(p, ids):
        b, t = ids.shape
        h = p["transformer.wte.weight"][ids] + p["transformer.wpe.weight"][:t]
        for i in range(shape["layers"]):
            pre = f"transformer.h.{i}."
            q, k, v = jnp.split(dense(norm(h, p, pre + "ln_1"), p, pre + "attn.c_attn"), 3, -1)
            q, k, v = (a.reshape(b, t, heads, -1) for a in (q, k, v))
            att = jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(b, t, -1)
            h = h + dense(att, p, pre + "attn.c_proj")
            mlp = jax.nn.gelu(
                dense(norm(h, p, pre + "ln_2"), p, pre + "mlp.c_fc"), approximate=True
            )
            h = h + dense(mlp, p, pre + "mlp.c_proj")
        return norm(h, p, "transformer.ln_f") @ p["transformer.wte.weight"].T

    return params, forward


# -- variants ------------------------------------------------------------------------------------


def torch_step(net: Any, opt: Any, loss_fn: Callable, batch: tuple) -> Callable:
    def step():
        opt.zero_grad()
        loss = loss_fn(net, *batch)
        loss.backward()
        opt.step()
        return loss

    return step


def run_torchlax(variant: str, model: str, net: Any, batch: tuple, row: dict) -> tuple:
    """``(step, executables)`` of ``torchlax.jit(step)`` or the torchlax Dynamo backend."""
    import torch
    import torchlax

    make_opt, _ = optimizers(model)
    with torchlax.enable():
        jnet = net.to("jax")
        jbatch = tuple(t.to("jax") for t in batch)
    progress(row, "model on the TPU")
    opt = make_opt(jnet.parameters())
    step = torch_step(jnet, opt, torch_loss(model), jbatch)
    fast = torchlax.jit(step) if variant == "jit" else torch.compile(step, backend="torchlax")

    def run() -> Any:
        # Wait for the loss, then for every queued computation (the optimizer's program
        # too, where Dynamo splits the step). Not ``.jax()`` of the state: that hands its
        # arrays out, and the next step must then copy each one before donating it.
        loss = ready(fast())
        torch.jax.synchronize()  # pyright: ignore[reportAttributeAccessIssue]
        return loss

    t0 = time.perf_counter()
    run()
    row["first_call_s"] = time.perf_counter() - t0
    progress(row, "first call")
    if variant == "compile":  # Dynamo compiles again once the optimizer's state exists
        t0 = time.perf_counter()
        run()
        row["second_call_s"] = time.perf_counter() - t0

    def executables() -> list:
        if variant != "jit":
            return []
        return [c for p in fast.programs.values() for c in p.compiled.values()]

    return run, executables


def jax_loss_of(variant: str, model: str, net: Any, shape: dict) -> tuple[dict, Callable]:
    """``(params, loss(params, batch))`` of a JAX variant (``torchax``, ``functional``,
    ``functional_cpu``, ``jax``) over ``net``'s weights."""
    if variant == "jax":
        params, forward = hand_written_gpt2(net, shape)
        buffers: dict = {}
    elif variant == "torchax":
        import torchax

        weights, jfunc = torchax.extract_jax(net)
        trainable = {n for n, p in net.named_parameters() if p.requires_grad}
        params = {k: v for k, v in weights.items() if k in trainable}
        buffers = {k: v for k, v in weights.items() if k not in trainable}
        forward = lambda p, *xs: jfunc(p, xs)  # noqa: E731
    else:
        import torchlax

        if variant == "functional":
            with torchlax.enable():
                net = net.to("jax")
        params, buffers, fn = torchlax.functional(net)
        forward = fn
    if variant != "jax":
        merged = forward
        forward = lambda p, *xs: merged({**buffers, **p}, *xs)  # noqa: E731
    return params, jax_loss(model, forward)


def residuals(loss_of: Callable, params: dict, batch: tuple) -> dict:
    """What the backward pass keeps from the forward, as traced (before XLA fuses or
    rematerializes anything): total bytes and the largest groups by dtype and shape."""
    import collections

    import jax
    from jax._src.ad_checkpoint import saved_residuals

    specs = tuple(jax.ShapeDtypeStruct(t.shape, to_jax(t[:1]).dtype) for t in batch)
    groups: collections.Counter = collections.Counter()
    dtypes: collections.Counter = collections.Counter()
    for aval, why in saved_residuals(loss_of, params, specs):
        if "from the argument" not in why:  # the weights and inputs are alive anyway
            groups[f"{aval.dtype}{list(aval.shape)}"] += aval.size * aval.dtype.itemsize
            dtypes[str(aval.dtype)] += aval.size * aval.dtype.itemsize
    return {
        "residual_bytes": sum(groups.values()),
        "residual_bytes_by_dtype": dict(dtypes),
        "largest": dict(groups.most_common(6)),
    }


def run_jax_variant(variant: str, model: str, net: Any, batch: tuple, shape: dict, row: dict):
    """``(step, executables)`` of a JAX + optax step (``torchax``, ``functional``, ``jax``)."""
    import jax
    import optax

    _, tx = optimizers(model)
    params, loss_of = jax_loss_of(variant, model, net, shape)
    if row.get("residuals"):
        row.update(residuals(loss_of, params, batch))
        return None, None

    def step(p, opt_state, b):
        loss, grads = jax.value_and_grad(loss_of)(p, b)
        updates, opt_state = tx.update(grads, opt_state, p)
        return optax.apply_updates(p, updates), opt_state, loss

    jbatch = tuple(to_jax(t) for t in batch)
    if variant != "functional_cpu":
        jbatch = jax.device_put(jbatch, jax.devices()[0])
    state = {"p": params, "o": tx.init(params)}
    t0 = time.perf_counter()
    progress(row, "parameters and optimizer state")
    compiled = jax.jit(step, donate_argnums=(0, 1)).lower(state["p"], state["o"], jbatch).compile()
    progress(row, "compiled")

    def run():
        state["p"], state["o"], loss = compiled(state["p"], state["o"], jbatch)
        return ready((loss, state["p"]))

    run()
    row["first_call_s"] = time.perf_counter() - t0
    row["devices_of_params"] = sorted(
        {str(d) for a in jax.tree.leaves(state["p"]) for d in a.devices()}
    )
    return run, lambda: [compiled]


def measure(model: str, variant: str, shape: dict, args: argparse.Namespace, row: dict) -> None:
    """Fill ``row`` with one variant's measurements (written to disk by the caller)."""
    import torch

    watch = Watch(
        int(args.rss_limit_gib * GIB), lambda why: row.update(error=why) or args.save(row)
    )
    compiles = Compilations()
    progress(row, "started")
    net, batch, flops, units = build(model, shape)
    if model != "resnet50":
        net = Logits.wrap(net)
    net = net.to(torch.bfloat16).train()
    if model == "resnet50":
        batch = (batch[0].to(torch.bfloat16), batch[1])
    row.update(
        flops_per_step=flops,
        units_per_step=units,
        unit="images" if model == "resnet50" else "tokens",
    )
    row["params"] = sum(p.numel() for p in net.parameters())
    if model != "resnet50":  # (whether it passes is_causal or a mask to attention: its version)
        import transformers

        row["transformers"] = transformers.__version__
    row["device_after_setup"] = device_memory()
    progress(row, "model built")
    watch.rebase()
    if variant in ("jit", "compile"):
        if args.attention != "auto":
            attention_choice(args.attention, row)
        run, executables = run_torchlax(variant, model, net, batch, row)
    else:
        row["residuals"] = args.residuals
        run, executables = run_jax_variant(variant, model, net, batch, shape, row)
        if run is None:  # --residuals: traced, not run
            return
    if variant not in ("jax", "torchax"):  # (in --smoke's one process, the paths seen so far)
        row["attention"] = attention_paths()
    row["first_call_compiles"] = compiles.count
    row["device_after_first"] = device_memory()
    row["host_rss_growth_first_gib"] = (watch.peak - watch.base) / GIB
    args.save(row)
    for _ in range(args.warmup):
        run()
    progress(row, "warm-up calls")
    before = compiles.count
    watch.rebase()
    times = []
    t_end = time.perf_counter() + args.seconds
    while len(times) < args.min_steps or (
        time.perf_counter() < t_end and len(times) < args.max_steps
    ):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    row["steady_compiles"] = compiles.count - before
    row["host_rss_growth_steady_gib"] = (watch.peak - watch.base) / GIB
    row["host_anon_rss_gib"] = watch.rss() / GIB
    median = statistics.median(times)
    row.update(median_s=median, min_s=min(times), steps=len(times))
    row["per_s"] = units / median
    row["tflops"] = flops / median / 1e12
    row["mfu"] = row["tflops"] / args.peak_tflops
    row["device_end"] = device_memory()
    stats = [executable_peak(c) for c in executables()]
    row.update(max(stats, key=lambda s: s.get("exe_peak_bytes", 0), default={}))
    if args.profile:
        profile(f"{model}-{variant}", run, executables(), Path(args.profile), row)


# -- driver --------------------------------------------------------------------------------------


class _Missing:
    """A stand-in for an ATen op or overload that the installed torch lacks: any attribute of
    it is another stand-in, and it is never called (it only keys torchax's tables)."""

    def __init__(self, name: str):
        self.name = name

    def __getattr__(self, key: str) -> Any:
        if key.startswith("__"):
            raise AttributeError(key)
        return _Missing(f"{self.name}.{key}")

    def __repr__(self) -> str:
        return f"<missing {self.name}>"


def import_torchax() -> str:
    """Import torchax; say how. torchax 0.0.13's tables name ATen ops and overloads that torch
    2.14 no longer has (``aten.prod.dim_Dimname``, ``aten.cholesky``), and its import fails on
    the first: then it is imported again with such names looked up as stand-ins (``_Missing``),
    and that is said in the row."""
    import torch

    try:
        import torchax
    except AttributeError as exc:
        from torch._ops import OpOverloadPacket, _OpNamespace

        for name in [m for m in sys.modules if m == "torchax" or m.startswith("torchax.")]:
            del sys.modules[name]
        originals = {cls: cls.__getattr__ for cls in (OpOverloadPacket, _OpNamespace)}

        def lenient(original: Callable) -> Callable:
            def lookup(self: Any, key: str) -> Any:
                try:
                    return original(self, key)
                except AttributeError:
                    if key.startswith("__"):
                        raise
                    return _Missing(key)

            return lookup

        for cls, original in originals.items():
            cls.__getattr__ = lenient(original)  # pyright: ignore[reportAttributeAccessIssue]
        try:
            import torchax

            torchax.default_env()  # imports its op tables (aten.cholesky is another lost name)
        finally:
            for cls, original in originals.items():
                cls.__getattr__ = original  # pyright: ignore[reportAttributeAccessIssue]
        return (
            f"imported with stand-ins for the ATen names torch {torch.__version__} lacks "
            f"(first: {exc})"
        )
    return "imported as it is"


def one(model: str, variant: str, args: argparse.Namespace) -> dict:
    """Measure one row in this process; return it (also saved through ``args.save``)."""
    shape = dict((SMOKE if args.smoke and not args.shape else FULL)[model])
    shape.update((k, int(v)) for k, v in (kv.split("=") for kv in args.shape.split(",") if kv))
    if model == "llama" and args.llama_batch:
        shape["batch"] = args.llama_batch
    if model == "gpt2" and args.gpt2_dropout:
        shape["dropout"] = args.gpt2_dropout
    row: dict[str, Any] = {"model": model, "variant": variant, "shape": shape}
    if args.residuals and variant in ("jit", "compile"):
        return {**row, "skipped": "--residuals traces the JAX variants only"}
    if variant == "jax" and model != "gpt2":
        return {**row, "skipped": "written by hand for GPT-2 only"}
    if variant == "torchax":
        try:
            row["torchax"] = import_torchax()
        except Exception as exc:  # not installed, or torchlax holds the 'jax' device name
            return {**row, "skipped": f"torchax does not import: {exc}"}
    try:
        measure(model, variant, shape, args, row)
    except Exception as exc:  # a failing variant is a result, not the end of the run
        row["error"] = f"{type(exc).__name__}: {exc}"[:1500]
    return row


def child(args: argparse.Namespace) -> None:
    path = Path(args.row_out)

    def save(row: dict) -> None:
        path.write_text(json.dumps(row, default=str))

    args.save = save
    _SAVE.append(save)
    save(one(args.models, args.variants, args))


def out_of_memory(row: dict) -> bool:
    error = row.get("error", "")
    return "RESOURCE_EXHAUSTED" in error or "out of memory" in error.lower()


def isolated(model: str, variant: str, args: argparse.Namespace, deadline: float) -> dict:
    """One row in a fresh process; the Llama batch halves while it does not fit."""
    batch = args.llama_batch or FULL["llama"]["batch"]
    while True:
        row_out = RESULTS / f".tpu_row_{os.getpid()}.json"
        row_out.unlink(missing_ok=True)
        cmd = [
            sys.executable,
            __file__,
            "--child",
            "--models",
            model,
            "--variants",
            variant,
            "--row-out",
            str(row_out),
            "--llama-batch",
            str(batch),
        ]
        cmd += [
            f"--{k.replace('_', '-')}={getattr(args, k)}"
            for k in (
                "peak_tflops",
                "seconds",
                "min_steps",
                "max_steps",
                "warmup",
                "rss_limit_gib",
                "shape",
                "gpt2_dropout",
                "attention",
                "profile",
            )
        ]
        left = deadline - time.time()
        if left < 30:
            return {"model": model, "variant": variant, "skipped": "no time left in --budget-s"}
        try:
            rc = subprocess.run(cmd, timeout=min(left, args.variant_s)).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        row = (
            json.loads(row_out.read_text())
            if row_out.exists()
            else {"model": model, "variant": variant}
        )
        row_out.unlink(missing_ok=True)
        if rc != 0 and "error" not in row:
            row["error"] = f"the process ended with {rc} before finishing"
        if model == "llama" and out_of_memory(row) and batch > 1:
            batch //= 2
            print(f"[tpu] llama {variant}: out of memory, batch {batch}", flush=True)
            continue
        return row


def describe(row: dict) -> str:
    if "residual_bytes" in row:
        largest = ", ".join(f"{k} {v / GIB:.3f}" for k, v in row["largest"].items())
        by_dtype = ", ".join(
            f"{k} {v / GIB:.3f}" for k, v in row.get("residual_bytes_by_dtype", {}).items()
        )
        return (
            f"{row['model']:<9} {row['variant']:<15} backward keeps "
            f"{row['residual_bytes'] / GIB:.3f} GiB ({by_dtype}; largest, GiB: {largest})"
        )
    if "median_s" not in row:
        return f"{row['model']:<9} {row['variant']:<15} {row.get('skipped') or row.get('error')}"
    exe = row.get("exe_peak_bytes")
    peak = row.get("device_end", {}).get("peak_bytes_in_use")
    return (
        f"{row['model']:<9} {row['variant']:<15} step {row['median_s'] * 1e3:8.1f} ms  "
        f"{row['per_s']:10.0f} {row['unit']}/s  MFU {row['mfu'] * 100:5.1f}%  "
        f"first {row['first_call_s']:6.1f} s  steady compiles {row['steady_compiles']}  "
        f"exe peak {exe / GIB if exe else float('nan'):.2f} GiB "
        f"(temp {row.get('exe_temp_bytes', float('nan')) / GIB:.2f})  "
        f"device peak {peak / GIB if peak else float('nan'):.2f} GiB  "
        f"host +{row['host_rss_growth_steady_gib']:.2f} GiB"
        + (f"  attention: {'; '.join(row['attention'])}" if row.get("attention") else "")
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--smoke", action="store_true", help="CI-sized shapes on the CPU, one process")
    p.add_argument("--out", default=str(RESULTS / "tpu.json"))
    p.add_argument("--budget-s", type=float, default=3600)
    p.add_argument(
        "--variant-s",
        type=float,
        default=1800,
        help="the most seconds one (model, variant) process may take (not in --smoke)",
    )
    p.add_argument("--peak-tflops", type=float, default=197.0)
    p.add_argument("--seconds", type=float, default=4.0, help="steady stepping per variant")
    p.add_argument("--min-steps", type=int, default=5)
    p.add_argument("--max-steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rss-limit-gib", type=float, default=8.0)
    p.add_argument("--llama-batch", type=int, default=0)
    p.add_argument(
        "--gpt2-dropout",
        type=float,
        default=0.0,
        help="GPT-2's dropout probabilities (default 0: the Pallas kernel has no dropout)",
    )
    p.add_argument(
        "--shape",
        default="",
        help="override the models' shape, e.g. batch=1,seq=128 (CPU-sized memory measurements)",
    )
    p.add_argument(
        "--residuals",
        action="store_true",
        help="JAX variants: trace only, and report what the backward keeps (on any device)",
    )
    p.add_argument(
        "--attention",
        choices=("auto", "always", "never"),
        default="auto",
        help="torchlax variants: TORCHLAX_ATTENTION_KERNEL for the rows (an A/B of the kernel)",
    )
    p.add_argument("--profile", default="", help="a folder: profile three steady steps there")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--row-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    # The development environment installs the example plugin, which overrides softmax: the
    # benchmark measures torchlax's own lowerings (child processes inherit this).
    os.environ.setdefault("TORCHLAX_BLOCK_PLUGINS", "example")
    if args.smoke:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        args.seconds, args.min_steps, args.max_steps, args.warmup = 0.0, 2, 2, 1
    if args.child:
        child(args)
        return 0
    deadline = time.time() + args.budget_s
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "machine": platform.node(),
        "smoke": args.smoke,
        "rows": [],
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "peak_tflops": args.peak_tflops,
    }
    args.save = lambda row: None
    if "gpt2" in args.models.split(","):
        print(
            f"[tpu] GPT-2 dropout {args.gpt2_dropout}: "
            + (
                "every variant computes the same function, and torchlax's attention on a TPU "
                "can take a Pallas attention kernel (it draws no dropout mask; GPT-2's "
                "default attn_pdrop=0.1 would take the plain lowering: --gpt2-dropout 0.1)"
                if not args.gpt2_dropout
                else "attention takes the plain lowering (the Pallas kernel has no dropout); "
                "the variants draw different dropout masks"
            ),
            flush=True,
        )
    failed = False
    for model in args.models.split(","):
        for variant in args.variants.split(","):
            if args.smoke or args.residuals:
                row = one(model, variant, args)
            else:
                row = isolated(model, variant, args, deadline)
            result["rows"].append(row)
            out.write_text(json.dumps(result, indent=1, default=str))
            print("[tpu]", describe(row), flush=True)
            failed |= "error" in row
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
