"""Per-step time of a sharded transformer on 1, 2, 4 and 8 simulated CPU devices.

A scaling sanity check, not a speed claim: the simulated devices share this machine's cores,
so more devices mean smaller shards plus collectives on the same CPUs. Each device count runs
in its own process (``XLA_FLAGS=--xla_force_host_platform_device_count=N``). The step is one
jitted SGD training step of the model (``torchlax_interop.functional`` + ``jax.jit``), laid
out by ``--layout``: ``megatron`` (tensor parallel over all devices) or ``fsdp`` (fully
sharded weights, data-parallel batch). Times are medians of steady-state steps, after the
first (compiling) step, whose time is reported apart. Checks that every count gets the same
loss.

    uv run python benchmarks/sharding.py [--layout fsdp] [--steps 10] [--devices 1 2 4 8]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = r"""
import json, math, statistics, sys, time
sys.path.insert(0, {models!r})
import jax, torch, torchlax_core, torchlax_interop
from jax.sharding import NamedSharding, PartitionSpec as P
from torchlax_interop import distributed as dist
from _model import TinyTransformer

layout, steps, batch, seq = {layout!r}, {steps}, {batch}, {seq}
n = len(jax.devices())
torch.manual_seed(0)
model = TinyTransformer(vocab=512, dim=128, heads=8, hidden=512, layers=2)
if layout == "megatron":
    mesh = dist.make_mesh((1, n), ("data", "model"))
    rules = dist.megatron_rules("model")
else:
    mesh = dist.make_mesh((n, 1), ("data", "model"))
    rules = dist.fsdp_rules("data")
tokens = torch.randint(0, 512, (batch, seq))
targets = torch.randint(0, 512, (batch, seq))
with torchlax_core.enable(), dist.mesh_placement(mesh):
    model = model.to("jax")
    dist.shard(model, mesh, rules)
    tk = dist.shard(tokens.to("jax"), mesh, P("data")).jax()
    tg = dist.shard(targets.to("jax"), mesh, P("data")).jax()
params, _, apply = torchlax_interop.functional(model)

def loss_of(params, tokens, targets):
    logits = apply(params, tokens)
    with torchlax_core.enable():
        loss = torch.nn.functional.cross_entropy(
            torchlax_core.wrap(logits).reshape(-1, 512), torchlax_core.wrap(targets).reshape(-1))
    return loss.jax()

shardings = {{k: a.sharding for k, a in params.items()}}

@jax.jit
def step(params, tokens, targets):
    loss, grads = jax.value_and_grad(loss_of)(params, tokens, targets)
    new = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
    return loss, jax.lax.with_sharding_constraint(new, shardings)

start = time.perf_counter()
loss, params = step(params, tk, tg)
loss.block_until_ready()
first = time.perf_counter() - start
first_loss = float(loss)
times = []
for _ in range(steps):
    start = time.perf_counter()
    loss, params = step(params, tk, tg)
    loss.block_until_ready()
    times.append(time.perf_counter() - start)
q = params["layers.0.attn.q_proj.weight"]
print(json.dumps({{"devices": n, "first_s": first, "step_ms": 1e3 * statistics.median(times),
                  "loss": first_loss, "q_proj_shard": list(q.addressable_shards[0].data.shape)}}))
"""


def run(devices: int, layout: str, steps: int, batch: int, seq: int) -> dict:
    env = dict(
        os.environ,
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
        JAX_PLATFORMS="cpu",
    )
    code = CHILD.format(
        models=str(HERE.parent / "tests" / "distributed"),
        layout=layout,
        steps=steps,
        batch=batch,
        seq=seq,
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{devices} devices failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layout", choices=("megatron", "fsdp"), default="megatron")
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args()
    rows = []
    print(
        f"layout {args.layout}, batch {args.batch} x {args.seq} tokens, {os.cpu_count()} CPU cores"
    )
    print(f"{'devices':>7} {'step ms':>9} {'first s':>8} {'q_proj shard':>13} {'loss':>9}")
    for n in args.devices:
        row = run(n, args.layout, args.steps, args.batch, args.seq)
        rows.append(row)
        print(
            f"{n:>7} {row['step_ms']:>9.2f} {row['first_s']:>8.2f} "
            f"{str(tuple(row['q_proj_shard'])):>13} {row['loss']:>9.5f}"
        )
    losses = [r["loss"] for r in rows]
    spread = max(losses) - min(losses)
    print(f"loss spread across device counts: {spread:.2e} (the same program, partitioned)")
    if spread > 1e-4:
        raise SystemExit("sharded steps disagree across device counts")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
