"""The core's call plan (``torchlax_core._call_plan``): guard, launch, write-back, and a call
site's last plan, shared by the ``torch.compile`` backend and ``torchlax.jit``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torchlax_core
import torchlax_core._call_plan as call_plan_module
from torchlax_core import ProgramFailedError, ProgramOutOfMemoryError, Tensor
from torchlax_core.internal import (
    CHECKED_RUNS,
    MISS_SIGNATURE,
    MISS_STALE,
    MISS_STATICS,
    CallPlan,
    CompiledProgram,
    LastPlan,
    array_of,
    float32_matmul_precision,
    is_exclusive,
    signature,
)


def _scaled(static, x):
    """``x * static`` (static: a number; ``()``: 2); reads the matmul precision as a matmul's
    lowering does, so its entries go stale when the mode changes."""
    float32_matmul_precision()
    return [x * (static or 2)], None


def _plan_maker(program: CompiledProgram):
    return lambda entry, sig, avals, statics: CallPlan(program, entry, sig, avals, statics)


def _last(name="scaled", fn=_scaled, **options) -> tuple[CompiledProgram, LastPlan]:
    program = CompiledProgram(name, fn, **options)
    return program, LastPlan(program, _plan_maker(program))


def test_a_repeated_call_takes_the_last_plan_and_each_change_names_its_miss(env):
    program, last = _last()
    x = jnp.arange(3.0, dtype=jnp.float32)
    plan = last.get([x], (), (x,))
    assert plan.miss([x], ()) is None  # the very arrays: avals by identity
    assert plan.miss([jnp.ones(3, jnp.float32)], ()) is None  # equal avals, other objects
    assert plan.miss([jnp.ones(4, jnp.float32)], ()) == MISS_SIGNATURE
    assert plan.miss([jnp.ones(3, jnp.int32)], ()) == MISS_SIGNATURE
    assert plan.miss([x, x], ()) == MISS_SIGNATURE
    assert plan.miss([x], (3,)) == MISS_STATICS
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if previous != "high" else "highest")
    try:
        assert plan.miss([x], ()) == MISS_STALE
        stale_again = last.get([x], (), (x,))
        assert stale_again is not plan and stale_again.miss([x], ()) is None
    finally:
        torch.set_float32_matmul_precision(previous)
    assert program.traces == 2  # one entry per precision mode

    again = last.get([x], (), (x,))
    assert again.entry is plan.entry  # the first mode's entry, found again, not traced
    assert last.get([jnp.zeros(3, jnp.float32)], (), (x,)) is again
    other = last.get([jnp.ones(4, jnp.float32)], (), (x,))
    assert other is not again and program.traces == 3
    assert last.get([x], (), (x,)).entry is plan.entry and program.traces == 3


def test_statics_reach_their_own_entry(env):
    program, last = _last()
    x = jnp.arange(3.0, dtype=jnp.float32)
    (out,) = last.get([x], 3, (x,)).run((), (x,))
    np.testing.assert_array_equal(out, np.arange(3.0) * 3)
    (out,) = last.get([x], 5, (x,)).run((), (x,))
    np.testing.assert_array_equal(out, np.arange(3.0) * 5)
    assert program.traces == 2


def test_the_plain_launcher_is_taken_once_the_entry_ran(env):
    program, last = _last()
    x = jnp.arange(3.0, dtype=jnp.float32)
    plan = last.get([x], (), (x,))
    assert plan.plain is None  # never launched: run() makes the executable and its launcher
    plan.run((), (x,))
    assert plan.plain is not None
    (out,) = plan.run((), (x,))
    np.testing.assert_array_equal(out, np.arange(3.0) * 2)
    # A plan made for an entry that already ran launches plainly from its first call.
    fresh = CallPlan(program, plan.entry, plan.sig, plan.avals)
    assert fresh.plain is not None


def _incremented(static, state, x):
    return [state + x], None


def _write_plan(program, state: Tensor, x: jax.Array, donated: int) -> CallPlan:
    arrays = [array_of(state), x]
    sig = signature(arrays)
    entry = program.entry(((), sig), arrays)
    plan = CallPlan(program, entry, sig, [a.aval for a in arrays], (), donated)
    plan.written, plan.written_results, plan.written_exclusive = (0,), (0,), (True,)
    return plan


@pytest.mark.parametrize("donate", [False, True], ids=["kept", "donated"])
def test_the_run_writes_its_results_back_and_marks_them_exclusive(env, donate):
    program = CompiledProgram("step", _incremented, donate_argnums=(0,) if donate else ())
    state = Tensor(jnp.zeros(3, jnp.float32))
    x = jnp.ones(3, jnp.float32)
    plan = _write_plan(program, state, x, int(donate))
    for n in range(1, CHECKED_RUNS + 3):
        old = array_of(state)
        results = plan.run((state,), (old, x))
        assert is_exclusive(state)  # (before anything reads its array)
        assert array_of(state) is results[0]
        np.testing.assert_array_equal(np.asarray(array_of(state)), np.full(3, float(n)))
        assert old.is_deleted() is donate
    assert plan.checked == CHECKED_RUNS  # later runs are trusted, not waited for


def test_a_launch_refused_for_its_memory_leaves_the_state_untouched(env):
    def huge(static, state, x):  # a result of 4 TiB: XLA's estimate exceeds any device
        return [state + x, jnp.broadcast_to(x[0], (2**20, 2**20))], None

    program = CompiledProgram("huge", huge, donate_argnums=(0,))
    state = Tensor(jnp.zeros(3, jnp.float32))
    before = array_of(state)
    plan = _write_plan(program, state, jnp.ones(3, jnp.float32), 1)
    with pytest.raises(ProgramOutOfMemoryError, match="huge: the XLA program needs"):
        plan.run((state,), (before, jnp.ones(3, jnp.float32)))
    assert array_of(state) is before and not before.is_deleted()
    np.testing.assert_array_equal(np.asarray(state.jax()), np.zeros(3))


def test_a_failed_launch_is_named_and_writes_nothing_back(env):
    program = CompiledProgram("step", _incremented)
    state = Tensor(jnp.zeros(3, jnp.float32))
    x = jnp.ones(3, jnp.float32)
    plan = _write_plan(program, state, x, 0)
    plan.run((state,), (array_of(state), x))
    assert plan.plain is not None
    before = array_of(state)

    def refused(*args):  # XLA refusing the run, as it does when it cannot allocate
        raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 64 bytes")

    plan.plain = (refused, plan.plain[1])
    with pytest.raises(ProgramOutOfMemoryError, match="step: .*64 bytes requested.*as they were"):
        plan.run((state,), (before, x))
    assert array_of(state) is before


def test_a_run_seen_to_fail_writes_nothing_back(env, monkeypatch):
    program = CompiledProgram("step", _incremented)
    state = Tensor(jnp.zeros(3, jnp.float32))
    x = jnp.ones(3, jnp.float32)
    plan = _write_plan(program, state, x, 0)
    before = array_of(state)
    # What failure_of returns for a run whose results raise when waited for.
    failure = ProgramFailedError("step: the XLA program failed while it ran.", "step")
    monkeypatch.setattr(call_plan_module, "failure_of", lambda *args: failure)
    with pytest.raises(ProgramFailedError) as raised:
        plan.run((state,), (before, x))
    assert raised.value is failure
    assert array_of(state) is before and plan.checked == 0


class _InterruptedFinish(CallPlan):
    """A caller's plan whose output making is interrupted after the launch."""

    __slots__ = ()

    def finish(self, args, results):
        raise KeyboardInterrupt


