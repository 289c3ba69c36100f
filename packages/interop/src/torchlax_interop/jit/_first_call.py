"""``torchlax.jit``'s first call of a step that creates state: its own program run, and the
steady step's compiled at once (docs/architecture.md, "``torchlax.jit``'s stages").

The state the step creates (optimizer entries, ``.grad``s) comes out of the first program;
the steady step is traced meanwhile over stand-ins of it (``jax.ShapeDtypeStruct``s), or after
the call where stand-ins cannot say what it will be, and the two compile in other threads. A
first trace that fails runs the call eagerly, logged.
"""

from __future__ import annotations

from typing import Any

import jax
from torchlax_core import JitError
from torchlax_core.internal import HeldInterrupts as _HeldInterrupts
from torchlax_core.internal import op_cache_compiling_nothing, signature

from ._program import _Held, _log
from ._refusals import _owner
from ._repeated import _write_plan, _write_state

# ``_compile_ahead``'s mode for the first call's own program (whose trace errors are the
# call's, and whose compilation shows a progress line on a terminal: one at a time)
FIRST = "first"


def first_call(jitted: Any, optimizers: list, args: tuple, kwargs: dict) -> Any:
    """The first call of a step whose optimizers have no state yet (or parameters no
    ``.grad``), compiled, the next call's program compiled by the time it returns; run eagerly
    where its trace is refused or reads a value on the host (Rprop's ``lr.item()``)."""
    with op_cache_compiling_nothing():
        try:
            first = _compile_ahead(jitted, args, kwargs, FIRST)
            steady = _steady_ahead(jitted, first, args, kwargs)
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
            return jitted._eager(args, kwargs, optimizers)
        if steady is None:  # (not ahead: traced over the state the call left)
            steady = _compile_ahead(jitted, args, kwargs, True)
        error = steady and steady.entry.wait_compiled()
        if error is not None:
            _not_ahead(error)
    return out


def _compile_ahead(jitted: Any, args: tuple, kwargs: dict, mode: object) -> Any:
    """The ``_Run`` of the program a call with these arguments would run now, traced and
    compiling in another thread, not run. ``mode`` FIRST: the first call's own program, whose
    trace errors are the call's; else the steady step's, whose errors are logged (None is
    returned) and raised by the next call, which traces it again."""
    try:
        run = jitted._prepared((args, kwargs), *jitted._layout_of(args, kwargs))
        run.entry.compile_ahead(progress=mode is FIRST)
        return run
    except Exception as error:
        if mode is FIRST:
            raise
        _not_ahead(error)
        return None


def _not_ahead(error: BaseException) -> None:
    _log.info(
        "torchlax.jit: the steady step's program was not compiled ahead of its first call "
        "(%s: %s); the next call, which needs it, raises that error where it still holds",
        type(error).__name__,
        error,
    )


def _steady_ahead(jitted: Any, first: Any, args: tuple, kwargs: dict) -> Any:
    """The steady step traced over the state ``first`` (the first call's ``_Run``) will leave,
    stand-ins for what it creates on the one device that holds every array of the call, and
    compiling; the state put back after. None where stand-ins cannot say what that state is:
    nothing trained, CPU state, several devices or sharded, no jaxpr kept (checked mode)."""
    state, info, entry = first.state, first.info, first.entry
    if not info.trains or jitted._cpu_outputs or first.cpu_tensors or entry.jaxpr is None:
        return None
    shardings = {getattr(a, "sharding", None) for a in (*first.state_arrays, *first.arrays)}
    sharding = shardings.pop() if len(shardings) == 1 else None
    if not isinstance(sharding, jax.sharding.SingleDeviceSharding):
        return None
    _, new_types, extra_types = jax.tree.unflatten(entry.out_tree, entry.jaxpr.out_avals)
    before = _Held(state)
    new_storages = [
        array if signature([array]) == signature([aval]) else _stand_in(aval, sharding)
        for (_, array), aval in zip(before.arrays, new_types, strict=True)
    ]
    extra = [_stand_in(aval, sharding) for aval in extra_types]
    layout = jitted._layout
    try:
        _write_state(state, info, new_storages, extra, _write_plan(state, info))
        jitted._layout = None
        return _compile_ahead(jitted, args, kwargs, True)
    finally:
        with _HeldInterrupts():  # (a Ctrl-C arriving here waits until all is put back)
            before.put_back()
            # (the layout the steady trace found, and its arrays, hold stand-ins)
            jitted._layout = layout


def _stand_in(aval: Any, sharding: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type, sharding=sharding)
