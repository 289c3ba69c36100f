"""``torchlax.jit``'s call plans (the core's ``CallPlan``), ``_StepPlan`` for a training step and
``_ForwardPlan`` for a forward, and the write-back of a call's new state into its objects.

Every general call (``_call``) ends in its entry's plan (``run_general``); one the next call may
repeat is kept in ``_Jitted._last``, and a repeated call is "the last plan's guard still holds"
(``_JitPlan.call``, one guard for both plans: jit's checks beside ``CallPlan.miss``;
``_MISSED`` where one fails). Launch and write-back are ``CallPlan.run``'s, all or nothing
(docs/architecture.md, "A repeated call")."""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from itertools import chain
from operator import is_
from typing import TYPE_CHECKING, Any

import jax.numpy as jnp
import torch
import torchlax_core
from torchlax_core import Tensor
from torchlax_core.internal import (
    CallPlan,
    CompiledProgram,
    ResultWrappers,
    donatable,
    is_root_of,
    result_specs,
    root_values,
    storage_getter,
    view_getter,
    wrap_results_like,
    write_back,
    x64,
)

from ._autograd import differentiable_call, eager_call
from ._outputs import _returned, _to_tensors
from ._program import _KEPT, _NEW, _NONE, _Info, _params
from ._state import (
    _GRAD,
    _NO_TORCH_FUNCTION,
    _REQUIRES_GRAD,
    _Layout,
    _StateSet,
    mapping_get,
)
from ._watch import ReadConstants

if TYPE_CHECKING:
    from ._call import _Jitted, _Run


_MISSED = object()  # a plan's call: this call is no repeat (take the general path)
_ARRAY = operator.attrgetter("array")
_EXCLUSIVE = operator.attrgetter("exclusive")
_IS_CONTIGUOUS = operator.methodcaller("is_contiguous")


