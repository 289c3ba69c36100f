"""``torchlax.jit``'s first call of a step that creates state: compiled, and the next call's
program compiled ahead.

A training step's first call finds state missing that the step itself creates: the
optimizers' entries (``exp_avg``, ``exp_avg_sq``, ``step``, momentum buffers, ...) and the
``.grad``s its ``backward()`` fills. That call is traced and compiled like any other (no eager
pass over the model): what the step creates comes out of the program (``_NEW`` slots of
``_Info``) and is written into the very objects that name it, so from then on it is state,
an input of the program. The state after that call has another structure than before it
(entries that were missing are there), so the steady step is another program: it is traced
and compiled, not run, before the first call returns (``_Jitted._compile_only``), so the
second and later calls compile nothing. Ops that the first trace runs on concrete values (a
step count PyTorch creates with ``torch.tensor(0.0)`` and increments) compile nothing in the
op cache: they run once.

The one first call that runs eagerly is one whose trace fails (``first_call``: refused, or
reading a value on the host, as Rprop's state creation does): PyTorch runs it once, as
before, and the next call traces the steady step.
"""

from __future__ import annotations

from typing import Any

import jax
import torchlax_core
from torchlax_core import JitError
from torchlax_core.internal import Entry, get_logger, op_cache_compiling_nothing

from ._discover import _move_cpu_state_to_jax as move_cpu_state_to_jax

_log = get_logger("jit")

# ``_Jitted._call`` returns this instead of a result under ``_compile_only``.
COMPILED_ONLY = object()


def first_call(jitted: Any, state: Any, args: tuple, kwargs: dict) -> Any:
    """The first call of a step whose optimizers have no state yet (or parameters no
    ``.grad``): run compiled, then the next call's program compiled ahead.

    A first call whose trace is refused (a ``JitError``: the step writes a plain CPU tensor,
    gives a CPU leaf a ``.grad``, stores non-tensor optimizer state it changes, ...) or
    needs a value on the host (Rprop creates its ``step_size`` from ``lr.item()``: a
    ``RuntimeError`` under the trace) runs eagerly instead, once, as PyTorch runs it (the
    trace put back what it changed), and says so in a log line; the next call traces the
    steady step (and raises a refusal that still holds)."""
    with op_cache_compiling_nothing():
        try:
            out = jitted._call(args, kwargs)
        except (JitError, RuntimeError, jax.errors.ConcretizationTypeError) as error:
            _log.info(
                "%s: the first call runs eagerly, since its trace failed (%s: %s); the next "
                "call traces the steady step",
                _name(jitted),
                type(error).__name__,
                error,
            )
            return _eager_call(jitted, state, args, kwargs)
        compile_next(jitted, args, kwargs)
    return out


def _eager_call(jitted: Any, state: Any, args: tuple, kwargs: dict) -> Any:
    """The step run eagerly, with PyTorch's own code; step counts it creates are kept on the
    jax device, as the program keeps them."""
    groups = [
        (g, g["capturable"])
        for opt in state.optimizers
        for g in opt.param_groups
        if "capturable" in g
    ]
    for g, _ in groups:
        g["capturable"] = True
    try:
        with torchlax_core.enable(torchlax_core.current_env()):
            return jitted.target(*args, **kwargs)
    finally:
        for g, capturable in groups:
            g["capturable"] = capturable
        for opt in state.optimizers:
            move_cpu_state_to_jax(opt)


def _name(jitted: Any) -> str:
    target = jitted.target
    return f"torchlax.jit({getattr(target, '__qualname__', type(target).__name__)})"


def compile_next(jitted: Any, args: tuple, kwargs: dict) -> None:
    """Trace and compile the program a call with these arguments would run now, over the
    state the first call left, without running it.

    A failure here (the steady step's trace refused) is not the first call's: it is logged,
    and the next call, which traces the same program, raises it."""
    jitted._compile_only = True
    try:
        jitted._call(args, kwargs)
    except Exception as error:  # noqa: BLE001  (raised again by the next call's own trace)
        _log.info(
            "torchlax.jit: the steady step's program was not compiled ahead of its first "
            "call (%s: %s); the next call traces it",
            type(error).__name__,
            error,
        )
    finally:
        jitted._compile_only = False


def compile_only(entry: Entry) -> object:
    """What ``_Jitted._call`` does instead of launching ``entry`` under ``_compile_only``."""
    entry.executable  # noqa: B018  (compiles it)
    return COMPILED_ONLY
