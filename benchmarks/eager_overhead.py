"""Eager dispatch overhead of torchlax on one small op.

Times ``a + b`` on 1000-element float32 tensors three ways and prints a table:

- torch CPU: plain PyTorch on CPU tensors;
- jnp: ``jax.numpy.add`` on the jax.Arrays directly (inside and outside JAX's x64 mode,
  which keeps separate caches, so each is warmed up on its own);
- torchlax: ``a + b`` on torchlax Tensors inside ``torchlax_core.enable()``.

"overhead" is torchlax's time minus the jnp call's (same arrays, x64 on, as torchlax runs
its lowerings); the goal is overhead <= 0.5 x the jnp call. Each figure is the best of
several repeats, so a busy machine disturbs it less.

Then a breakdown of one steady-state ``a + b`` (served by the eager op cache) into the steps
it takes, each timed on its own: PyTorch's dispatch into ``__torch_dispatch__`` (a subclass
that does nothing there), finding the environment, ``run_op``'s implementation lookup and
64-bit-mode check, unwrapping, the cache signature and lookup, the executable launch, and
wrapping the result. "rest" is what the steps' sum leaves of the total: the Python calls
between them (``__torch_dispatch__`` -> ``run_op`` -> the op's implementation) and PyTorch's
handling of a new result tensor, including freeing the previous one (the do-nothing subclass
returns one preallocated tensor, so its dispatch step has none of that).

    uv run python benchmarks/eager_overhead.py [--n 2000] [--repeats 7] [--profile]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import torch
import torchlax_core


def best_time(fn, n: int, repeats: int, clock=time.process_time) -> float:
    """Best per-call time of ``fn`` in microseconds over ``repeats`` runs of ``n`` calls.

    The default clock is the process's CPU time, which other processes on a busy machine
    barely disturb (the op runs synchronously on the calling thread for arrays this small).
    """
    for _ in range(max(50, n // 10)):  # warm up: compile, fill caches
        fn()
    best = float("inf")
    for _ in range(repeats):
        start = clock()
        for _ in range(n):
            fn()
        best = min(best, (clock() - start) / n)
    return best * 1e6


def breakdown(n: int = 2000, repeats: int = 7, size: int = 1000) -> dict[str, float]:
    """Microseconds per step of one cached eager ``a + b`` (see the module docstring)."""
    from jax._src.config import enable_x64
    from torchlax_core import _current, _dispatch, _opcache, _tensor

    class Bare(torch.Tensor):  # PyTorch's dispatch into Python and back, nothing else
        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            return bare

        __torch_function__ = torch._C._disabled_torch_function_impl

    bare = torch.Tensor._make_wrapper_subclass(Bare, (size,), dtype=torch.float32)
    func = torch.ops.aten.add.Tensor
    steps: dict[str, float] = {}
    with torchlax_core.enable() as env:
        a = torchlax_core.wrap(jnp.asarray(torch.rand(size).numpy()))
        b = torchlax_core.wrap(jnp.asarray(torch.rand(size).numpy()))
        for _ in range(3):
            a + b  # fills the op cache
        arr_a, arr_b = a.jax(), b.jax()
        unwrap = _dispatch._make_unwrapper(func)
        key = _opcache.signature(func, [arr_a, arr_b], {}, [])
        entry = env._op_cache.entries.get(key)
        if entry is None:
            raise RuntimeError("the op cache did not keep aten.add.Tensor (is it turned off?)")
        entries = env._op_cache.entries
        meta = entry.meta
        new = _tensor._make_wrapper_subclass
        current_env = _current.current_env
        resolved = env._resolved

        def wrap():
            r = new(torchlax_core.Tensor, meta[0], dtype=meta[1], device=meta[2])
            r._storage = _tensor._Storage(arr_a)
            r._view = None
            return r

        steps["total: torchlax a + b"] = best_time(lambda: a + b, n, repeats)
        steps["PyTorch dispatch into __torch_dispatch__"] = best_time(
            lambda: bare + bare, n, repeats
        )
        steps["current_env()"] = best_time(current_env, n, repeats)
        steps["run_op: implementation lookup + 64-bit check"] = best_time(
            lambda: (resolved.get(func), enable_x64.value), n, repeats
        )
        steps["unwrap"] = best_time(lambda: unwrap((a, b), {}), n, repeats)
        steps["cache signature"] = best_time(
            lambda: _opcache.signature(func, [arr_a, arr_b], {}, []), n, repeats
        )
        steps["cache lookup (LRU)"] = best_time(
            lambda: (entries.get(key), entries.move_to_end(key)), n, repeats
        )
        steps["executable launch"] = best_time(lambda: entry.call(arr_a, arr_b), n, repeats)
        steps["wrap result"] = best_time(wrap, n, repeats)
        steps["jnp.add (reference)"] = best_time(lambda: jnp.add(arr_a, arr_b), n, repeats)
    parts = [v for k, v in steps.items() if not k.startswith(("total", "jnp"))]
    steps["rest (glue between the steps)"] = steps["total: torchlax a + b"] - sum(parts)
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="calls per repeat")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--profile", action="store_true", help="cProfile the torchlax loop")
    args = parser.parse_args()
    n, repeats = args.n, args.repeats

    cpu_a, cpu_b = torch.rand(args.size), torch.rand(args.size)
    results: dict[str, float] = {}
    results["torch CPU"] = best_time(lambda: cpu_a + cpu_b, n, repeats)

    arr_a = jnp.asarray(cpu_a.numpy())
    arr_b = jnp.asarray(cpu_b.numpy())
    results["jnp.add (x64 off)"] = best_time(lambda: jnp.add(arr_a, arr_b), n, repeats)

    with torchlax_core.enable():
        a, b = torchlax_core.wrap(arr_a), torchlax_core.wrap(arr_b)
        results["jnp.add (x64 on)"] = best_time(lambda: jnp.add(arr_a, arr_b), n, repeats)
        results["torchlax a + b"] = best_time(lambda: a + b, n, repeats)
        results["torchlax torch.add(a, b)"] = best_time(lambda: torch.add(a, b), n, repeats)
        results["torchlax a.add_(b)"] = best_time(lambda: a.add_(b), n, repeats)
        if args.profile:
            import cProfile
            import pstats

            profile = cProfile.Profile()
            profile.enable()
            for _ in range(n):
                a + b
            profile.disable()
            pstats.Stats(profile).sort_stats("tottime").print_stats(20)

    jnp_call = results["jnp.add (x64 on)"]
    print(
        f"jax {jax.__version__}, torch {torch.__version__}, {args.size} float32 elements, "
        f"best of {repeats} x {n} calls"
    )
    print(f"{'what':<28}{'us/call':>10}{'vs jnp':>9}{'overhead/jnp':>14}")
    for name, us in results.items():
        overhead = f"{(us - jnp_call) / jnp_call:>14.2f}" if name.startswith("torchlax") else ""
        print(f"{name:<28}{us:>10.2f}{us / jnp_call:>9.2f}{overhead}")
    print("\nwhere one cached a + b spends its time:")
    for name, us in breakdown(n, repeats, args.size).items():
        print(f"  {name:<44}{us:>8.2f} us")


if __name__ == "__main__":
    main()
