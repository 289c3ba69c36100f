"""Data-parallel training of a PyTorch model over several processes, on JAX's runtime.

Each process holds its half of the batch; one global mesh spans every device of every process,
and one jitted training step runs on all of them: the gradient average across processes is an
all-reduce that XLA inserts because the loss is a mean over the global batch.

Run it as is and it starts the processes itself, on the CPU over loopback::

    uv run python examples/multiprocess_data_parallel.py

or start each process yourself (what a cluster launcher does)::

    python examples/multiprocess_data_parallel.py --num-processes 2 --process-id 0 --port 29411 &
    python examples/multiprocess_data_parallel.py --num-processes 2 --process-id 1 --port 29411

On a GPU/TPU cluster run the same script once per host with the coordinator's address (see
docs/distributed.md); on Cloud TPU ``jax.distributed.initialize()`` needs no arguments.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

GLOBAL_BATCH = 8
FEATURES, HIDDEN, CLASSES = 16, 32, 4
LEARNING_RATE = 0.5


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)  # every process builds the same initial weights
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN), torch.nn.GELU(), torch.nn.Linear(HIDDEN, CLASSES)
    )


def make_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch (every process can make it; each uses only its own rows)."""
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(GLOBAL_BATCH, FEATURES, generator=generator)
    labels = torch.randint(0, CLASSES, (GLOBAL_BATCH,), generator=generator)
    return inputs, labels


def reference_step() -> dict:
    """One SGD step of the whole batch in a single process, with plain PyTorch on the CPU."""
    model = build_model()
    inputs, labels = make_batch()
    loss = torch.nn.functional.cross_entropy(model(inputs), labels)
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= LEARNING_RATE * p.grad
    return {"loss": loss.item(), "params": {n: p.tolist() for n, p in model.named_parameters()}}


def train_step(process_id: int, num_processes: int, coordinator: str) -> dict:
    import jax

    jax.config.update("jax_platforms", "cpu")
    jax.distributed.initialize(
        coordinator_address=coordinator, num_processes=num_processes, process_id=process_id
    )

    import torchlax_core
    import torchlax_interop
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P
    from torchlax_interop.distributed import make_mesh

    mesh = make_mesh((jax.device_count(),), ("data",))  # every device of every process
    replicated = NamedSharding(mesh, P())
    by_rows = NamedSharding(mesh, P("data"))

    model = build_model()
    _, _, apply = torchlax_interop.functional(model)
    # Weights: the same on every process, replicated over the global mesh.
    params = {
        n: jax.make_array_from_process_local_data(replicated, p.detach().numpy())
        for n, p in model.named_parameters()
    }

    # Data: this process's rows only; together they form the global batch.
    inputs, labels = make_batch()
    rows = GLOBAL_BATCH // num_processes
    mine = slice(process_id * rows, (process_id + 1) * rows)
    global_inputs = jax.make_array_from_process_local_data(by_rows, inputs[mine].numpy())
    global_labels = jax.make_array_from_process_local_data(by_rows, labels[mine].numpy())

    def loss_of(params, inputs, labels):
        logits = apply(params, inputs)
        with torchlax_core.enable():
            loss = torch.nn.functional.cross_entropy(
                torchlax_core.wrap(logits), torchlax_core.wrap(labels)
            )
        return loss.jax()

    @jax.jit
    def step(params, inputs, labels):
        loss, grads = jax.value_and_grad(loss_of)(params, inputs, labels)
        return loss, jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads)

    loss, params = step(params, global_inputs, global_labels)
    # Replicated results: every process holds the whole value on its own devices.
    local = {n: np.asarray(a.addressable_data(0)) for n, a in params.items()}
    result = {
        "loss": float(np.asarray(loss.addressable_data(0))),
        "params": {n: v.tolist() for n, v in local.items()},
        "devices": jax.device_count(),
        "local_devices": jax.local_device_count(),
    }
    jax.distributed.shutdown()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-processes", type=int, default=2)
    parser.add_argument(
        "--process-id",
        type=int,
        default=None,
        help="this process's rank; without it, start every process locally",
    )
    parser.add_argument("--coordinator", default=None, help="host:port of process 0")
    parser.add_argument("--port", type=int, default=29411)
    parser.add_argument("--output", default=None, help="write the result here as JSON")
    args = parser.parse_args()
    if args.process_id is None:
        launch_locally(args.num_processes)
        return
    coordinator = args.coordinator or f"127.0.0.1:{args.port}"
    result = train_step(args.process_id, args.num_processes, coordinator)
    if args.output:
        with open(args.output, "w") as f:
            json.dump(result, f)
    reference = reference_step()
    worst = max(
        float(np.abs(np.asarray(result["params"][n]) - np.asarray(v)).max())
        for n, v in reference["params"].items()
    )
    print(
        f"process {args.process_id}/{args.num_processes}: loss {result['loss']:.6f} "
        f"(one process, full batch: {reference['loss']:.6f}); largest weight difference "
        f"{worst:.2e} over {result['devices']} devices"
    )


def launch_locally(num_processes: int) -> None:
    """Start ``num_processes`` copies of this script on the CPU, over a loopback coordinator."""
    import socket
    import subprocess
    import sys

    with socket.socket() as sock:  # a free local port for the coordinator
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--num-processes",
                str(num_processes),
                "--process-id",
                str(rank),
                "--port",
                str(port),
            ]
        )
        for rank in range(num_processes)
    ]
    codes = [proc.wait(timeout=600) for proc in procs]
    if any(codes):
        raise SystemExit(f"a process failed (exit codes {codes})")


if __name__ == "__main__":
    main()