def test_an_interrupt_after_the_launch_still_writes_the_state_back(env):
    program = CompiledProgram("step", _incremented, donate_argnums=(0,))
    state = Tensor(jnp.zeros(3, jnp.float32))
    x = jnp.ones(3, jnp.float32)
    arrays = [array_of(state), x]
    sig = signature(arrays)
    plan = _InterruptedFinish(
        program, program.entry(((), sig), arrays), sig, [a.aval for a in arrays], (), 1
    )
    plan.written, plan.written_results, plan.written_exclusive = (0,), (0,), (True,)
    old = array_of(state)
    with pytest.raises(KeyboardInterrupt):
        plan.run((state,), (old, x))
    assert old.is_deleted()  # donated to the run: the state holds the run's result
    np.testing.assert_array_equal(np.asarray(state.jax()), np.ones(3))


class _InterruptedOnce(CallPlan):
    """A caller's plan whose first write-back is interrupted halfway (as a Ctrl-C lands)."""

    __slots__ = ("interrupted",)

    def write_back(self, args, results):
        if not getattr(self, "interrupted", False):
            self.interrupted = True
            raise KeyboardInterrupt
        super().write_back(args, results)


def test_a_trusted_run_interrupted_in_its_write_back_still_writes_it_whole(env):
    # After its first CHECKED_RUNS runs a plan no longer waits for its results; an interrupt in
    # the write-back still leaves the state of the run it donated to, not deleted arrays.
    program = CompiledProgram("step", _incremented, donate_argnums=(0,))
    state = Tensor(jnp.zeros(3, jnp.float32))
    x = jnp.ones(3, jnp.float32)
    arrays = [array_of(state), x]
    sig = signature(arrays)
    entry = program.entry(((), sig), arrays)
    plan = _InterruptedOnce(program, entry, sig, [a.aval for a in arrays], (), 1)
    plan.written, plan.written_results, plan.written_exclusive = (0,), (0,), (True,)
    plan.interrupted = True
    for _ in range(CHECKED_RUNS):
        plan.run((state,), (array_of(state), x))
    plan.interrupted = False
    old = array_of(state)
    with pytest.raises(KeyboardInterrupt):
        plan.run((state,), (old, x))
    assert old.is_deleted() and plan.interrupted
    np.testing.assert_array_equal(np.asarray(state.jax()), np.full(3, CHECKED_RUNS + 1.0))


