"""A compiled call's plan (guard, launch, write-back) and a call site's last plan.

A caller of a ``CompiledProgram`` (the ``torch.compile`` backend; ``torchlax.jit``) works a
call out once per signature, as a ``CallPlan``: the program's entry for that signature, what
its guard compares, how many of the caller's tensors the launch donates, and what the caller
makes of the results. A later call that the plan's guard accepts runs the plan and nothing
else: no signature is built, no entry looked up, no result layout worked out again.

- **Guard** (``CallPlan.miss``): None where a call may take the plan, else why not (a
  ``MISS_*`` reason). It holds while the entry is not stale (the float32 matmul precision its
  trace read is still the mode: ``Entry.stale``), the call's static values equal the plan's,
  and its arrays have the plan's shapes, dtypes and weak types: their avals compared by
  identity first (JAX hands every result of one executable the same aval object, and a
  repeated step's inputs are the last step's results), then by ``signature``. A caller with
  more to check (its state objects, a module layout) checks that beside it.
- **Launch** (``CallPlan.launch``): before the first, XLA's memory estimate against the
  device (``refuse_if_too_large``: a program that can never fit is refused before it was given
  anything); then JAX's C++ launcher with the constant key (``Entry.plain_launch``) where the
  entry allows it, else ``CompiledProgram.run`` (a fresh key, checks, its fallbacks). XLA's
  refusal of a run becomes a ``ProgramFailedError`` naming the program and how many tensors
  were donated to it.
- **Write-back** (``CallPlan.commit``): a plan's first ``CHECKED_RUNS`` runs are waited for
  (``failure_of``) before anything is written, so arrays of a run that failed never become
  parameters or optimizer state; later runs of the same executable on the same shapes are
  trusted (the wait ends the overlap of Python's next call with XLA's run). Then
  ``finish(args, results)`` (the caller's: its outputs and ``write_back``); a launched run's
  results are written back whole even where an exception or interrupt arrives meanwhile,
  since the donated arrays are gone.
- ``CallPlan.run``: launch and commit, all or nothing where the plan is ``atomic`` (it
  donates, or its caller says so): under the state lock (``_state_lock``), so that a reader on
  another thread waits for the write-back instead of failing on a donated array, and with a
  Ctrl-C held until the write-back is done (``HeldInterrupts``). Before the launch nothing has
  changed but what the caller's ``prepare`` did, which ``undo`` puts back; once it has
  returned, the write-back is finished whatever happens. The caller's state holds the values
  before the call or those after it.

``LastPlan`` keeps a call site's last plan: ``get`` returns it while its guard holds (a
repeated call is "the last plan's guard still holds"), else looks the entry up by the call's
signature and makes a new plan. A caller subclasses ``CallPlan`` for what it keeps per
signature (output layout, which tensors the program writes) and overrides ``finish`` and
``write_back``.
"""

from __future__ import annotations

import importlib
import operator
import threading
from collections.abc import Callable, Sequence
from operator import is_
from typing import Any

import jax
import jax.core

from ._compiled import CompiledProgram, Entry, signature, write_back_all
from ._launch_check import failure_of, launch_error, refuse_if_too_large
from ._state_lock import state_lock
from ._x64 import x64, x64_flag

#: Why a call cannot take a plan (``CallPlan.miss``).
MISS_STALE = "the float32 matmul precision changed since the entry was traced"
MISS_STATICS = "the static values differ"
MISS_SIGNATURE = "the arrays' shapes, dtypes or weak types differ"

#: A plan's first runs, waited for before their results are written back (``commit``).
CHECKED_RUNS = 3

_aval = operator.attrgetter("aval")

# The C module behind ``signal`` (no stubs): its getsignal/signal cost ~0.3 us a call against
# tens of us of ``signal``'s (which convert handlers to and from enums), on every step's call.
_signal: Any = importlib.import_module("_signal")
_main_thread = threading.main_thread()
_SIGINT = 2


class HeldInterrupts:
    """Holds SIGINT while entered (on the main thread, where Python runs signal handlers) and
    delivers it on exit, to the handler that was installed before."""

    __slots__ = ("_previous", "_caught")

    def __enter__(self) -> HeldInterrupts:
        self._caught: tuple | None = None
        self._previous = None
        if threading.current_thread() is _main_thread:
            previous = _signal.getsignal(_SIGINT)
            if callable(previous):  # (SIG_IGN / SIG_DFL, or a handler set from C: left alone)
                self._previous = previous
                _signal.signal(_SIGINT, self._catch)
        return self

    def _catch(self, signum, frame) -> None:
        self._caught = (signum, frame)

    def __exit__(self, *exc_info) -> None:
        previous = self._previous
        if previous is None:
            return
        _signal.signal(_SIGINT, previous)
        caught = self._caught
        if caught is not None:
            previous(*caught)  # Python's default handler raises KeyboardInterrupt here