class _JitPlan(CallPlan):
    """A plan of jit's: the layout and entry it was made for, its run on the general path
    (``run_general``) and, once ``record`` made it the last plan, its guard (``call``).

    The guard holds where the call's grad mode, checked mode and argument types are the
    recorded ones, each state storage holds the array the last call left (``state_arrays``),
    the core's ``CallPlan.miss`` and the constants read hold, and so does the plan's own
    check of the state's objects (``holds``); the outputs are wrapped by their
    ``result_specs`` (``out_specs``; None: the general way)."""

    __slots__ = (
        *("layout", "info", "constants", "types", "expected", "grad_enabled", "checks"),
        *("storages", "state_arrays", "holds", "out_specs", "single"),
    )

    early = False  # whether a repeat launches before ``holds`` is asked (``_ForwardPlan``)
    storages: Sequence  # (set by record)
    state_arrays: list
    holds: Callable[[], bool]

    def __init__(self, program: CompiledProgram, run: _Run, donated: int = 0):
        avals = [getattr(a, "aval", None) for a in run.arrays]
        super().__init__(program, run.entry, run.signature[1], avals, (), donated)
        self.layout: _Layout = run.layout
        self.info: _Info = run.entry.info
        self.constants: ReadConstants | None = self.info.constants
        self.types: tuple = ()
        self.out_specs: list | None = None

    def _general_result(
        self, jitted: _Jitted, run: Any, out_arrays: Any, repeats: bool, outputs: Any = None
    ) -> Any:
        """A general call's result (``outputs``, else made of ``out_arrays``); this plan recorded
        as the last one where the next call may repeat it (``repeats``)."""
        info = self.info
        if outputs is None:
            outputs = _to_tensors(out_arrays, run.on_jax, run.arrays, info.out_orders)
        if repeats:
            plain = not info.out_orders and all(map(is_root_of, outputs, out_arrays))
            self.out_specs = result_specs(outputs, out_arrays) if plain else None
            jitted._last.plan = self.record(run)  # pyright: ignore[reportPrivateUsage]  (its own module)
        if jitted._cpu_outputs and info.rebuilds:  # pyright: ignore[reportPrivateUsage]  (its own module)
            # A call over lent CPU state returns CPU tensors: those inside returned objects are
            # put in place as such (the caller converts the leaves).
            outputs = [o.cpu() if isinstance(o, torch.Tensor) else o for o in outputs]
        return _returned(info, outputs)

    def record(self, run: _Run) -> _JitPlan:
        """This plan, made the last one after ``run`` ran it: what its guard compares (a
        subclass sets ``holds``)."""
        types = self.types = tuple(map(type, run.inputs))
        self.expected = (*types, *(None,) * len(types))  # (call()'s first pass: no view)
        self.grad_enabled, self.checks = torch.is_grad_enabled(), run.checks
        self.storages = tuple(run.state.storages)
        self.state_arrays = list(map(_ARRAY, self.storages))
        specs = self.out_specs
        self.single = (  # the result's tensors of a function returning one tensor, made ahead
            ResultWrappers(specs[0]) if specs is not None and self.info.single_output else None
        )
        return self

    def call(self, jitted: _Jitted, args: tuple) -> Any:
        """The call's result, or ``_MISSED`` where the guard fails (nothing changed). In the
        order a call's cost after an XLA computation dictates (docs/architecture.md, "A
        repeated call"): what launching needs first, a forward's launch (``early``), then the
        rest while XLA computes. Outside ``x64()``, which a launch does not read (a view
        argument's value and a checked launch switch it on)."""
        if torch.is_grad_enabled() is not self.grad_enabled or len(args) != len(self.types):
            return _MISSED
        storages, state_arrays = self.storages, self.state_arrays
        if all(
            map(
                is_,
                chain(map(type, args), map(view_getter, args), map(_ARRAY, storages)),
                chain(self.expected, state_arrays),
            )
        ):  # the recorded types, no view (roots are row-major), the recorded state arrays
            arrays = root_values(args)
        elif tuple(map(type, args)) != self.types or not all(
            map(is_, map(_ARRAY, storages), state_arrays)
        ):
            return _MISSED  # (an array a training step donated since is deleted: never launched)
        elif not all(map(_IS_CONTIGUOUS, args)):
            return _MISSED  # (a view the first pass met, not contiguous: x.t(), another program)
        else:
            with x64():  # (a view's value)
                arrays = [t.jax() for t in args]
        constants = self.constants
        if self.miss(arrays) is not None or (constants is not None and not constants.hold()):
            return _MISSED  # (stale: traced under another matmul precision; a constant changed)
        plain = self.plain if self.early else None
        out_arrays: Any = None
        if plain is not None:
            # (not launch(), whose fallback would run a call that then misses: a launch that
            # raises has done nothing, and the general path handles or raises it)
            try:
                out_arrays = plain[0](state_arrays, [], arrays, plain[1])[0]
            except Exception:
                return _MISSED
        if (
            jitted._layout is not self.layout  # pyright: ignore[reportPrivateUsage]  (its own module)
            or bool(torchlax_core.current_env().config.checked) is not self.checks
            or not self.holds()
            or (self.info.trains and any(map(_REQUIRES_GRAD, args)))  # (the general path refuses)
        ):
            return _MISSED
        if plain is None:
            out_arrays = self.repeat(arrays)
        single = self.single
        if single is not None:
            return single.wrap(out_arrays[0])
        info = self.info
        if self.out_specs is None:
            return _returned(info, _to_tensors(out_arrays, True, arrays, info.out_orders))
        return _returned(info, wrap_results_like(out_arrays, self.out_specs))

    def repeat(self, arrays: list) -> Any:
        """A repeated call's output arrays, launched on its arguments' ``arrays``."""
        raise NotImplementedError


