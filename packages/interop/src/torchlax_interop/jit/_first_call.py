"""``torchlax.jit``'s first call of a step that creates state: its program and the next
call's compiled at once.

A training step's first call finds state missing that the step itself creates (the
optimizers' ``exp_avg``, ``step``, momentum buffers, ...; the ``.grad``s its ``backward()``
fills). That call is traced and compiled like any other, with no eager pass over the model:
what the step creates comes out of the program (``_NEW`` slots of ``_Info``) and becomes state,
an input of the next calls' program. That steady program has another state structure, so the
first call also traces and compiles it (``_Jitted._compile_only``: traced, compiled, not run),
and the second and later calls compile nothing.

The two compilations run at once (XLA's compiler releases the GIL): the first program's
compilation starts in another thread right after its trace; the steady step is traced
meanwhile over the state the first call will leave, abstract arrays (``jax.ShapeDtypeStruct``s
of the types in the first program's kept jaxpr) standing in for what it creates, and compiled
in a third thread; the state is put back, the first program runs, and the call returns when
both are compiled. Where stand-ins cannot say what the state will be (state on several
devices, CPU state lent to the program, a first call that trains nothing, checked mode: no
jaxpr kept), the steady step is traced after the first call ran. Ops the first trace runs on
concrete values (a step count made with ``torch.tensor(0.0)``) compile nothing in the op
cache: they run once.

A first call whose trace fails (refused, or reading a value on the host, as Rprop's state
creation does) runs eagerly, once, as PyTorch runs it, with a log line; the next call traces
the steady step.
"""

from __future__ import annotations

from typing import Any

import jax
from torchlax_core import JitError
from torchlax_core.internal import HeldInterrupts as _HeldInterrupts
from torchlax_core.internal import op_cache_compiling_nothing

from ._program import _log, held, put_back
from ._refusals import _owner
from ._repeated import _write_plan, _write_state

# ``_Jitted._compile_only`` while the first call traces its own program (whose trace errors
# are the call's, and whose compilation shows a progress line on a terminal: one at a time)
FIRST = "first"


def first_call(jitted: Any, state: Any, args: tuple, kwargs: dict) -> Any:
    """The first call of a step whose optimizers have no state yet (or parameters no
    ``.grad``), run compiled, the next call's program compiled by the time it returns.

    Its trace refused (a ``JitError``) or needing a value on the host (Rprop's ``lr.item()``:
    a ``RuntimeError`` under the trace), it runs eagerly (the trace put back what it
    changed); the next call traces the steady step and raises a refusal that still holds."""
    with op_cache_compiling_nothing():
        steady = None
        try:
            first = _compile_ahead(jitted, args, kwargs, FIRST)
            sharding = _one_device(jitted, first)
            if sharding is not None:
                steady = _steady_ahead(jitted, first, sharding, args, kwargs)
            first.entry.executable  # noqa: B018  (waits for it here, not in the launch)
            out = jitted._call(args, kwargs)
        except (JitError, RuntimeError, jax.errors.ConcretizationTypeError) as error:
            _log.info(
                "%s: the first call runs eagerly, since its trace failed (%s: %s); the next "
                "call traces the steady step",
                _owner(jitted),
                type(error).__name__,
                error,
            )
            return jitted._eager(args, kwargs, state.optimizers)
        if steady is None:  # (no stand-ins: traced over the state the call left)
            steady = _compile_ahead(jitted, args, kwargs, True)
        if steady is not None:
            error = steady.entry.wait_compiled()
            if error is not None:  # raised by the next call, which needs the program
                _log.info(
                    "torchlax.jit: the steady step's program failed to compile (%s: %s); the "
                    "next call raises it",
                    type(error).__name__,
                    error,
                )
    return out


def _compile_ahead(jitted: Any, args: tuple, kwargs: dict, mode: object) -> Any:
    """The ``_Run`` of the program a call with these arguments would run now, over the state
    there is now: traced, compiling in another thread (``compile_only``), not run.

    ``mode`` FIRST: the first call's own program, whose trace errors are the call's. Else the
    steady step's: a failure here (its trace refused) is not the first call's: it is logged,
    None is returned, and the next call, which traces the same program, raises it."""
    jitted._compile_only = mode
    try:
        return jitted._call(args, kwargs)
    except Exception as error:
        if mode is FIRST:
            raise
        _log.info(
            "torchlax.jit: the steady step's program was not compiled ahead of its first "
            "call (%s: %s); the next call traces it",
            type(error).__name__,
            error,
        )
        return None
    finally:
        jitted._compile_only = False


def compile_only(jitted: Any, run: Any) -> Any:
    """What ``_Jitted._call`` does instead of launching ``run.entry`` under ``_compile_only``:
    start compiling it in another thread; ``run`` is returned."""
    run.entry.compile_ahead(progress=jitted._compile_only is FIRST)
    return run


def _one_device(jitted: Any, run: Any) -> Any:
    """The sharding of the one device that holds every array of a training step's call (the
    stand-ins of the state it creates go there too), or None where stand-ins cannot say what
    the state after the call is: a call that trains nothing, lent CPU state, CPU buffers of a
    module target, arrays on several devices or sharded; or where the program's result types
    are not kept (checked mode keeps no jaxpr of a step)."""
    if run.forward or not run.info.trains or jitted._cpu_outputs or run.cpu_tensors:
        return None
    shardings = {getattr(a, "sharding", None) for a in (*run.state_arrays, *run.arrays)}
    if len(shardings) != 1 or run.entry.jaxpr is None:
        return None
    (sharding,) = shardings
    if not isinstance(sharding, jax.sharding.SingleDeviceSharding):
        return None
    return sharding


def _steady_ahead(jitted: Any, first: Any, sharding: Any, args: tuple, kwargs: dict) -> Any:
    """Trace the steady step over the state the first call (``first``, its ``_Run``) will
    leave, with stand-ins on ``sharding`` for the arrays it creates, and start compiling it;
    the state is put back as it was after (also if this raises or is interrupted)."""
    state, info, entry = first.state, first.info, first.entry
    _, new_types, extra_types = jax.tree.unflatten(entry.out_tree, entry.jaxpr.out_avals)
    before = held(state)
    new_storages = [
        array if _aval(array) == _aval(aval) else _stand_in(aval, sharding)
        for array, aval in zip(before[1], new_types, strict=True)
    ]
    extra = [_stand_in(aval, sharding) for aval in extra_types]
    layout = jitted._layout
    try:
        _write_state(state, info, new_storages, extra, _write_plan(state, info))
        jitted._layout = None
        return _compile_ahead(jitted, args, kwargs, True)
    finally:
        with _HeldInterrupts():  # (a Ctrl-C arriving here waits until all is put back)
            put_back(state, before)
            # (the layout the steady trace found, and its arrays, hold stand-ins)
            jitted._layout = layout
            jitted._last_state = None


def _aval(x: Any) -> tuple:
    return (tuple(x.shape), x.dtype, bool(getattr(x, "weak_type", False)))


def _stand_in(aval: Any, sharding: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type, sharding=sharding)
