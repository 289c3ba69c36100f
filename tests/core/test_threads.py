"""torchlax from several threads at once: each thread keeps its own scopes, results match.

Every case runs 4-8 threads, joins each with a timeout (a deadlock fails, it does not hang),
and compares what each thread got with the same work done on one thread (or eager PyTorch).
"""

from __future__ import annotations

import textwrap
import threading

import fresh_python
import jax
import pytest
import torch
import torchlax
import torchlax_core
from torchlax_core import Environment, OpNotLoweredError, hookimpl

aten = torch.ops.aten
JOIN_TIMEOUT = 240  # seconds per thread: generous for a loaded CI machine, finite


def run_threads(*targets) -> None:
    """Run each target on its own thread; re-raise the first failure; fail on a hang."""
    errors: list[BaseException] = []

    def guarded(target):
        try:
            target()
        except BaseException as exc:  # reported on the main thread below
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(t,), daemon=True) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_TIMEOUT)
    assert not any(t.is_alive() for t in threads), "a thread did not finish (deadlock?)"
    if errors:
        raise errors[0]


class _Dropout(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.nn.functional.dropout(self.linear(x), 0.5, training=True)


def test_eager_random_ops_while_another_thread_traces_dropout():
    torch.manual_seed(0)
    model = _Dropout()
    x = torch.randn(4, 8)

    def traces(n):
        torch.manual_seed(1)
        with torchlax.enable():
            m = _Dropout().to("jax")
            m.load_state_dict(model.state_dict())
            xj = x.to("jax")
            # a fresh torchlax.jit each time: every call traces (and draws its key)
            return [torchlax.jit(m)(xj).cpu() for _ in range(n)]

    n_traces = 3
    expected_traced = traces(n_traces)

    traced, eager, rounds = [], [], []
    tracing = threading.Event()
    drawing = threading.Event()
    done = threading.Event()

    def thread_a():
        tracing.set()
        # Trace only once B draws: a trace can be quicker than B's start (its programs come
        # from the test run's compilation cache: tests/xla_compilation_cache.py).
        drawing.wait(JOIN_TIMEOUT)
        try:
            traced.extend(traces(n_traces))
        finally:
            done.set()

    def thread_b():
        tracing.wait(JOIN_TIMEOUT)
        gen = torch.Generator().manual_seed(7)
        with torchlax.enable():
            while not done.is_set() or len(eager) < 50:  # keep drawing while A traces
                value = torch.rand(3, device="jax", generator=gen)
                assert isinstance(value, torchlax_core.Tensor)
                assert not isinstance(value.jax(), jax.core.Tracer)  # never A's traced key
                eager.append(value.cpu())
                rounds.append(done.is_set())
                drawing.set()
                if len(eager) >= 5000:
                    break

    run_threads(thread_a, thread_b)
    assert rounds.count(False) > 0  # B really ran while A was tracing
    for got, want in zip(traced, expected_traced, strict=True):
        torch.testing.assert_close(got, want)
    gen = torch.Generator().manual_seed(7)
    with torchlax.enable():
        reference = [torch.rand(3, device="jax", generator=gen).cpu() for _ in range(len(eager))]
    for got, want in zip(eager, reference, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_enable_in_one_thread_does_not_change_another_threads_environment():
    bare = Environment(autoload=False)  # no lowerings at all: any op raises OpNotLoweredError
    inside = threading.Event()
    finished = threading.Event()
    seen_in_b = []

    def thread_b():
        with torchlax.enable(bare):
            seen_in_b.append(torchlax.current_env())
            inside.set()
            with pytest.raises(OpNotLoweredError):
                torchlax_core.wrap(jax.numpy.ones(2)) + 1
            finished.wait(JOIN_TIMEOUT)
            seen_in_b.append(torchlax.current_env())

    def work():
        with torchlax.enable():
            x = torch.arange(6.0, device="jax").reshape(2, 3)
            # fixed scalars: each op compiles once (the eager op cache keys on scalar values)
            return [((x * 2 + 1).sum(0) - 3).cpu() for _ in range(100)]

    expected = work()
    results = {}

    def thread_a(k):
        def run():
            inside.wait(JOIN_TIMEOUT)
            assert torchlax.current_env() is torchlax.default_env()
            results[k] = work()

        return run

    def release():
        try:
            run_threads(*(thread_a(k) for k in range(4)))
        finally:
            finished.set()

    run_threads(thread_b, release)
    assert seen_in_b == [bare, bare]
    assert sorted(results) == [0, 1, 2, 3]
    for got in results.values():
        for g, w in zip(got, expected, strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
    assert torchlax.current_env() is torchlax.default_env()  # and nothing leaked here


def _counting_override(op, calls):
    original = torchlax.default_env().lowering_for(op).fn

    class Counting:
        @hookimpl
        def torchlax_register_lowerings(self, registry):
            def counted(*args, **kwargs):
                # Runs only: the op cache also traces a lowering once, with abstract inputs,
                # to learn whether it draws PRNG keys (a random op is then never cached).
                if not any(isinstance(a, jax.core.Tracer) for a in args):
                    calls.append(threading.get_ident())
                return original(*args, **kwargs)

            registry.register_lowering(op, counted, override=True)

    return Counting()


@pytest.mark.parametrize("entry", ["Tensor.backward", "torch.autograd.backward"])
def test_backward_inside_enable_runs_with_that_environment(entry):
    # `loss.backward()` runs on the calling thread; torch.autograd.backward runs the backward
    # of jax tensors on PyTorch's device thread. Either way the environment and hooks must be
    # the ones of the `enable` block that called it.
    calls: list[int] = []
    env = Environment()
    env.register_plugin(_counting_override(aten.tanh_backward.default, calls), "count-tanh-bw")
    seen = []
    x_cpu = torch.linspace(-2, 2, 5, requires_grad=True)
    torch.tanh(x_cpu).sum().backward()
    with torchlax.enable(env):
        x = x_cpu.detach().to("jax").requires_grad_()
        x.register_hook(lambda grad: seen.append(torchlax.current_env()))
        loss = torch.tanh(x).sum()
        if entry == "Tensor.backward":
            loss.backward()
        else:
            torch.autograd.backward(loss)
    assert calls
    on_caller = all(ident == threading.get_ident() for ident in calls)
    assert on_caller == (entry == "Tensor.backward")
    assert seen == [env]
    torch.testing.assert_close(x.grad.cpu(), x_cpu.grad)


def test_dropout_backward_with_recomputation_inside_enable():
    # torch.utils.checkpoint recomputes the forward (dropout included) during backward, on
    # autograd's device thread: it must draw from the same environment and get the same mask.
    calls: list[int] = []
    env = Environment()
    env.register_plugin(_counting_override(aten.native_dropout.default, calls), "count-dropout")

    def block(x):
        return torch.nn.functional.dropout(x * 3.0, 0.5, training=True)

    with torchlax.enable(env):
        x = torch.ones(64, device="jax", requires_grad=True)
        out = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
        out.sum().backward()
    assert len(calls) == 2  # forward, and its recomputation in backward: both in env
    kept = (out.detach().cpu() != 0).float()
    assert 0 < kept.sum() < 64
    torch.testing.assert_close(x.grad.cpu(), kept * 3.0 / 0.5)  # the recomputed mask matches


def test_concurrent_first_dispatch_on_a_fresh_environment():
    env = Environment()  # empty caches: every op below is resolved for the first time
    x_cpu = torch.linspace(-3, 3, 24).reshape(4, 6)
    programs = [
        lambda t: torch.sin(t) * 2,
        lambda t: t.softmax(-1).sum(0),
        lambda t: torch.nn.functional.gelu(t).t() @ t,
        lambda t: t.cumsum(1).max(0).values,
        lambda t: torch.where(t > 0, t, t.exp()).mean(1),
        lambda t: torch.nn.functional.layer_norm(t, (6,)),
    ]
    expected = [p(x_cpu) for p in programs]
    got = {}

    def worker(k):
        def run():
            with torchlax.enable(env):
                t = x_cpu.to("jax")
                got[k] = [programs[(k + i) % len(programs)](t).cpu() for i in range(len(programs))]

        return run

    run_threads(*(worker(k) for k in range(6)))
    for k, values in got.items():
        for i, value in enumerate(values):
            torch.testing.assert_close(value, expected[(k + i) % len(programs)])


def test_default_env_is_created_once_under_concurrent_first_use():
    code = textwrap.dedent("""
        import threading, torchlax_core
        barrier = threading.Barrier(8)
        envs = []
        def first_use():
            barrier.wait()
            envs.append(torchlax_core.default_env())
        threads = [threading.Thread(target=first_use) for _ in range(8)]
        for t in threads: t.start()
        for t in threads: t.join(120)
        print(len(envs), len({id(e) for e in envs}))
    """)
    out = fresh_python.run(["-c", code], timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    assert out.stdout.split() == ["8", "1"]


class _MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(6, 16)
        self.b = torch.nn.Linear(16, 3)

    def forward(self, x):
        return self.b(torch.relu(self.a(x))).softmax(-1)


def _jit_first_call_from_threads():
    torch.manual_seed(0)
    model = _MLP()
    inputs = [torch.randn(n, 6) for n in (1, 2, 3, 5)]
    expected = [model(x).detach() for x in inputs]
    with torchlax.enable():
        jitted = torchlax.jit(model.to("jax"))
    got = {}
    barrier = threading.Barrier(len(inputs))

    def worker(k):
        def run():
            with torchlax.enable():
                x = inputs[k].to("jax")
                barrier.wait(JOIN_TIMEOUT)
                got[k] = jitted(x).detach().cpu()

        return run

    run_threads(*(worker(k) for k in range(len(inputs))))
    for k, want in enumerate(expected):
        torch.testing.assert_close(got[k], want)


def test_jit_module_first_called_from_four_threads_with_four_shapes():
    _jit_first_call_from_threads()


def test_fresh_jit_functions_traced_concurrently():
    fns = [
        lambda t: (t * 2).sum(0),
        lambda t: torch.tanh(t) @ t.T,
        lambda t: t.cumsum(0) - 1,
        lambda t: torch.nn.functional.softplus(t).max(1).values,
    ]
    x_cpu = torch.linspace(-2, 2, 12).reshape(3, 4)
    expected = [f(x_cpu) for f in fns]
    got = {}
    barrier = threading.Barrier(len(fns))

    def worker(k):
        def run():
            with torchlax.enable():
                jitted = torchlax.jit(fns[k])
                x = x_cpu.to("jax")
                barrier.wait(JOIN_TIMEOUT)
                got[k] = jitted(x).cpu()

        return run

    run_threads(*(worker(k) for k in range(len(fns))))
    for k, want in enumerate(expected):
        torch.testing.assert_close(got[k], want)
