"""Max pooling's forward and backward on the device JAX sees: torchlax's lowering against
XLA's own ``reduce_window`` max (the numbers behind ``_lowerings/pooling.py``'s formulation).

Cases, each one jitted program of forward and backward at ResNet-50's stem pooling (kernel 3,
stride 2, padding 1, bfloat16 input of ``--shape``), timed as the minimum of ``--steps`` calls
after one warm-up call, first call (compile) timed apart:

- ``torchlax``: the ATen lowerings torchlax runs, ``max_pool2d_with_indices`` (values and
  int64 indices) then ``max_pool2d_with_indices_backward`` from those indices, as a
  ``torchlax.jit`` training step's program holds them;
- ``torchlax_jax_grad``: ``jax.grad`` through the forward lowering (``torchlax.functional``
  + ``jax.grad``);
- ``xla``: ``jax.lax.reduce_window`` max and its ``select_and_scatter`` backward (no
  indices: it cannot say which of equal maxima or NaNs PyTorch's indices name).

    python benchmarks/tpu_pooling.py --out results/tpu_pooling.json
    python benchmarks/tpu_pooling.py --shape 2,8,32,32 --steps 3     # a CPU-sized check
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

_ARGS = ([3, 3], [2, 2], [1, 1], [1, 1], False)


def programs() -> dict:
    import jax
    import jax.numpy as jnp
    import torchlax  # noqa: F401  (registers the lowerings; enables 64-bit values)
    from torchlax_ops._lowerings import pooling

    def torchlax_step(x):
        out, indices = pooling.max_pool2d_with_indices(x, *_ARGS)
        grad = pooling.max_pool2d_with_indices_backward(2 * out, x, *_ARGS, indices)
        return grad, out

    def torchlax_jax_grad(x):
        def loss(x):
            return jnp.sum(pooling.max_pool2d_with_indices(x, *_ARGS)[0].astype(jnp.float32) ** 2)

        return jax.grad(loss)(x)

    def xla(x):
        def pool(x):
            pads = ((0, 0), (0, 0), (1, 1), (1, 1))
            return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1, 3, 3), (1, 1, 2, 2), pads)

        out, vjp = jax.vjp(pool, x)
        return vjp(2 * out)[0], out

    return {
        "torchlax": jax.jit(torchlax_step),
        "torchlax_jax_grad": jax.jit(torchlax_jax_grad),
        "xla": jax.jit(xla),
    }


def measure(shape: tuple, steps: int) -> dict:
    import jax
    import jax.numpy as jnp
    from torchlax_core.internal import x64

    with x64():  # as torchlax runs its lowerings: the indices are int64
        return _measured(shape, steps, jax, jnp)


def _measured(shape: tuple, steps: int, jax, jnp) -> dict:

    x = jax.random.normal(jax.random.key(0), shape, jnp.bfloat16)
    rows = {"device": str(jax.devices()[0]), "shape": list(shape)}
    for name, program in programs().items():
        t0 = time.perf_counter()
        jax.block_until_ready(program(x))
        first = time.perf_counter() - t0
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            jax.block_until_ready(program(x))
            times.append(time.perf_counter() - t0)
        rows[name] = {"first_call_s": first, "min_ms": 1e3 * min(times)}
        print(f"{name:18s} first {first:6.1f} s   fwd+bwd {1e3 * min(times):9.2f} ms", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="128,64,112,112", help="N,C,H,W of the input")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    rows = measure(tuple(int(d) for d in args.shape.split(",")), args.steps)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
