"""Where one repeated ``torchlax.jit`` forward call's time goes, against ``jax.jit``'s (issue 14).

    uv run python benchmarks/jit_call_parts.py [--width 8 512] [--calls 3000]

The MLP of ``run.py`` (256 -> width -> width -> 10, batch 64) under ``torch.no_grad()``:
the whole call until it returns and until its result is ready, the same forward written in JAX
(``jax.jit``), and each part of our call on its own (``_RepeatedForward.call``'s checks, the
layout's guards, the launch through the compiled-program core and through the executable's C++
launcher directly, the outputs' wrapping). Every variant is called once per round, in turn, so a
busy stretch of the machine lands on all alike; min and median in microseconds.
"""

# ruff: noqa: B023  (each closure is timed in the round that made it)

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import torch
import torchlax
from torch import nn
from torchlax_core.internal import peek_array, wrap_results_like
from torchlax_interop import _jit  # the call's parts are timed on their own


def mlp(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(256, width), nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 10)
    )


def hand_written(model: nn.Module):
    params = [
        (jnp.asarray(m.weight.detach().numpy()), jnp.asarray(m.bias.detach().numpy()))
        for m in model
        if isinstance(m, nn.Linear)
    ]

    def forward(params, x):
        for i, (w, bias) in enumerate(params):
            x = x @ w.T + bias
            if i < len(params) - 1:
                x = jax.nn.gelu(x, approximate=False)
        return x

    return params, jax.jit(forward)


def parts(width: int, calls: int) -> None:
    torch.manual_seed(0)
    model = mlp(width).eval()
    x_cpu = torch.randn(64, 256)
    params, fast = hand_written(model)
    x_jax = jnp.asarray(x_cpu.numpy())
    with torchlax.enable():
        jmodel = model.to("jax")
        x = x_cpu.to("jax")
    jitted = torchlax.jit(jmodel)
    with torch.no_grad():
        for _ in range(3):
            jitted(x)
        repeat = jitted._repeat
        assert repeat is not None, "the forward was not recorded as repeatable"
        entry, core = repeat.entry, repeat.core
        state_arrays = repeat.state_arrays
        arrays = [x.jax()]
        key = entry.key(core.env)
        out_arrays, _, _ = core.run(entry, state_arrays, [], arrays)
        launcher = getattr(entry.executable, "_call", None) or entry.executable

        executable, launch = entry.executable, entry._launch

        def memoised(*args):
            return out_memo

        def python_alone():
            # the whole call with the executable's result memoised: our Python alone
            entry._executable = entry._launch = memoised
            try:
                return jitted(x)
            finally:
                entry._executable, entry._launch = executable, launch

        out_memo = executable(state_arrays, [], arrays, key)

        def repeat_alone():
            # _RepeatedForward.call with the executable's result memoised, without __call__
            entry._executable = entry._launch = memoised
            try:
                return repeat.call(jitted, (x,))
            finally:
                entry._executable, entry._launch = executable, launch

        def x64_and_lock():
            with _jit._trace_lock, _jit.x64():
                pass

        def lock():
            with _jit._trace_lock:
                pass


        import torchlax_core
        from torch._C import is_grad_enabled
        from torchlax_core.internal import signature

        def prechecks():
            return (
                is_grad_enabled()
                or jitted._layout is not repeat.layout
                or tuple(map(type, (x,))) != repeat.types
                or bool(torchlax_core.current_env().config.checked) is not repeat.checks
                or any(map(_jit._VIEW, (x,)))
            )

        def arrays_and_signature():
            arrays = [t.jax() for t in (x,)]
            return signature(arrays) != repeat.input_signature

        variants = {
            "pre-checks": prechecks,
            "t.jax(), signature": arrays_and_signature,
            "repeat.call alone, executable memoised": repeat_alone,
            "lock and x64() (the general path's)": x64_and_lock,
            "lock": lock,
            "torchlax.jit call (returns)": lambda: jitted(x),
            "jax.jit hand-written (returns)": lambda: fast(params, x_jax),
            "torchlax.jit call, executable memoised": python_alone,
            "guards: layout.holds_unchanged": lambda: repeat.layout.holds_unchanged(
                repeat.state, repeat.flags
            ),
            "launch: core.run": lambda: core.run(entry, state_arrays, [], arrays),
            "launch: executable's C++ launcher": lambda: launcher(state_arrays, [], arrays, key),
            "wrap: _to_tensors + _returned (general)": lambda: _jit._returned(
                repeat.info, _jit._to_tensors(out_arrays, True, arrays, repeat.info.out_orders)
            ),
            "wrap: from the recorded call's specs": lambda: wrap_results_like(
                out_arrays, repeat.out_specs or []
            ),
        }
        readies = {
            "torchlax.jit call (ready)": lambda: peek_array(jitted(x)).block_until_ready(),
            "jax.jit hand-written (ready)": lambda: fast(params, x_jax).block_until_ready(),
        }
        samples: dict[str, list[float]] = {name: [] for name in (*variants, *readies)}
        for _ in range(calls):
            for name, fn in variants.items():
                t0 = time.perf_counter()
                out = fn()
                samples[name].append(time.perf_counter() - t0)
                if name.endswith("(returns)") or name.startswith("launch"):
                    jax.block_until_ready(
                        out if not isinstance(out, torchlax.Tensor) else peek_array(out)
                    )
            for name, fn in readies.items():
                t0 = time.perf_counter()
                fn()
                samples[name].append(time.perf_counter() - t0)
    print(f"\nwidth {width}: {calls} rounds, each variant once per round (min / median us)")
    for name, times in samples.items():
        print(f"  {name:<42} {min(times) * 1e6:8.1f} / {statistics.median(times) * 1e6:8.1f}")
    for mine, theirs in (("returns", "returns"), ("ready", "ready")):
        a = samples[f"torchlax.jit call ({mine})"]
        b = samples[f"jax.jit hand-written ({theirs})"]
        print(
            f"  ratio until it {mine}: min {min(a) / min(b):.2f}x, "
            f"median {statistics.median(a) / statistics.median(b):.2f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, nargs="+", default=[8, 512])
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    for width in args.width:
        parts(width, args.calls)


if __name__ == "__main__":
    main()
