"""Attention's forward and backward under ``torchlax.jit``: the Pallas kernel against the plain
lowering, with and without a mask (the numbers behind the kernel's choice on a TPU).

Each case is one ``torchlax.jit`` step: ``F.scaled_dot_product_attention`` on bfloat16 q, k, v
of GPT-2 small's shape, ``out.sum().backward()``; its median time over ``--steps`` calls after
two warm-up calls. Cases: ``causal`` (``is_causal=True``), ``mask`` (a boolean causal mask of
shape (batch, 1, length, length), what transformers passes when it does not skip its mask).
Runs anywhere; only a TPU takes the kernel (elsewhere both rows are the plain lowering).
``--blocks 128,512`` runs the kernel's cases once per largest block (``TORCHLAX_ATTENTION_BLOCK``);
the mask case's kernel is the causal check's (``_attention_kernels.Plan.causal_check``).

``--jax-kernels`` instead times JAX's own TPU kernels called from JAX, causal, forward and
backward (``jax.value_and_grad``, one jitted program per case), at the shape given: the flash
kernel torchlax calls, the splash kernel (separate and fused backward), and XLA's attention
(``jax.nn.dot_product_attention``), each compared with a float32 reference: whether another
kernel would pay before torchlax's lowering takes it. On a CPU the kernels run in Pallas's
interpret mode (a check of the script, not a timing).

    python benchmarks/tpu_attention.py --out results/tpu_attention.json
    python benchmarks/tpu_attention.py --jax-kernels --shape 4,16,2048,64 --out results/k.json
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


def _timed(fn, args: tuple, steps: int) -> tuple[float, float, object]:
    """``(first call s, median ms, result)`` of a jitted ``fn(*args)``, waited for each call."""
    import jax

    t0 = time.perf_counter()
    result = jax.block_until_ready(fn(*args))
    first = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return first, statistics.median(times) * 1e3, result


def _kernel_cases(length: int, dim: int, heads: int, block: int, interpret: bool) -> dict:
    """Causal attention ``f(q, k, v)`` over (batch, heads, length, dim), one per kernel."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu import flash_attention as flash
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    scale = dim**-0.5
    b = min(block, length)

    def flash_case(dq_block: int):
        blocks = flash.BlockSizes(
            block_q=b, block_k_major=b, block_k=b, block_b=1,
            block_q_major_dkv=b, block_k_major_dkv=b, block_k_dkv=b, block_q_dkv=b,
            block_k_major_dq=dq_block, block_k_dq=dq_block, block_q_dq=b,
        )  # fmt: skip
        return lambda q, k, v: flash.flash_attention(
            q, k, v, causal=True, sm_scale=scale, block_sizes=blocks
        )

    mask = splash.MultiHeadMask([splash.CausalMask((length, length))] * heads)

    def splash_case(fused: bool):
        blocks = splash.BlockSizes(
            block_q=b, block_kv=b, block_kv_compute=b,
            block_q_dkv=b, block_kv_dkv=b, block_kv_dkv_compute=b,
            block_q_dq=None if fused else b, block_kv_dq=None if fused else b,
            use_fused_bwd_kernel=fused,
        )  # fmt: skip
        kernel = splash.make_splash_mha(
            mask, block_sizes=blocks, head_shards=1, q_seq_shards=1, interpret=interpret
        )
        # The splash kernel does not scale: q is scaled first (exact for a power-of-two scale).
        return lambda q, k, v: jax.vmap(kernel)((q * scale).astype(q.dtype), k, v)

    def xla_case(q, k, v):
        t = lambda x: x.transpose(0, 2, 1, 3)  # noqa: E731  (its layout is (batch, length, heads, dim))
        out = jax.nn.dot_product_attention(t(q), t(k), t(v), is_causal=True, implementation="xla")
        return t(out)

    def reference(q, k, v):
        q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k, precision="highest") * scale
        s = jnp.where(jnp.tril(jnp.ones((length, length), bool)), s, -jnp.inf)
        return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, -1), v, precision="highest")

    return {
        "flash": flash_case(b),
        # its dq kernel broadcasts a row statistic to the kv block: a smaller block, less of it
        "flash_dq_128": flash_case(128),
        "splash": splash_case(False),
        "splash_fused_bwd": splash_case(True),
        "xla": xla_case,
        "reference_f32": reference,
    }


def jax_kernels(shape: tuple, steps: int, block: int, out: Path) -> None:
    """Each kernel's forward + backward time and its largest difference from float32."""
    import jax
    import jax.numpy as jnp

    batch, heads, length, dim = shape
    interpret = jax.devices()[0].platform != "tpu"
    if interpret:  # the flash kernel reads the mode where it is traced, its backward too
        from jax.experimental.pallas import tpu as pltpu

        pltpu.set_tpu_interpret_mode()
    keys = jax.random.split(jax.random.key(0), 4)
    q, k, v, ct = (jax.random.normal(key, shape, jnp.bfloat16) for key in keys)
    rows = []
    expected = None
    for name, fn in _kernel_cases(length, dim, heads, block, interpret).items():

        def loss(q, k, v, fn=fn):
            return (fn(q, k, v).astype(jnp.float32) * ct.astype(jnp.float32)).sum()

        step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
        row: dict = {"kernel": name, "shape": shape, "block": block, "interpret": interpret}
        try:
            row["first_s"], row["median_ms"], (value, grads) = _timed(step, (q, k, v), steps)
        except Exception as exc:  # a kernel that does not take this shape: say so, go on
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        else:
            got = [value, *grads]
            if name == "reference_f32":
                expected = got
            row["values"] = [float(jnp.abs(x).max()) for x in got]
            row["got"] = got
        rows.append(row)
        print("[attention]", {k: v for k, v in row.items() if k != "got"}, flush=True)
    for row in rows:  # differences once the reference (the last case) is known
        got = row.pop("got", None)
        if got is not None and expected is not None:
            row["max_abs_diff"] = [
                float(jnp.abs(a.astype(jnp.float32) - b).max()) for a, b in zip(got, expected)
            ]
    out.write_text(json.dumps({"shape": shape, "rows": rows}, indent=1))
    for row in rows:
        print("[attention]", row, flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="results/tpu_attention.json")
    p.add_argument("--shape", default="8,12,1024,64", help="batch,heads,length,head_dim")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--blocks", default="128", help="the kernel's largest blocks, comma-separated")
    p.add_argument("--jax-kernels", action="store_true", help="JAX's kernels from JAX (above)")
    args = p.parse_args()
    shape = tuple(int(n) for n in args.shape.split(","))
    rows = []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.jax_kernels:
        jax_kernels(shape, args.steps, max(int(n) for n in args.blocks.split(",")), out)
        return
    blocks = [int(n) for n in args.blocks.split(",")]
    for mask in (False, True):
        for kernel, block in [(False, 128)] + [(True, n) for n in blocks]:
            rows.append(case(mask, kernel, shape, args.steps, block))
            print("[attention]", rows[-1], flush=True)
            out.write_text(json.dumps({"shape": shape, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
