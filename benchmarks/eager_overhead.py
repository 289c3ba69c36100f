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
the dispatch path takes (``_fast_methods`` off: its total is printed apart from the default
path's, whose ``Tensor.__add__`` serves the hit before PyTorch's dispatcher), each timed on its
own: PyTorch's dispatch into ``__torch_dispatch__`` (a subclass
that does nothing there), finding the environment, ``run_op``'s implementation lookup and
64-bit-mode check, the cache signature (built from the Tensors: a hit unwraps nothing else)
and lookup, the executable launch, and wrapping the result. "rest" is what the steps' sum leaves of the total: the Python calls
between them (``__torch_dispatch__`` -> ``run_op`` -> the op's implementation) and PyTorch's
handling of a new result tensor, including freeing the previous one (the do-nothing subclass
returns one preallocated tensor, so its dispatch step has none of that). The default path's
total is split in two "fast method" rows: its hit (``serve_pair``: key, lookup, launch, wrap),
and the rest (its checks for modes, autograd, ... and finding the environment's hit function).

With ``--mlp-step`` (``--gpt2``), it also counts the ops of one eager MLP training step (forward,
``loss.backward()``, SGD; the model of ``benchmarks/run.py``) and times each op class by its
own CPU time on the calling thread (nested ops, run by a decomposition, are subtracted from it;
XLA's worker threads computing earlier launches meanwhile are not charged), saying how each is
served: "cached" (an op-cache executable), "view", "decomposition" (Python on Tensors, its
ops dispatched one by one), "a signature never compiled" (with the cache's reason) or "plain"; a hot Tensor
operator (``_fast_methods``: ``a + b``, ``a @ b``, ...) has rows of its own, its calls served
before the dispatcher apart from those that fell through to it. ``--gpt2``
does the same for the eager GPT-2 forward of ``benchmarks/run.py``; ``--factories`` times small
tensors made on the jax device (``torch.tensor(data, device="jax")``, ``torch.empty``, ...);
``--only-ops`` skips the ``a + b`` timings.

    uv run python benchmarks/eager_overhead.py [--n 2000] [--repeats 7] [--profile] [--mlp-step]
        [--gpt2] [--factories] [--only-ops]
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
    from torchlax_core import _cached_op, _current, _fast_methods, _opcache, _tensor

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
        op = env._op_cache.op(func)
        hit_key = _cached_op._make_hit_key(func, op)
        key = _opcache.signature(op, [arr_a, arr_b], {}, [])
        entry = env._op_cache.entries.get(key)
        if entry is None:
            raise RuntimeError("the op cache did not keep aten.add.Tensor (is it turned off?)")
        entries = env._op_cache.entries
        meta = entry.meta
        new = _tensor._make_wrapper_subclass
        current_env = _current.current_env
        resolved = env._resolved

        def wrap():  # as serve_pair's: positional arguments (see _tensor._make_wrapper_subclass)
            r = new(
                torchlax_core.Tensor, meta[0], None, None, None, meta[1], torch.strided, meta[2]
            )
            r._storage = _tensor._Storage(arr_a)
            r._view = None
            return r

        steps["total: torchlax a + b"] = best_time(lambda: a + b, n, repeats)
        # The default path (Tensor.__add__, _fast_methods): the hit it serves (serve_pair:
        # key, lookup, launch, wrap), and the rest, its checks (modes, autograd, ...) and
        # finding the environment's serve_pair, as the difference.
        serve_pair = resolved[func].serve_pair  # pyright: ignore[reportFunctionMemberAccess]  (an attribute of our own on the function)
        steps["fast method: serve_pair (key, lookup, launch, wrap)"] = best_time(
            lambda: serve_pair(a, b), n, repeats
        )
        _fast_methods.uninstall()  # the dispatch path, which the steps below break down
        try:
            steps["total: torchlax a + b through __torch_dispatch__"] = best_time(
                lambda: a + b, n, repeats
            )
        finally:
            _fast_methods.install()
        steps["PyTorch dispatch into __torch_dispatch__"] = best_time(
            lambda: bare + bare, n, repeats
        )
        steps["current_env()"] = best_time(current_env, n, repeats)
        steps["run_op: implementation lookup + 64-bit check"] = best_time(
            lambda: (resolved.get(func), enable_x64.value), n, repeats
        )
        steps["cache signature from the Tensors"] = best_time(
            lambda: hit_key((a, b), {}, []), n, repeats
        )

        def lookup():  # the dict lookup, the hit count and the LRU's second-chance mark
            found = entries.get(key)
            stats.hits += 1
            found.used = True

        stats = env._op_cache.stats
        steps["cache lookup (hit count, LRU mark)"] = best_time(lookup, n, repeats)
        steps["executable launch"] = best_time(lambda: entry.call(arr_a, arr_b), n, repeats)
        steps["wrap result"] = best_time(wrap, n, repeats)
        steps["jnp.add (reference)"] = best_time(lambda: jnp.add(arr_a, arr_b), n, repeats)
        steps.update(floors(arr_a, arr_b, size, a.device, n, repeats))
    parts = [
        v for k, v in steps.items() if not k.startswith(("total", "jnp", "floor", "fast method"))
    ]
    steps["fast method: checks + finding serve_pair (total - serve_pair)"] = (
        steps["total: torchlax a + b"]
        - steps["fast method: serve_pair (key, lookup, launch, wrap)"]
    )
    steps["rest (glue between the steps)"] = steps[
        "total: torchlax a + b through __torch_dispatch__"
    ] - sum(parts)
    return steps


def floors(arr_a, arr_b, size: int, device, n: int, repeats: int) -> dict[str, float]:
    """What an ``a + b`` costs at best, with nothing of torchlax in it (same process, arrays
    and clock as the breakdown): JAX's ways of launching one precompiled add, and a
    ``torch.Tensor`` subclass whose ``__torch_dispatch__`` does the least a wrapper of a
    ``jax.Array`` can do. The last three rows are the floors of three designs: PyTorch's
    dispatch into ``__torch_dispatch__``, one launch of the compiled add and one new wrapper
    holding its result; the same launch and wrapper made in ``__torch_function__``, before
    PyTorch's dispatcher (which every other torch call on the subclass then pays a Python
    round trip for); and made in the subclass's own ``__add__`` (torchlax's
    ``_fast_methods``, which costs nothing to other calls).
    (Each costs more than its parts: code run between two launches slows the next launch, see
    docs/architecture.md.) PyTorch's dispatch alone, returning a premade wrapper, is the
    breakdown's own "PyTorch dispatch into __torch_dispatch__" row."""
    compiled = jax.jit(jnp.add).lower(arr_a, arr_b).compile()
    compiled(arr_a, arr_b)  # JAX makes the C++ launcher on the first call
    launch = getattr(compiled, "_call", compiled)  # (JAX's private name; absent: __call__)
    jitted = jax.jit(jnp.add)
    new = torch.Tensor._make_wrapper_subclass

    class Fresh(torch.Tensor):  # PyTorch's dispatch into Python, a new wrapper per call
        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            return new(Fresh, (size,), dtype=torch.float32, device=device)

        __torch_function__ = torch._C._disabled_torch_function_impl  # pyright: ignore[reportAssignmentType]

    class Launching(torch.Tensor):  # ... holding the result of one launch of the add
        array: jax.Array

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            x, y = args
            r = new(Launching, (size,), dtype=torch.float32, device=device)
            r.array = launch(x.array, y.array)
            return r

        __torch_function__ = torch._C._disabled_torch_function_impl  # pyright: ignore[reportAssignmentType]

    add = torch.Tensor.add
    plain = torch._C.DisableTorchFunctionSubclass

    class Served(torch.Tensor):  # ... or served from __torch_function__, before the dispatcher
        array: jax.Array

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            if func is add and not kwargs:
                x, y = args
                r = new(Served, (size,), dtype=torch.float32, device=device)
                r.array = launch(x.array, y.array)
                return r
            with plain():
                return func(*args, **(kwargs or {}))

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            raise NotImplementedError(f"{func}: only a + b is served")

    class Method(torch.Tensor):  # ... or served by the subclass's own __add__
        array: jax.Array

        def __add__(self, other):
            r = new(Method, (size,), dtype=torch.float32, device=device)
            r.array = launch(self.array, other.array)  # pyright: ignore[reportAttributeAccessIssue]
            return r

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            raise NotImplementedError(f"{func}: only a + b is served")

        __torch_function__ = torch._C._disabled_torch_function_impl  # pyright: ignore[reportAssignmentType]

    fresh = new(Fresh, (size,), dtype=torch.float32, device=device)
    x = new(Launching, (size,), dtype=torch.float32, device=device)
    y = new(Launching, (size,), dtype=torch.float32, device=device)
    x.array, y.array = arr_a, arr_b
    u = new(Served, (size,), dtype=torch.float32, device=device)
    v = new(Served, (size,), dtype=torch.float32, device=device)
    u.array, v.array = arr_a, arr_b
    p = new(Method, (size,), dtype=torch.float32, device=device)
    q = new(Method, (size,), dtype=torch.float32, device=device)
    p.array, q.array = arr_a, arr_b
    return {
        "floor: jax.jit(add) call (C++ fast path)": best_time(
            lambda: jitted(arr_a, arr_b), n, repeats
        ),
        "floor: Compiled.__call__ of add": best_time(lambda: compiled(arr_a, arr_b), n, repeats),
        "floor: Compiled launcher (_call) of add": best_time(
            lambda: launch(arr_a, arr_b), n, repeats
        ),
        "floor: _make_wrapper_subclass + free": best_time(
            lambda: new(Fresh, (size,), dtype=torch.float32, device=device), n, repeats
        ),
        "floor: subclass dispatch + new wrapper": best_time(lambda: fresh + fresh, n, repeats),
        "floor: subclass dispatch + launch + new wrapper": best_time(lambda: x + y, n, repeats),
        "floor: subclass __torch_function__ + launch + new wrapper": best_time(
            lambda: u + v, n, repeats
        ),
        "floor: subclass __add__ method + launch + new wrapper": best_time(
            lambda: p + q, n, repeats
        ),
    }


def _served_by(env, func) -> str:
    if isinstance(func, str):  # a hot Tensor operator (op_rows' counting_method)
        if func.endswith("served"):
            return "before the dispatcher (_fast_methods): an op-cache executable"
        return "fast method's checks + PyTorch's dispatch (its op counted on its own row)"
    why = env._op_cache.uncacheable.get(func)
    if why is not None:
        return f"a signature never compiled: {why}"
    impl = env._resolved.get(func)
    name = getattr(impl, "__qualname__", "")
    if name.startswith(("memory_order_impl", "meta_layout_impl")):  # a layout rule around it
        name = getattr(getattr(impl, "raw", None), "__qualname__", "")
    if name.startswith("cached_impl"):
        return "cached"
    if name.startswith(("view_impl", "as_strided_impl")):
        return "view"
    if name.startswith("derived_mutation_impl"):
        return "in-place: its functional op's executable, then a write"
    if "_implementation_for" in name:
        return "decomposition"
    return "plain"


def op_rows(env, step, steps: int = 10) -> list[tuple[str, float, float, str]]:
    """(op, calls per step, own CPU microseconds per step, how it is served) of ``step()``,
    most expensive first (run 3 times first, to fill the op cache)."""
    from torchlax_core import _fast_methods, _tensor

    for _ in range(3):
        step()
    calls: dict = {}
    own: dict = {}
    nested = [0.0]  # CPU time of ops run inside the current op
    run_op = _tensor.run_op

    def counting(env, func, args, kwargs, **options):
        outer, nested[0] = nested[0], 0.0
        start = time.thread_time()
        try:
            return run_op(env, func, args, kwargs, **options)
        finally:
            spent = time.thread_time() - start
            calls[func] = calls.get(func, 0) + 1
            own[func] = own.get(func, 0.0) + spent - nested[0]
            nested[0] = outer + spent

    def counting_method(name, method):
        # A hot operator served before the dispatcher (_fast_methods) runs no run_op; one
        # that falls through runs one inside it, whose time is counted under its op.
        def counted(*args, **kwargs):
            outer, nested[0] = nested[0], 0.0
            dispatched = len(calls)
            before = sum(calls.values())
            start = time.thread_time()
            try:
                return method(*args, **kwargs)
            finally:
                spent = time.thread_time() - start
                fell = sum(calls.values()) > before or len(calls) > dispatched
                key = f"Tensor.{name}: " + ("fell through" if fell else "served")
                calls[key] = calls.get(key, 0) + 1
                own[key] = own.get(key, 0.0) + spent - nested[0]
                nested[0] = outer + spent

        return counted

    methods = {name: torchlax_core.Tensor.__dict__[name] for name in _fast_methods._SERVED}
    _tensor.run_op = counting
    for name, method in methods.items():
        setattr(torchlax_core.Tensor, name, counting_method(name, method))
    try:
        for _ in range(steps):
            step()
    finally:
        _tensor.run_op = run_op
        for name, method in methods.items():
            setattr(torchlax_core.Tensor, name, method)
    rows = [(str(f), calls[f] / steps, own[f] / steps * 1e6, _served_by(env, f)) for f in calls]
    return sorted(rows, key=lambda row: -row[2])


def mlp_step_ops(steps: int = 10) -> list[tuple[str, float, float, str]]:
    """The ops of one eager MLP training step (``op_rows``). Autograd's engine runs on this
    thread (its multithreading off) so that nested ops are attributed correctly."""
    from torch import nn

    torch.manual_seed(0)
    with torchlax_core.enable() as env:
        model = nn.Sequential(
            nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 10)
        ).to("jax")
        x, y = torch.randn(64, 256).to("jax"), torch.randint(0, 10, (64,)).to("jax")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        with torch.autograd.set_multithreading_enabled(False):
            loss.backward()
        optimizer.step()
        torchlax_core.unwrap(loss).block_until_ready()

    return op_rows(env, step, steps)


def gpt2_forward_ops(steps: int = 10) -> list[tuple[str, float, float, str]]:
    """The ops of the eager GPT-2 forward of ``benchmarks/run.py`` (2 layers, no_grad)."""
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=4, n_embd=128, vocab_size=512, n_positions=128)
    with torchlax_core.enable() as env:
        model = GPT2Model(config).eval().to("jax")
        tokens = torch.randint(0, 512, (4, 64)).to("jax")

    def step():
        with torch.no_grad(), torchlax_core.enable(env):
            out = model(tokens).last_hidden_state
        torchlax_core.unwrap(out).block_until_ready()

    return op_rows(env, step, steps)


def factory_timings(n: int = 300, repeats: int = 7) -> dict[str, float]:
    """Microseconds (CPU) per call of small tensors made on the jax device from Python or CPU
    data: transformers' ``DynamicCache`` makes four ``torch.tensor([], device=...)`` per forward."""
    cpu3 = torch.tensor([1.0, 2.0, 3.0])
    cases = {
        'torch.tensor([], device="jax")': lambda: torch.tensor([], device="jax"),
        'torch.tensor([1, 2, 3], device="jax")': lambda: torch.tensor([1, 2, 3], device="jax"),
        'torch.empty(0, device="jax")': lambda: torch.empty(0, device="jax"),
        'torch.zeros(3, device="jax")': lambda: torch.zeros(3, device="jax"),
        'torch.full((4,), 7.0, device="jax")': lambda: torch.full((4,), 7.0, device="jax"),
        'cpu_tensor.to("jax") (3 floats)': lambda: cpu3.to("jax"),
    }
    with torchlax_core.enable():
        return {name: best_time(fn, n, repeats) for name, fn in cases.items()}


def print_rows(title: str, rows) -> None:
    total_calls = sum(r[1] for r in rows)
    total_us = sum(r[2] for r in rows)
    print(f"\n{title}: {total_calls:.0f} calls, {total_us / 1e3:.2f} ms of CPU time in them")
    print(f"  {'op':<42}{'calls':>6}{'own us':>9}  served by")
    for op, n_calls, us, how in rows:
        print(f"  {op:<42}{n_calls:>6.0f}{us:>9.0f}  {how}")


def timings(args, n: int, repeats: int) -> None:
    """The a + b timings and the breakdown (the default output)."""
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="calls per repeat")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--profile", action="store_true", help="cProfile the torchlax loop")
    parser.add_argument(
        "--mlp-step", action="store_true", help="count and time the ops of an MLP training step"
    )
    parser.add_argument(
        "--gpt2", action="store_true", help="count and time the ops of a GPT-2 eager forward"
    )
    parser.add_argument("--only-ops", action="store_true", help="skip the a + b timings")
    parser.add_argument(
        "--factories", action="store_true", help="time small tensors made on the jax device"
    )
    args = parser.parse_args()
    n, repeats = args.n, args.repeats

    if not args.only_ops:
        timings(args, n, repeats)
    if args.mlp_step:
        print_rows("ops of one eager MLP training step", mlp_step_ops())
    if args.gpt2:
        print_rows("ops of one eager GPT-2 forward (2 layers)", gpt2_forward_ops())
    if args.factories:
        print("\nsmall tensors made on the jax device (CPU us per call):")
        for name, us in factory_timings().items():
            print(f"  {name:<44}{us:>8.1f} us")


if __name__ == "__main__":
    main()