class CallPlan:
    """How calls of one signature of ``program`` run: guard, launch, write-back.

    ``entry``: the program's entry for the signature; ``sig`` (``signature(arrays)``) and
    ``avals`` (the arrays' avals) describe the arrays the guard accepts, ``statics`` the static
    values; ``donated``: how many of the caller's tensors a launch consumes (named in errors;
    ``atomic``: whether ``run`` is all or nothing (from ``donated``; a caller that writes
    state of its own sets it). ``written``: the
    positions in ``run``'s ``args`` of the torchlax Tensors the program updates, taking the
    results at ``written_results``, each marking its storage exclusive where
    ``written_exclusive`` says so (``write_back_all``).
    """

    __slots__ = (
        "program",
        "entry",
        "sig",
        "avals",
        "statics",
        "donated",
        "atomic",
        "written",
        "written_results",
        "written_exclusive",
        "plain",
        "fits",
        "checked",
        "_runs",
    )

    def __init__(
        self,
        program: CompiledProgram,
        entry: Entry,
        sig: tuple,
        avals: Sequence,
        statics: Any = (),
        donated: int = 0,
    ):
        self.program = program
        self.entry = entry
        self.sig = sig
        self.avals = list(avals)
        self.statics = statics
        self.donated = donated
        self.atomic = bool(donated)
        self.written: tuple[int, ...] = ()
        self.written_results: tuple[int, ...] = ()
        self.written_exclusive: tuple[bool, ...] = ()
        # Entry.plain_launch: (JAX's C++ launcher, the constant key), or None: launch through
        # CompiledProgram.run (a random or checked entry, or one not launched yet).
        self.plain: tuple[Callable, Any] | None = entry.plain_launch()
        self._runs = 0  # launches through run() that looked for the plain launcher after them
        # Whether XLA's memory estimate was checked against the device (before the first launch)
        self.fits = False
        self.checked = 0  # runs seen to succeed (commit)

    # -- guard ------------------------------------------------------------------------------

    def miss(self, arrays: Sequence[jax.Array], statics: Any = ()) -> str | None:
        """None where a call with ``arrays`` and ``statics`` may take this plan, else why not."""
        if self.entry.stale():
            return MISS_STALE
        if statics != self.statics:
            return MISS_STATICS
        avals = self.avals
        if (
            len(arrays) != len(avals) or not all(map(is_, map(_aval, arrays), avals))
        ) and signature(arrays) != self.sig:
            return MISS_SIGNATURE
        return None

    # -- launch -----------------------------------------------------------------------------

    def launch(self, call_args: tuple) -> Any:
        """The program's results on ``call_args`` (what ``CompiledProgram.run(entry,
        *call_args)`` returns), launched; nothing written back yet."""
        if not self.fits:  # a program that cannot fit is refused before it donates anything
            self.refuse_if_too_large(call_args)
            self.fits = True
        plain = self.plain
        if plain is not None:
            # What run() does for an entry that draws no key and checks nothing. A launch
            # that raises has done nothing; run() then handles or raises it.
            try:
                return plain[0](*call_args, plain[1])
            except jax.errors.JaxRuntimeError as exc:  # XLA refused the run: no fallback
                raise launch_error(exc, self.program.name, self.donated) from exc
            except Exception:
                self.plain = None
        # A fresh key per call from torch's generator where the entry draws keys:
        # reproducible under torch.manual_seed.
        try:
            if x64_flag.value:
                results = self.program.run(self.entry, *call_args)
            else:
                with x64():
                    results = self.program.run(self.entry, *call_args)
        except jax.errors.JaxRuntimeError as exc:
            raise launch_error(exc, self.program.name, self.donated) from exc
        if self.plain is None and self._runs < 2:
            self._runs += 1
            self.plain = self.entry.plain_launch()
        return results

    def refuse_if_too_large(self, call_args: tuple) -> None:
        """Raise ``ProgramOutOfMemoryError`` where XLA's estimate of the entry's executable
        exceeds the device of ``call_args``."""
        arrays = jax.tree.leaves(call_args)
        if arrays and isinstance(arrays[0], jax.core.Tracer):
            return  # inlined into a JAX trace (call_torch under jax.jit): the outer program runs
        device = next(iter(arrays[0].devices())) if arrays else jax.devices()[0]
        refuse_if_too_large(self.entry.executable, self.program.name, device)

    # -- write-back -------------------------------------------------------------------------

    def commit(self, args: Sequence, results: Any) -> Any:
        """``finish(args, results)`` once the run is known to have succeeded (its first
        ``CHECKED_RUNS`` runs; later ones are trusted). XLA reports a failed run (out of
        memory allocating its temporaries) only when a result is waited for, and arrays that
        raise on every read must not become parameters, ``.grad``s or optimizer state.

        Interrupted (Ctrl-C lands between any two bytecodes) while waiting, while the outputs
        are made or the state written: the run was launched (its donated inputs are gone), so
        its results are written back whole (again: ``write_back`` is idempotent) before the
        interrupt goes on."""
        failure = None
        try:
            if self.checked < CHECKED_RUNS:
                failure = failure_of(results, self.program.name, self.donated)
                self.checked += failure is None
            if failure is None:
                return self.finish(args, results)
        except BaseException:
            self.write_back(args, results)
            raise
        raise failure

    def finish(self, args: Sequence, results: Any) -> Any:
        """The call's return value from the run's ``results``, after ``write_back``. This
        one returns the results as they are; a caller's plan makes its outputs."""
        self.write_back(args, results)
        return results

    def write_back(self, args: Sequence, results: Any) -> None:
        """The tensors the program updated take the run's new values (safe to run twice)."""
        if self.written:
            write_back_all(
                [args[p] for p in self.written],
                [results[i] for i in self.written_results],
                self.written_exclusive,
            )

    def prepare(self, args: Sequence) -> None:
        """What the caller changes before the launch (``undo`` puts it back)."""

    def undo(self, args: Sequence) -> None:
        """Put back what ``prepare`` changed, where the launch did not happen."""

    # -- the whole call ---------------------------------------------------------------------

    def run(self, args: Sequence, call_args: tuple, launch: Callable[[], Any] | None = None):
        """Launch on ``call_args`` (or ``launch()``: the caller's own launch) and commit into
        ``args`` (the caller's tensors or state), all or nothing where the plan is atomic."""
        if not self.atomic:
            return self.commit(args, self._launched(args, call_args, launch))
        # From the launch (which deletes the donated arrays) to the write-back: an eager op
        # on another thread that took one of them waits for this and runs again.
        with state_lock, HeldInterrupts():
            return self.commit(args, self._launched(args, call_args, launch))

    def _launched(self, args: Sequence, call_args: tuple, launch: Callable[[], Any] | None):
        try:
            self.prepare(args)
            return self.launch(call_args) if launch is None else launch()
        except BaseException:
            self.undo(args)  # (nothing launched: the call changed nothing else)
            raise


