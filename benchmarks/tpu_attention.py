"""Attention's forward and backward under ``torchlax.jit``: the Pallas kernel against the plain
lowering, with and without a mask (the numbers behind the kernel's choice on a TPU).

Each case is one ``torchlax.jit`` step: ``F.scaled_dot_product_attention`` on bfloat16 q, k, v
of GPT-2 small's shape, ``out.sum().backward()``; its median time over ``--steps`` calls after
two warm-up calls. Cases: ``causal`` (``is_causal=True``), ``mask`` (a boolean causal mask of
shape (batch, 1, length, length), what transformers passes when it does not skip its mask).
Runs anywhere; only a TPU takes the kernel (elsewhere both rows are the plain lowering).
``--blocks 128,512`` runs the kernel's cases once per largest block (``TORCHLAX_ATTENTION_BLOCK``);
the mask case's kernel is the causal check's (``_attention_kernels.Plan.causal_check``).

    python benchmarks/tpu_attention.py --out results/tpu_attention.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def case(mask: bool, kernel: bool, shape: tuple, steps: int, block: int) -> dict:
    import torch
    import torch.nn.functional as F
    import torchlax
    from torchlax_ops import _attention_kernels

    chosen, largest = _attention_kernels.choice, _attention_kernels.block
    _attention_kernels._logged.clear()
    _attention_kernels.choice = "always" if kernel else "never"
    _attention_kernels.block = block
    try:
        torch.manual_seed(0)
        batch, heads, length, dim = shape
        with torchlax.enable():
            q, k, v = (
                torch.randn(shape, dtype=torch.bfloat16).to("jax").requires_grad_()
                for _ in range(3)
            )
            causal = torch.ones(length, length, dtype=torch.bool).tril().to("jax")
        bias = causal.expand(batch, 1, length, length) if mask else None

        def step():
            for t in (q, k, v):
                t.grad = None
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=not mask)
            out.sum().backward()
            return q.grad, k.grad, v.grad

        fast = torchlax.jit(step)
        t0 = time.perf_counter()
        for g in fast():
            g.jax().block_until_ready()
        first = time.perf_counter() - t0
        for _ in range(2):
            fast()
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            for g in fast():
                g.jax().block_until_ready()
            times.append(time.perf_counter() - t0)
    finally:
        _attention_kernels.choice, _attention_kernels.block = chosen, largest
    paths = _attention_kernels.seen()
    return {
        "mask": "boolean (batch, 1, L, L)" if mask else "is_causal",
        "kernel_allowed": kernel,
        "block": block if kernel else None,
        "median_ms": statistics.median(times) * 1e3,
        "first_s": first,
        "paths_seen": paths,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="results/tpu_attention.json")
    p.add_argument("--shape", default="8,12,1024,64", help="batch,heads,length,head_dim")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--blocks", default="128", help="the kernel's largest blocks, comma-separated")
    args = p.parse_args()
    shape = tuple(int(n) for n in args.shape.split(","))
    rows = []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    blocks = [int(n) for n in args.blocks.split(",")]
    for mask in (False, True):
        for kernel, block in [(False, 128)] + [(True, n) for n in blocks]:
            rows.append(case(mask, kernel, shape, args.steps, block))
            print("[attention]", rows[-1], flush=True)
            out.write_text(json.dumps({"shape": shape, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