class _ForwardPlan(_JitPlan):
    """The plan of a forward's entry (a call that changes no state, buffers aside): every
    general forward (``run_general``: autograd's, ``_autograd``, or a launch), and the repeat
    of a ``torch.no_grad()`` forward over tensor arguments that writes nothing, launched before
    the layout's guard is asked (``early``: docs/architecture.md, "A repeated call")."""

    __slots__ = ()

    early = True

    def __init__(self, run: _Run):
        super().__init__(run.program.forward_core, run)
        self.fits = True  # (recorded after its entry ran on the general path: it fits the device)
        self.atomic = bool(self.info.writes)

    def run_general(self, jitted: _Jitted, run: Any) -> Any:
        """The general path's forward (``run``: its ``_Run``)."""
        state, info = run.state, self.info
        mask = run.grad_mask()
        if mask is not None:
            if info.eager_backward:
                return eager_call(jitted, run)
            out_arrays, repeats, outputs = None, False, differentiable_call(self, run, mask)
        else:
            call_args = (run.state_arrays, run.lr_arrays, run.arrays)
            results = self.launched(state, lambda: self.program.run(self.entry, *call_args))
            out_arrays, outputs = results[0], None
            repeats = (
                not info.writes
                and not state.lrs
                and not torch.is_grad_enabled()
                and run.repeatable()
                and self.layout.reused(state)
            )
        _step_schedulers(state, info, [0] * len(state.schedulers))
        return self._general_result(jitted, run, out_arrays, repeats, outputs)

    def launched(self, state: _StateSet, launch: Callable[[], Any]) -> Any:
        """``launch()``'s results, the buffers they change written back into ``state`` all or
        nothing (the launch donates nothing: interrupted, it changed nothing)."""
        results = launch()
        if not self.info.writes:
            return results
        return self.run((state,), (), lambda: results)

    def write_back(self, args: Sequence, results: Any) -> None:
        """The buffers the forward changed (``args``: the call's state)."""
        _write_changed(args[0], self.info, results[1], results[2])

    def record(self, run: _Run) -> _ForwardPlan:
        super().record(run)
        if self.plain is None:  # (launched now: its C++ launcher may be known)
            self.plain = self.entry.plain_launch()
        self.holds = self.layout.forward_guard(run.state)  # (its state reused, no .grads)
        return self

    def repeat(self, arrays: list) -> Any:
        return self.launch((self.state_arrays, [], arrays))[0]