class LastPlan:
    """A call site's last plan: ``get`` returns it while its guard holds, else a new one.

    ``make(entry, sig, avals, statics)`` makes the plan for a new signature (a ``CallPlan``
    subclass's constructor with the caller's arguments bound); its entry is the program's for
    ``(statics, signature(arrays))``, traced with ``call_args`` and ``statics`` if new.

    A caller that looks its entries up by keys of its own (``torchlax.jit``: by the state's
    and the inputs' signatures, over several programs) makes one without ``program`` and
    ``make``, sets ``plan`` on its general path, and on a repeated call asks that plan's
    guard (``miss``) beside its own checks; it clears ``plan`` when they fail."""

    __slots__ = ("program", "make", "plan")

    def __init__(
        self,
        program: CompiledProgram | None = None,
        make: Callable[..., CallPlan] | None = None,
    ):
        self.program = program
        self.make = make
        self.plan: Any = None  # the last call's plan (the caller's CallPlan subclass)

    def get(self, arrays: Sequence[jax.Array], statics: Any, call_args: tuple) -> Any:
        """The plan for a call with ``arrays`` (in the order the signature lists them),
        ``statics`` and ``call_args`` (the program's arguments)."""
        plan = self.plan
        if plan is not None and plan.miss(arrays, statics) is None:
            return plan
        program, make = self.program, self.make
        if program is None or make is None:
            raise TypeError("LastPlan.get needs the program and make it was not given")
        avals = list(map(_aval, arrays))
        sig = signature(arrays)
        with x64():
            entry = program.entry((statics, sig), call_args, statics)
        plan = self.plan = make(entry, sig, avals, statics)
        return plan
