"""The host time of a repeated ``torchlax.jit`` training step before its XLA launch (issue 35).

    uv run python benchmarks/jit_host.py [--calls 600] [--layers 12] [--width 16]

A GPT-2 LM of ``--layers`` layers of width ``--width`` (transformers' ``GPT2LMHeadModel``,
148 parameters at 12 layers, dropout off) with AdamW, stepped by ``torchlax.jit(step)`` with
``step`` = ``zero_grad``, forward, ``loss.backward()``, ``opt.step()``, ``return loss``: so
small that XLA computes next to nothing and what is timed is the call's own Python. Against it,
JAX + optax over the same arrays (``jax.jit`` of ``value_and_grad`` and an ``optax.adamw``
update, the state donated; the forward through ``torchlax.functional``).

A benchmark that waits for each step's loss (benchmarks/tpu.py) pays every microsecond of
host time before the launch, while what runs after it overlaps the device's computation.
Per repeated call, after warm-up, medians over ``--calls`` rounds (each variant once per
round, in turn, after its previous call's result was ready):

- **to launch**: from the call's start to the call of the XLA executable's launcher (the
  plan's ``plain`` launcher, wrapped by this script for the measurement only). JAX + optax has
  no such point outside its C++ call: its whole call is given, an upper bound.
- **call**: from the call's start until it returns. The launch is asynchronous on an
  accelerator; on the CPU, XLA may run a program this small inside the launcher's call, so
  the launcher's own time is given too, and the call less it (the host's Python).

Both as the calling thread's CPU time (a loaded machine's waits not counted) and as wall time.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import torch
import torchlax
from torch import nn

_CLOCKS = {"CPU": time.thread_time_ns, "wall": time.perf_counter_ns}


def gpt2(layers: int, width: int) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=64,
        n_positions=32,
        n_embd=width,
        n_layer=layers,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return GPT2LMHeadModel(config)


def loss_of(logits, tokens, log_softmax, take):
    """Next-token cross entropy (written once for both frameworks' ops)."""
    logits, labels = logits[:, :-1], tokens[:, 1:]
    return -take(log_softmax(logits), labels).mean()


def torch_step(model: nn.Module, tokens: torch.Tensor) -> Callable[[], Any]:
    with torchlax.enable():
        jm = copy.deepcopy(model).to("jax")
        jt = tokens.to("jax")
    opt = torch.optim.AdamW(jm.parameters(), lr=1e-3, weight_decay=0.01)

    def step():
        opt.zero_grad()
        loss = loss_of(
            jm(jt).logits,
            jt,
            lambda x: torch.log_softmax(x, -1),
            lambda x, i: torch.gather(x, -1, i[..., None]),
        )
        loss.backward()
        opt.step()
        return loss

    return torchlax.jit(step)


def jax_step(model: nn.Module, tokens: torch.Tensor) -> Callable[[], Any]:
    import optax

    params, _, forward = torchlax.functional(copy.deepcopy(model))
    ta = jnp.asarray(tokens.numpy())
    tx = optax.adamw(1e-3, weight_decay=0.01)

    def loss_fn(p, t):
        return loss_of(
            forward(p, t).logits,
            t,
            lambda x: jax.nn.log_softmax(x, -1),
            lambda x, i: jnp.take_along_axis(x, i[..., None], -1),
        )

    def step_jitted(p, s, t):
        loss, grads = jax.value_and_grad(loss_fn)(p, t)
        updates, s = tx.update(grads, s, p)
        return optax.apply_updates(p, updates), s, loss

    step_jitted = jax.jit(step_jitted, donate_argnums=(0, 1))
    state = [params, tx.init(params)]

    def step():
        state[0], state[1], loss = step_jitted(state[0], state[1], ta)
        return loss

    return step


class LaunchStamp:
    """Records the clocks when the last plan of a jitted step calls its executable's launcher
    (wrapping the plan's ``plain`` launcher: ``CallPlan.launch``'s fast path)."""

    def __init__(self, jitted):
        self.jitted, self.stamps, self.wrapped = jitted, {k: 0 for k in _CLOCKS}, None

    def arm(self) -> None:
        """Wrap the current last plan's launcher (again where a new plan was made)."""
        plan = self.jitted._last.plan
        if plan is None or plan.plain is None:
            raise RuntimeError("the jitted step has no plan with a plain launcher to time")
        if plan.plain[0] is self.wrapped:
            return
        launcher, key = plan.plain
        stamps = self.stamps

        def stamped(*args):
            for name, clock in _CLOCKS.items():
                stamps[name] = clock()
            try:
                return launcher(*args)
            finally:
                for name, clock in _CLOCKS.items():
                    stamps[name, "done"] = clock()

        self.wrapped = stamped
        plan.plain = (stamped, key)


def measure(variants: dict[str, Callable[[], Any]], stamps: dict, calls: int) -> dict:
    """Per variant and clock: [to launch], [call] in ns, interleaved one round at a time."""
    times = {name: {k: ([], [], []) for k in _CLOCKS} for name in variants}
    for _ in range(calls):
        for name, fn in variants.items():
            stamp = stamps.get(name)
            if stamp is not None:
                stamp.arm()
            jax.block_until_ready(_array(fn()))  # (the previous call's result ready)
            start = {k: c() for k, c in _CLOCKS.items()}
            out = fn()
            end = {k: c() for k, c in _CLOCKS.items()}
            jax.block_until_ready(_array(out))
            for k in _CLOCKS:
                launch, launcher, whole = times[name][k]
                whole.append(end[k] - start[k])
                if stamp is not None:
                    launch.append(stamp.stamps[k] - start[k])
                    launcher.append(stamp.stamps[k, "done"] - stamp.stamps[k])
    return times


def _array(out):
    return out.jax() if isinstance(out, torch.Tensor) else out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=600)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=16)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = gpt2(args.layers, args.width)
    tokens = torch.randint(0, 64, (2, 16))
    ours = torch_step(model, tokens)
    theirs = jax_step(model, tokens)
    for _ in range(5):
        jax.block_until_ready(_array(ours()))
        jax.block_until_ready(theirs())
    params = len(list(model.parameters()))
    label = f"torchlax.jit ({params} params, AdamW)"
    variants = {label: ours, "JAX + optax": theirs}
    times = measure(variants, {label: LaunchStamp(ours)}, args.calls)
    print(f"{args.calls} rounds, medians in us (min in brackets); {jax.devices()[0].platform}")
    for clock in _CLOCKS:
        print(f"  {clock} time:")
        for name in variants:
            launch, launcher, whole = times[name][clock]
            line = f"    {name:<34} call {_us(whole)}"
            if launch:
                host = [w - x for w, x in zip(whole, launcher, strict=True)]
                line += f"   to launch {_us(launch)}   launcher {_us(launcher)}"
                line += f"   call less launcher {_us(host)}"
            print(line)
        ours_launch, _, ours_whole = times[label][clock]
        jax_whole = times["JAX + optax"][clock][2]
        jax_median = statistics.median(jax_whole)
        print(
            f"    ratios to JAX + optax's call: call {statistics.median(ours_whole) / jax_median:.2f}x,"
            f" to launch {statistics.median(ours_launch) / jax_median:.2f}x"
        )


def _us(ns: list[int]) -> str:
    return f"{statistics.median(ns) / 1e3:8.1f} ({min(ns) / 1e3:7.1f})"


if __name__ == "__main__":
    main()