class _StepPlan(_JitPlan):
    """The plan of a training step's entry (the donating program): launch and write-back
    (``step``) of every step, and the repeat over the same state objects (``holds``: the
    layout's guard, each ``.grad`` and optimizer state value the very object the last call
    left; never in checked mode)."""

    __slots__ = ("write_plan", "state", "grads", "values")

    def __init__(self, run: _Run, donate: bool):
        super().__init__(run.program.core, run, len(run.state_arrays) if donate else 0)
        self.write_plan = _write_plan(run.state, self.info)  # holds while the layout does
        self.atomic = True  # (also where it donates nothing: donate_state=False)

    def run_general(self, jitted: _Jitted, run: Any) -> Any:
        """The general path's step (``run``: its ``_Run``)."""
        state = run.state
        out_arrays = self.step(state, (run.state_arrays, run.lr_arrays, run.arrays))
        repeats = (
            not run.checks
            and not jitted._cpu_outputs  # pyright: ignore[reportPrivateUsage]  (its own module)
            and run.repeatable()
            and _next_state_is(self.layout, state)
        )
        return self._general_result(jitted, run, out_arrays, repeats)

    def step(self, state: _StateSet, call_args: tuple) -> Any:
        """Run the entry on ``call_args`` into ``state``'s objects, all or nothing; the output
        arrays. (The ``.grad``s the step discards unread are no inputs: the write-back replaces
        them.)"""
        if self.donated and not all(map(_EXCLUSIVE, state.storages)):
            # (each storage exclusive: its array a program's result no one else has seen, in
            # no other storage: donated as it is, as donatable would)
            exclusive = list(map(_EXCLUSIVE, state.storages))
            call_args = (donatable(call_args[0], exclusive), *call_args[1:])
        args = (state, [0] * len(state.schedulers))
        with x64():  # the learning rates are numpy scalars: float64 ones stay float64
            return self.run(args, call_args)[0]

    def write_back(self, args: Sequence, results: Any) -> None:
        """The run's new state written, what it left remembered for the next call's guard, the
        schedulers' deferred ``step()``s made (``args``: ``step``'s). Idempotent."""
        state, stepped = args[:2]
        new_storages = results[1]
        grads = _write_state(
            state, self.info, new_storages, results[2], self.write_plan, bool(self.donated)
        )
        self._remember(new_storages, grads)  # (what _write_state put in the storages)
        _step_schedulers(state, self.info, stepped)

    def _remember(self, written: list, grads: list) -> None:
        # what the call left, re-checked by identity on the next
        self.state_arrays = written
        self.grads: list = grads
        self.values = list(chain.from_iterable(map(dict.values, self.layout.entry_dicts)))

    def record(self, run: _Run) -> _StepPlan:
        super().record(run)
        state = self.state = run.state
        self._remember(self.state_arrays, list(map(_GRAD, state.grads)))
        grads, dicts = state.grads, self.layout.entry_dicts

        def live() -> tuple:  # each .grad and optimizer state value; what the last call left
            now = chain(map(_GRAD, grads), chain.from_iterable(map(dict.values, dicts)))
            return now, chain(self.grads, self.values)

        # (the arguments hold no state: all tensors, as recorded.) An optimizer state tensor is
        # still one where it is the very one the last write-back left, unless that may be None.
        typed = any(kind == _NONE for _, _, kind, _ in self.write_plan[1])
        self.holds = self.layout.forward_guard(None, live, typed)
        return self

    def repeat(self, arrays: list) -> Any:
        call_args = (self.state_arrays, lr_arrays(self.layout), arrays)
        return self.step(self.state, call_args)


def lr_arrays(layout: _Layout) -> list:
    """Each learning rate that is an input of the program, as the program takes it (a numpy
    scalar of its group's ``_state._lr_type``), read now."""
    return [to(group["lr"]) for group, to in zip(layout.lr_groups, layout.lr_types, strict=True)]


def _step_schedulers(state: _StateSet, info: _Info, stepped: list[int]) -> None:
    """The schedulers' deferred ``step()``s not yet made (``stepped`` counts those made)."""
    for i, (scheduler, count) in enumerate(
        zip(state.schedulers, info.scheduler_steps, strict=True)
    ):
        while stepped[i] < count:
            # One statement: an interruption lands before the step or after its count.
            stepped[i] += 1 if scheduler.step() is None else 1


def _next_state_is(layout: _Layout, state: _StateSet) -> bool:
    """Whether the next call, if nothing changes meanwhile, runs this program over the same
    storages (not after a step that created state, or replaced a tensor it reads)."""
    after = layout.assemble()
    if after.structure != state.structure:
        return False
    if state.dead_grads:
        after = after.without_grads(state.dead_grads)
    return _same_objects(after.storages, state.storages)


def _same_objects(now: list, then: list) -> bool:
    return len(now) == len(then) and all(map(is_, now, then))


