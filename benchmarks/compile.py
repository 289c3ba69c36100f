"""torch.compile(backend="torchlax") against the alternatives, on one MLP.

Steady-state time per forward (no grad) and per training step (forward, backward, SGD
update), plus the first call (compilation included), for:

- ``torchlax``: ``torch.compile(model, backend="torchlax")`` on CPU tensors;
- ``interop.jit``: ``torchlax_interop.jit(model)`` (if installed);
- ``jax``: the same MLP written by hand in JAX, ``jax.jit``-ed (the training step is one
  jitted ``value_and_grad`` + update);
- ``inductor``: ``torch.compile(model)``;
- ``eager``: plain PyTorch.

Times are printed in microseconds and as ratios to hand-written JAX, followed by the graph
splits of ``backend="torchlax"`` (``torchlax_dynamo.counters``: ATen graphs, XLA programs and
nodes run eagerly between them; one program per graph and no eager node means no split).
Run::

    uv run python benchmarks/compile.py [--batch 256] [--width 1024] [--iters 200]
"""

from __future__ import annotations

import argparse
import copy
import time

import jax
import jax.numpy as jnp
import torch

# The first calls are compilation times: no persistent compilation cache (torchlax turns
# JAX's on by default when imported, unless it is off as here).
jax.config.update("jax_enable_compilation_cache", False)


def make_mlp(width: int, depth: int) -> torch.nn.Sequential:
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(width, 10))
    return torch.nn.Sequential(*layers)


def timed(fn, iters: int, sync=lambda out: None) -> tuple[float, float]:
    """(first call, steady-state mean) in microseconds."""
    start = time.perf_counter()
    sync(fn())
    first = time.perf_counter() - start
    for _ in range(3):
        sync(fn())
    best = float("inf")
    for _ in range(3):  # best of three rounds: the machine is shared
        start = time.perf_counter()
        for _ in range(iters):
            out = fn()
        sync(out)
        best = min(best, (time.perf_counter() - start) / iters)
    return first * 1e6, best * 1e6


def torch_training_step(model, parameters, x, y, lr):
    optimizer = torch.optim.SGD(parameters, lr=lr)

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    return step


def graph_splits() -> dict[str, int]:
    """What ``backend="torchlax"`` compiled since the last ``counters.clear()``."""
    import torchlax_dynamo

    counts = torchlax_dynamo.counters
    return {k: counts[k] for k in ("graphs", "xla_programs", "eager_nodes")}


def torch_variants(model, x, y, lr, iters, splits):
    results = {}

    def add(name, wrap):
        forward_model = wrap(copy.deepcopy(model))
        trained = copy.deepcopy(model)

        def forward():
            with torch.no_grad():
                return forward_model(x)

        counted = name == "torchlax"
        if counted:
            import torchlax_dynamo

            torchlax_dynamo.counters.clear()
        forward_times = timed(forward, iters)
        if counted:
            splits["forward"] = graph_splits()
            torchlax_dynamo.counters.clear()
        train_times = timed(
            torch_training_step(wrap(trained), trained.parameters(), x, y, lr), iters
        )
        if counted:
            splits["training step"] = graph_splits()
        results[name] = (forward_times, train_times)

    torch._dynamo.reset()
    add("torchlax", lambda m: torch.compile(m, backend="torchlax"))
    try:
        import torchlax_interop
    except ImportError:
        pass
    else:
        add("interop.jit", torchlax_interop.jit)
    torch._dynamo.reset()
    add("inductor", torch.compile)
    add("eager", lambda m: m)
    return results


def jax_variant(model, x, y, lr, iters):
    params = [
        (jnp.asarray(m.weight.detach().numpy()), jnp.asarray(m.bias.detach().numpy()))
        for m in model
        if isinstance(m, torch.nn.Linear)
    ]
    xs, ys = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())

    def forward(params, x):
        for i, (w, b) in enumerate(params):
            x = x @ w.T + b
            if i < len(params) - 1:
                x = jax.nn.relu(x)
        return x

    def loss_fn(params, x, y):
        logits = forward(params, x)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))

    @jax.jit
    def train_step(params, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        return loss, jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads)

    jit_forward = jax.jit(forward)
    state = {"params": params}

    def step():
        loss, state["params"] = train_step(state["params"], xs, ys)
        return loss

    sync = jax.block_until_ready
    return {"jax": (timed(lambda: jit_forward(params, xs), iters, sync), timed(step, iters, sync))}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--iters", type=int, default=100)
    args = parser.parse_args()

    model = make_mlp(args.width, args.depth)
    x = torch.randn(args.batch, args.width)
    y = torch.randint(0, 10, (args.batch,))
    lr = 0.01
    results = jax_variant(model, x, y, lr, args.iters)
    splits: dict[str, dict[str, int]] = {}
    results.update(torch_variants(model, x, y, lr, args.iters, splits))

    print(
        f"MLP {args.depth}x{args.width} + head, batch {args.batch}, CPU, "
        f"{torch.get_num_threads()} torch threads, jax {jax.__version__}, torch {torch.__version__}"
    )
    base_fwd, base_train = results["jax"][0][1], results["jax"][1][1]
    print(
        f"{'':12} {'forward us':>11} {'x jax':>6} {'train us':>11} {'x jax':>6} "
        f"{'1st fwd ms':>11} {'1st train ms':>13}"
    )
    for name, ((fwd_first, fwd), (train_first, train)) in results.items():
        print(
            f"{name:12} {fwd:11.0f} {fwd / base_fwd:6.2f} {train:11.0f} "
            f"{train / base_train:6.2f} {fwd_first / 1e3:11.1f} {train_first / 1e3:13.1f}"
        )
    print("backend='torchlax' graph splits:")
    for what, counts in splits.items():
        print(
            f"  {what:14} {counts['graphs']} ATen graphs, {counts['xla_programs']} XLA programs, "
            f"{counts['eager_nodes']} eager nodes"
        )


if __name__ == "__main__":
    main()