class _Prepared(CallPlan):
    """A caller's plan that changes its state before the launch (``prepare``): ``args[1]``, a
    dict, gets ``"prepared"``, which ``undo`` takes away."""

    __slots__ = ()

    def prepare(self, args):
        args[1]["prepared"] = True

    def undo(self, args):
        del args[1]["prepared"]


@pytest.mark.parametrize("atomic", [False, True], ids=["plain", "atomic"])
def test_what_a_plan_prepared_is_undone_where_its_launch_does_not_happen(env, atomic):
    program = CompiledProgram("step", _incremented)
    state = Tensor(jnp.zeros(3, jnp.float32))
    x = jnp.ones(3, jnp.float32)
    arrays = [array_of(state), x]
    sig = signature(arrays)
    plan = _Prepared(program, program.entry(((), sig), arrays), sig, [a.aval for a in arrays])
    plan.atomic = atomic
    changed: dict = {}

    def failing():
        assert changed == {"prepared": True}  # (prepared before the launch)
        raise RuntimeError("the launch failed")

    with pytest.raises(RuntimeError, match="the launch failed"):
        plan.run((state, changed), (), failing)
    assert changed == {}
    assert array_of(state) is arrays[0]
    plan.run((state, changed), (array_of(state), x))
    assert changed == {"prepared": True}  # (launched: kept)


def test_an_atomic_run_holds_a_ctrl_c_until_it_is_written_back(env):
    import signal

    program = CompiledProgram("step", _incremented, donate_argnums=(0,))
    state = Tensor(jnp.zeros(3, jnp.float32))
    x = jnp.ones(3, jnp.float32)
    written = []

    class CtrlC(CallPlan):
        __slots__ = ()

        def write_back(self, args, results):
            if not written:
                signal.raise_signal(signal.SIGINT)  # Ctrl-C as the write-back starts
            super().write_back(args, results)
            written.append(True)

    arrays = [array_of(state), x]
    sig = signature(arrays)
    plan = CtrlC(program, program.entry(((), sig), arrays), sig, [a.aval for a in arrays], (), 1)
    plan.written, plan.written_results, plan.written_exclusive = (0,), (0,), (True,)
    # Python's own handler (a pytest-xdist worker ignores SIGINT)
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            plan.run((state,), (array_of(state), x))
    finally:
        signal.signal(signal.SIGINT, handler)
    assert written == [True]  # delivered once the write-back was done, which ran once
    np.testing.assert_array_equal(np.asarray(state.jax()), np.ones(3))


def test_a_donating_run_holds_the_state_lock_until_written_back(env):
    program = CompiledProgram("step", _incremented, donate_argnums=(0,))
    state = Tensor(jnp.zeros(3, jnp.float32))
    x = jnp.ones(3, jnp.float32)
    held = []

    class Watched(CallPlan):
        __slots__ = ()

        def write_back(self, args, results):
            held.append(torchlax_core.internal.state_lock._is_owned())  # pyright: ignore[reportAttributeAccessIssue]  (CPython's RLock has it)
            super().write_back(args, results)

    arrays = [array_of(state), x]
    sig = signature(arrays)
    plan = Watched(program, program.entry(((), sig), arrays), sig, [a.aval for a in arrays], (), 1)
    plan.written, plan.written_results, plan.written_exclusive = (0,), (0,), (True,)
    plan.run((state,), (array_of(state), x))
    assert held == [True]


def test_a_launch_on_an_array_another_thread_donated_counts_as_state_in_flux():
    # The CI failure of the backend's reader-thread test: XLA's Execute() raised a ValueError,
    # which the reader did not retry once the state settled.
    from torchlax_core._state_lock import _read_in_flux

    donated = ValueError(
        "INVALID_ARGUMENT: Invalid buffer passed to Execute() as argument 0 to replica 0: "
        "INVALID_ARGUMENT: Buffer has been deleted or donated."
    )
    assert _read_in_flux(donated)
    assert _read_in_flux(RuntimeError("Array has been deleted with shape=float32[3]."))
    assert not _read_in_flux(ValueError("a bad argument"))