def _write_state(
    state: _StateSet, info: _Info, new_storages, extra, plan: list, fresh: bool = False
) -> list:
    """Put one call's new state into its objects (``plan``: ``_write_plan``); the ``.grad`` it
    leaves on each of ``state.grads``. ``fresh``: the arrays are a donating program's own
    results, held by no one else, so their storages are marked exclusive."""
    for storage, array in zip(state.storages, new_storages, strict=True):
        storage.array = array  # changed, or donated: the program's output is the live array
        if fresh:
            storage.exclusive = True
    owners = state.owners
    made = _new_tensors(extra, plan[3], fresh)
    grads = []
    with _NO_TORCH_FUNCTION():  # (torch's look for an override, on each .grad read and set)
        for p, kind, index in plan[0]:
            if kind == _NEW:
                grad = p.grad = made[index]  # (a new tensor: no need to read whether p holds it)
            else:
                grad = None if kind == _NONE else owners[index]
                if p.grad is not grad:  # the setter's checks cost more than this test
                    p.grad = grad
            grads.append(grad)
    dicts, names, kept, get = plan[2]
    if not all(map(is_, map(get, dicts, names), map(owners.__getitem__, kept))):
        for values, name, index in zip(dicts, names, kept, strict=True):
            if values.get(name) is not owners[index]:
                values[name] = owners[index]
    for values, name, kind, index in plan[1]:
        value = None if kind == _NONE else made[index]
        if values.get(name) is not value:
            values[name] = value
    _write_cpu_buffers(state, info, extra)
    return grads


def _write_plan(state: _StateSet, info: _Info) -> list:
    """Where ``_write_state`` puts each ``.grad`` and optimizer state value (valid while the
    layout holds): ``[(param, kind, index)]``, ``[(state dict, name, kind, index)]`` of the
    entries that become ``None`` or new tensors, and ``(dicts, names, indices, get)`` of those
    that keep the owner at each index (flat: checked in one C-level pass); and
    ``[positions, None]`` of the extra results that become new tensors (``_new_tensors``)."""

    slots = iter(info.slots)
    grads = [(p, *next(slots)) for p in state.grads]
    entries = []
    for opt, names in zip(state.optimizers, info.entry_names, strict=True):
        for p, row in zip(_params(opt), names, strict=True):
            entries.extend((opt.state[p], name, *next(slots)) for name in row)
    kept = [(values, name, index) for values, name, kind, index in entries if kind == _KEPT]
    others = [entry for entry in entries if entry[2] != _KEPT]
    dicts = tuple(values for values, _, _ in kept)
    flat_kept = (
        dicts,
        tuple(name for _, name, _ in kept),
        tuple(index for _, _, index in kept),
        # (an optimizer keeping its state in another mapping type: that type's get)
        dict.get if all(isinstance(d, dict) for d in dicts) else mapping_get,
    )
    made = [i for _, kind, i in grads if kind == _NEW]
    made += [i for *_, kind, i in others if kind == _NEW]
    return [grads, others, flat_kept, [made, None]]


def _new_tensors(extra: list, made: list, fresh: bool) -> dict:
    """The extra results at positions ``made[0]`` (new ``.grad``s and optimizer state values)
    as new torchlax Tensors, by position; made by what the first ones gave (``made[1]``:
    ``result_specs``), without reading each array's shape, dtype and device again (half
    what a tensor costs, for each ``.grad`` of every step); marked exclusive where
    ``fresh``."""
    at, specs = made
    arrays = [extra[i] for i in at]
    if specs is None:
        tensors = [Tensor(a) for a in arrays]
        made[1] = result_specs(tensors, arrays)
    else:
        tensors = wrap_results_like(arrays, specs)
    if fresh:
        for storage in map(storage_getter, tensors):
            storage.exclusive = True  # (new roots: set_exclusive)
    return dict(zip(at, tensors))


def _write_changed(state: _StateSet, info: _Info, new_storages, extra) -> None:
    """A forward's new state: the storages it changed (buffers) and CPU module buffers."""
    for storage, array, changed in zip(state.storages, new_storages, info.changed, strict=True):
        if changed:  # BatchNorm's running statistics
            storage.array = array
    _write_cpu_buffers(state, info, extra)


def _write_cpu_buffers(state: _StateSet, info: _Info, extra) -> None:
    if not state.cpu_tensors:
        return
    cpu_new = iter(extra[len(extra) - sum(info.cpu_changed) :])
    for t, changed in zip(state.cpu_tensors.values(), info.cpu_changed, strict=True):
        if changed:
            write_back(t, jnp.array(next(cpu_new), copy=True))
