"""Shard a PyTorch transformer over a JAX device mesh: tensor parallel, FSDP, meta init.

    uv run python examples/sharding.py

Runs on any JAX backend. JAX's CPU platform shows 8 simulated devices here
(``jax_num_cpu_devices``, set before JAX starts), so that on a laptop each printed shard shape
differs from the full shape; on a machine with a single accelerator the script restarts itself
on those CPU devices and says so.

torchlax adds no distributed engine: weights and batches are ``jax.Array``s laid out with
``NamedSharding``, and JAX's compiler (GSPMD) partitions each program and inserts the
collectives. Three ways to get there:

1. ``shard(model, mesh, megatron_rules("model"))``: Megatron tensor parallelism plus a
   data-parallel batch, run eagerly and as one jitted program;
2. ``fsdp_rules("data")``: fully sharded weights, trained with a PyTorch optimizer;
3. ``init_on_meta`` + ``materialize``: no device ever holds a whole sharded weight.
"""

from __future__ import annotations

import math
import os
import sys

import jax

SIMULATED_DEVICES = 8
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    # Read when JAX starts its backends, which importing torchlax does: set first. It changes
    # only the CPU platform, so a machine with GPUs or TPUs still meshes those.
    jax.config.update("jax_num_cpu_devices", SIMULATED_DEVICES)

import torch  # noqa: E402
import torchlax  # noqa: E402
import torchlax.distributed as dist  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from torch import nn  # noqa: E402


class Block(nn.Module):
    """Pre-norm attention + MLP, with the projection names the Megatron rules know."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(dim, dim) for _ in range(3))
        self.o_proj = nn.Linear(dim, dim)
        self.up_proj, self.down_proj = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        h = self.ln1(x)
        q, k, v = (
            p(h).view(b, s, self.heads, -1).transpose(1, 2)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        scores = (q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)).softmax(-1)
        x = x + self.o_proj((scores @ v).transpose(1, 2).reshape(b, s, d))
        return x + self.down_proj(nn.functional.gelu(self.up_proj(self.ln2(x))))


class LM(nn.Module):
    def __init__(self, vocab: int = 256, dim: int = 64, heads: int = 4, layers: int = 2):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.layers = nn.Sequential(*(Block(dim, heads) for _ in range(layers)))
        self.norm = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        return self.lm_head(self.norm(self.layers(self.embed_tokens(tokens))))


def cross_entropy(logits, targets):
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def describe(model: nn.Module, names: list[str]) -> None:
    params = dict(model.named_parameters())
    for name in names:
        p = params[name]
        print(
            f"    {name:28s} {tuple(p.shape)!s:10s} {str(p.jax().sharding.spec):22s} "
            f"shard {dist.shard_shapes(p)[0]}"
        )


def restart_on_simulated_cpu_devices() -> None:
    """With one accelerator every shard is the whole tensor: rerun this script on the CPU's
    simulated devices (torchlax tensors go to JAX's default platform, which is chosen when JAX
    starts, so the only way to change it is a fresh process)."""
    print(
        f"JAX sees one {jax.devices()[0].platform} device; restarting on "
        f"{SIMULATED_DEVICES} simulated CPU devices (JAX_PLATFORMS=cpu).",
        flush=True,
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *sys.argv[1:]], env)


def main() -> None:
    if len(jax.devices()) <= 1 and os.environ.get("JAX_PLATFORMS") != "cpu":
        restart_on_simulated_cpu_devices()
    n = len(jax.devices())
    data = 2 if n % 2 == 0 else 1
    mesh = dist.make_mesh((data, n // data), ("data", "model"))
    print(f"mesh: {dict(mesh.shape)} over {n} {jax.devices()[0].platform} devices")
    torch.manual_seed(0)
    tokens = torch.randint(0, 256, (8, 16))
    targets = torch.randint(0, 256, (8, 16))
    reference = LM()
    ref_loss = cross_entropy(reference(tokens), targets).item()

    with torchlax.enable(), dist.mesh_placement(mesh):  # new constants land on the mesh
        print("1. Megatron tensor parallel + data parallel batch")
        model = LM()
        model.load_state_dict(reference.state_dict())
        model = model.to("jax")
        dist.shard(model, mesh, dist.megatron_rules("model"))
        describe(
            model,
            [
                "embed_tokens.weight",
                "layers.0.q_proj.weight",
                "layers.0.o_proj.weight",
                "layers.0.ln1.weight",
            ],
        )
        tk = dist.shard(tokens.to("jax"), mesh, P("data"))
        tg = dist.shard(targets.to("jax"), mesh, P("data"))
        eager = cross_entropy(model(tk), tg)
        jitted = torchlax.jit(model)
        compiled = cross_entropy(jitted(tk), tg)
        # A batch moved with .to("jax") alone (on the default device) works with the sharded
        # weights too: JAX moves it onto the mesh.
        plain = cross_entropy(jitted(tokens.to("jax")), targets.to("jax"))
        print(
            f"    loss eager {eager.item():.6f}, jit {compiled.item():.6f}, unsharded batch "
            f"{plain.item():.6f}, unsharded CPU {ref_loss:.6f}"
        )

        print("2. FSDP: train with a PyTorch optimizer")
        dist.shard(model, mesh, dist.fsdp_rules("data"))
        describe(model, ["layers.0.q_proj.weight", "layers.0.up_proj.weight"])
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        for step in range(3):
            loss = cross_entropy(jitted(tk), tg)
            loss.backward()
            opt.step()
            opt.zero_grad()
            print(f"    step {step}: loss {loss.item():.4f}")

        print("3. Build on meta, create each weight sharded")
        big = dist.init_on_meta(lambda: LM(vocab=4096, dim=256))
        dist.materialize(big, mesh, dist.megatron_rules("model", data_axis="data"))
        describe(big, ["embed_tokens.weight", "layers.0.up_proj.weight", "norm.weight"])
        # A model this size runs as one program (eagerly, each op would compile on its own).
        print(f"    logits {tuple(torchlax.jit(big)(tk).shape)}")


if __name__ == "__main__":
    main()
