"""The compiled-program core (``torchlax_core._compiled``) shared by jit, torch.compile, export."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torchlax_core
from torchlax_core import Tensor
from torchlax_core._compiled import (
    CompiledProgram,
    output_tensors,
    signature,
    write_back,
)


@pytest.fixture
def env():
    env = torchlax_core.Environment()
    with torchlax_core.enable(env):
        yield env


def _double(static, x):
    return (x * 2,), None


def test_signature_cache_hits_misses_and_compile_count(env):
    program = CompiledProgram("double", _double, env=env)
    before = env.stats()["compilations"]
    x = jnp.ones(3, jnp.float32)
    outs = [program(signature([x]), x)[0][0] for _ in range(3)]
    for out in outs:
        np.testing.assert_array_equal(out, 2 * np.ones(3))
    y = jnp.ones(4, jnp.float32)
    program(signature([y]), y)
    assert (program.traces, program.compilations, len(program)) == (2, 2, 2)
    assert env.stats()["compilations"] == before + 2


def test_cache_is_bounded(env):
    program = CompiledProgram("double", _double, env=env, max_signatures=2)
    for n in range(1, 5):
        x = jnp.ones(n)
        program(signature([x]), x)
    assert len(program) == 2


def test_concurrent_first_calls_compile_once(env):
    program = CompiledProgram("double", _double, env=env)
    x = jnp.ones(8)
    barrier = threading.Barrier(4)
    results, errors = [], []

    def call():
        try:
            with torchlax_core.enable(env):
                barrier.wait()
                results.append(program(signature([x]), x)[0][0])
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(results) == 4 and (program.traces, program.compilations) == (1, 1)


def test_key_drawn_is_learned_per_signature(env):
    # Random only at one shape: the other signature must not consume the generator.
    def maybe_random(static, x):
        if x.shape[0] == 2:
            return (x + jax.random.uniform(env.next_prng_key(), x.shape),), None
        return (x,), None

    program = CompiledProgram("maybe", maybe_random, env=env)
    plain, rand = jnp.zeros(3), jnp.zeros(2)
    assert not program.entry(signature([plain]), (plain,)).random
    assert program.entry(signature([rand]), (rand,)).random
    torch.manual_seed(0)
    state = torch.get_rng_state()
    program(signature([plain]), plain)
    assert torch.equal(torch.get_rng_state(), state)  # no key drawn
    (a,), _ = program(signature([rand]), rand)
    (b,), _ = program(signature([rand]), rand)
    assert not np.array_equal(a, b)  # a fresh key per call


def test_info_learned_while_tracing_is_kept_on_the_entry(env):
    program = CompiledProgram("info", lambda static, x: ((x,), ("layout", static)), env=env)
    x = jnp.ones(2)
    _, entry = program(("s", signature([x])), x, static="s")
    assert entry.info == ("layout", "s")


def test_donation_leaves_the_callers_tensors_valid(env):
    program = CompiledProgram("step", lambda static, s: ((s + 1,), None), donate_argnums=(0,))
    tensor = Tensor(jnp.zeros(4, jnp.float32))
    for _ in range(2):
        (new,), _ = program(signature([tensor._value()]), tensor._value())
        write_back(tensor, new)
    np.testing.assert_array_equal(tensor.jax(), 2 * np.ones(4))


def test_write_back_reaches_a_views_base(env):
    base = Tensor(jnp.zeros((2, 3), jnp.float32))
    row = base[1]
    write_back(row, jnp.ones(3, jnp.float32))
    expected = torch.zeros(2, 3)
    expected[1] = 1
    torch.testing.assert_close(base.cpu(), expected)
    assert row._base is base


def test_write_back_into_a_cpu_tensor_is_in_place(env):
    t = torch.zeros(3)
    version, ptr = t._version, t.data_ptr()
    write_back(t, jnp.ones(3, jnp.float32))
    assert torch.equal(t, torch.ones(3))
    assert t._version == version + 1 and t.data_ptr() == ptr


def test_checked_program_raises_before_returning(env):
    def index(static, x, i):
        return (torchlax_core.unwrap(torch.index_select(Tensor(x), 0, Tensor(i))),), None

    program = CompiledProgram("index", index, checks=True, env=env)
    x, i = jnp.arange(3.0), jnp.asarray([5])
    with pytest.raises(IndexError):
        program(signature([x, i]), x, i)


def test_a_compilation_ahead_is_waited_for_by_the_calls_that_need_it(env):
    program = CompiledProgram("double", _double, env=env)
    x = jnp.ones(5, jnp.float32)
    entry = program.entry(signature([x]), [x])
    entry.compile_ahead()
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(program.run(entry, x))) for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert entry.wait_compiled() is None
    for out in results:
        np.testing.assert_array_equal(out[0], 2 * np.ones(5))
    assert (program.traces, program.compilations, len(results)) == (1, 1, 3)


def test_a_failed_compilation_ahead_is_raised_by_the_call_that_needs_it(env, monkeypatch):
    program = CompiledProgram("double", _double, env=env)
    x = jnp.ones(3, jnp.float32)
    entry = program.entry(signature([x]), [x])

    def refused(self, *args, **kwargs):
        raise RuntimeError("XLA refused it")

    monkeypatch.setattr(jax.stages.Lowered, "compile", refused)
    entry.compile_ahead()
    assert isinstance(entry.wait_compiled(), RuntimeError)  # waited for; the error stays
    monkeypatch.undo()
    with pytest.raises(RuntimeError, match="XLA refused it"):
        program.run(entry, x)
    assert program.compilations == 0
    np.testing.assert_array_equal(program.run(entry, x)[0], 2 * np.ones(3))  # compiled again
    assert program.compilations == 1


def test_donatable_copies_what_someone_else_may_read():
    # One rule for jit's training step and the torch.compile backend: an array is donated as
    # it is only where its storage holds it alone and the call passes it once.
    from torchlax_core._compiled import donatable

    a, b, c = jnp.arange(3.0), jnp.arange(4.0), jnp.arange(5.0)
    same = [a, b]
    assert donatable(same, [True, True]) is same  # nothing to copy: the very list
    out = donatable([a, b], [True, False])
    assert out[0] is a and out[1] is not b
    np.testing.assert_array_equal(out[1], b)
    twice = donatable([a, a, c], [True, True, True])  # passed twice: neither is its own
    assert twice[0] is not a and twice[1] is not a and twice[2] is c
    kept = donatable([a, c], [True, True], kept=[c])  # also read at a position not donated
    assert kept[0] is a and kept[1] is not c
    small = jnp.arange(3, dtype=jnp.int8)
    assert donatable([small], [False])[0].dtype == jnp.int8  # (a copy keeps its dtype)


def test_a_value_of_a_finished_trace_read_again_is_a_jit_error(env):
    # A tracer kept outside its trace (stored on an object no one passes in) that a later
    # trace reads: refused as a JitError naming the program, not JAX's "compiled for N inputs".
    kept = []

    def keeps(static, x):
        if not kept:
            kept.append(x.sum())
        return (x + kept[0],), None

    program = CompiledProgram("keeps", keeps, env=env)
    x = jnp.ones(3, jnp.float32)
    program(signature([x]), x)  # the first trace stores one of its values
    y = jnp.ones(4, jnp.float32)
    with pytest.raises(torchlax_core.JitError, match="keeps: the traced function reads 1"):
        program(signature([y]), y)


def test_a_tracer_jax_refuses_while_tracing_is_a_jit_error_naming_the_program(env):
    # A value of another trace that JAX does not take in as an input raises its
    # UnexpectedTracerError while tracing: every compiled program (torchlax.jit's, a
    # torch.compile graph's, export's) refuses it as a JitError that names the program and
    # what to do, the JAX error as its cause; nothing is cached, and a later trace runs.
    fail = [True]

    def escapes(static, x):
        if fail[0]:
            raise jax.errors.UnexpectedTracerError("Encountered an unexpected tracer.")
        return (x + 1,), None

    program = CompiledProgram("escapes", escapes, env=env)
    x = jnp.ones(3, jnp.float32)
    with pytest.raises(torchlax_core.JitError, match="escapes: a tensor from another") as caught:
        program(signature([x]), x)
    assert "Return such values from the function" in str(caught.value)
    assert isinstance(caught.value.__cause__, jax.errors.UnexpectedTracerError)
    assert len(program) == 0
    fail[0] = False
    (out,), _ = program(signature([x]), x)
    np.testing.assert_array_equal(out, np.full(3, 2.0, np.float32))


def _no_torch(arrays, devices):
    raise AssertionError("every result stays on the jax device")


def test_a_result_returned_in_memory_order_is_viewed_back_with_eagers_strides(env):
    # The caller's side of a program's results, shared by torchlax.jit and the backend: one
    # returned in memory order is viewed back with eager's strides (output_tensors).
    ints = jnp.zeros(4, jnp.int32)
    stored = jnp.arange(6.0, dtype=jnp.float32).reshape(3, 2)  # a (2, 3) result, stored transposed
    out = output_tensors([stored, ints], True, _no_torch, None, [(1, 0), None])
    assert tuple(out[0].shape) == (2, 3) and out[0].stride() == (1, 2)
    assert torch.equal(out[0].cpu(), torch.arange(6.0).reshape(3, 2).T)
    assert out[1].stride() == (1,)
