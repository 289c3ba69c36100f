"""The repeated-call path: a call that repeats the last one's program over the same state.

``_RepeatedForward`` (a ``torch.no_grad()`` forward) and ``_RepeatedStep`` (a training step)
check what the general path (``_call``) would find different, cheaply, and otherwise launch
the last call's entry at once: the last plan's guard still holds. Anything else returns
``_MISSED`` and the call takes the general path.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from itertools import chain
from operator import is_
from typing import TYPE_CHECKING

import torch
import torchlax_core
from torchlax_core.internal import (
    CompiledProgram,
    Entry,
    ResultWrappers,
    root_values,
    view_getter,
    wrap_results_like,
    x64,
)
from torchlax_core.internal import signature as _signature

from ._commit import launch_and_write
from ._constants import ReadConstants
from ._outputs import _returned, _to_tensors
from ._program import _distinct, _Info
from ._state import (
    _Hashed,
    _Layout,
    _StateSet,
)
from ._write_back import _write_state

if TYPE_CHECKING:
    from ._call import _Jitted


_MISSED = object()  # _RepeatedForward.call: this call is no repeat (take the general path)
_ARRAY = operator.attrgetter("array")
_AVAL = operator.attrgetter("aval")
_GRAD = operator.attrgetter("grad")
_REQUIRES_GRAD = operator.attrgetter("requires_grad")
_IS_CONTIGUOUS = operator.methodcaller("is_contiguous")


@dataclasses.dataclass(slots=True)
class _RepeatedForward:
    """A forward call (``torch.no_grad()``, tensor arguments only, nothing written back) that
    the next call may repeat: the same program entry over the same state.

    ``call`` checks what the general path would find different and otherwise runs the entry
    at once, without rebuilding the program key, the state's arrays and their signatures:
    the layout still holds (by its snapshot), its state is still the reused one (no
    ``.grad`` appeared), every state array is the very one of the recorded call (after an
    in-place write the general path compares the new array's shape and dtype once, and
    records the call again), and the arguments have the same types, shapes and dtypes (their
    avals by identity first: an executable's results, and arrays made alike, share one); grad
    mode and checked mode are as recorded. Its outputs are wrapped from the recorded call's
    (``wrap_results_like``: an executable's results have the same shapes, dtypes and
    sharding on every call), unless they are laid out otherwise or rebuilt into objects.

    Before the launch it checks only what launching needs, in one pass: the arguments'
    types, that none is a view, and that each state array is still the one recorded (a
    training step may have donated it since); then their avals. The launch calls the
    executable's C++ launcher directly (``Entry.plain_launch``). The rest (the layout, through
    ``_Layout.forward_guard``; checked mode) is checked after it, while XLA computes; a call
    they fail drops the results and takes the general path (the forward program writes
    nothing, so a dropped launch changes nothing), as does a launch that raises. A program
    that draws random keys, or runs in checked mode, is launched through
    ``CompiledProgram.run`` after every check (no key is drawn, no error raised for a call
    that then misses). A single output's tensor comes from ``ResultWrappers`` (made ahead, in
    batches).

    Its shape follows what a call costs after an XLA computation left the caches cold: how
    much code and data it touches, before the launch or after it (our Python competes with
    XLA's compute threads); the measurements behind it are in benchmarks/README.md ("the
    repeated forward touches less", "the repeated forward's checks are at their floor";
    ``benchmarks/jit_call_parts.py`` times the call's parts)."""

    layout: _Layout
    state: _StateSet
    types: tuple  # of the arguments
    input_signature: tuple
    avals: tuple  # of the recorded call's argument arrays (None where one has none)
    checks: bool
    core: CompiledProgram
    entry: Entry
    info: _Info
    # result_specs of the recorded call's outputs (root torchlax Tensors in the program's
    # order), or None: wrap each call's outputs the general way (_to_tensors)
    out_specs: list | None
    storages: tuple = dataclasses.field(init=False)
    state_arrays: list = dataclasses.field(init=False)
    holds: Callable[[], bool] = dataclasses.field(init=False)  # the layout's forward_guard
    # Entry.plain_launch: (JAX's C++ launcher, the key input), or None: launch through
    # core.run after every check
    plain: tuple | None = dataclasses.field(init=False)
    # the result's tensors of a function returning one tensor, made ahead, else None
    single: ResultWrappers | None = dataclasses.field(init=False)
    # what call() reads before the launch, in one pass: the arguments' types, their _view
    # (None: no view), each state storage's array
    expected: tuple = dataclasses.field(init=False)
    constants: ReadConstants | None = dataclasses.field(init=False)  # info.constants

    def __post_init__(self):
        self.storages = tuple(self.state.storages)
        self.state_arrays = list(map(_ARRAY, self.storages))
        self.expected = (*self.types, *(None,) * len(self.types), *self.state_arrays)
        self.constants = self.info.constants
        self.holds = self.layout.forward_guard(self.state)
        self.plain = None if self.checks else self.entry.plain_launch()
        specs = self.out_specs
        self.single = (
            ResultWrappers(specs[0]) if specs is not None and self.info.single_output else None
        )

    def call(self, jitted: _Jitted, args: tuple):
        """The call's result, or ``_MISSED``. It runs outside JAX's 64-bit mode (``__call__``
        switches it on for the general path only): nothing here dispatches a JAX op but the
        launch of a compiled executable, which does not read the mode (its input types are
        fixed); a view argument's value, which is a JAX op, is read inside ``x64()``, and a
        call in checked mode (reading its errors) runs inside it whole."""
        if torch.is_grad_enabled() or len(args) != len(self.types) or self.entry.stale():
            return _MISSED  # (stale: traced under another float32 matmul precision)
        if all(
            map(
                is_,
                chain(map(type, args), map(view_getter, args), map(_ARRAY, self.storages)),
                self.expected,
            )
        ):  # the recorded types, no view (roots are row-major), the recorded state arrays
            arrays = root_values(args)
        else:
            arrays = self._view_arrays(args)
            if arrays is None:
                return _MISSED
        if (
            not all(map(is_, map(_AVAL, arrays), self.avals))
            and _signature(arrays) != self.input_signature
        ):
            return _MISSED
        constants = self.constants
        if constants is not None and not constants.hold():
            return _MISSED  # (the general path traces the program again)
        layout = self.layout
        plain = self.plain
        if plain is not None:
            launch, key = plain
            try:
                out_arrays = launch(self.state_arrays, [], arrays, key)[0]
            except Exception:  # nothing ran: the general path handles it or raises it
                return _MISSED
            if (
                jitted._layout is not layout  # pyright: ignore[reportPrivateUsage]  (its own module)
                or torchlax_core.current_env().config.checked
                or not self.holds()
            ):
                return _MISSED  # its results are dropped (the program writes nothing)
        else:
            if (
                jitted._layout is not layout  # pyright: ignore[reportPrivateUsage]  (its own module)
                or bool(torchlax_core.current_env().config.checked) is not self.checks
                or not self.holds()
            ):
                return _MISSED
            with x64():  # checked mode reads its errors
                out_arrays = self.core.run(self.entry, self.state_arrays, [], arrays)[0]
        single = self.single
        if single is not None:
            return single.wrap(out_arrays[0])
        info = self.info
        if self.out_specs is None:
            return _returned(info, _to_tensors(out_arrays, True, arrays, info.out_orders))
        return _returned(info, wrap_results_like(out_arrays, self.out_specs))

    def _view_arrays(self, args: tuple) -> list | None:
        """The arguments' arrays where the recorded call's types and state arrays hold but
        some argument is a view: a contiguous view's value (a JAX op: inside ``x64()``), or
        None (a miss: another type, another state array, or another layout, ``x.t()``, which
        is another program, whose results take eager's strides)."""
        if (
            tuple(map(type, args)) != self.types
            or not all(map(is_, map(_ARRAY, self.storages), self.state_arrays))
            or not all(map(_IS_CONTIGUOUS, args))
        ):
            return None  # (an array a training step donated since is deleted: never launched)
        with x64():
            return [t.jax() for t in args]


@dataclasses.dataclass(slots=True)
class _RepeatedStep:
    """A training step call (the donating program; tensor arguments only) that the next call
    may repeat: the same program entry over the same state objects.

    The general path would assemble the state anew (``_Layout.assemble``: every optimizer
    state value and ``.grad`` read, their storages gathered), drop the ``.grad``s the step
    discards unread, build the program key and look the entry up: a cost per state array
    (a 2-layer GPT-2 with AdamW has ~110). ``call`` instead checks that all of it would come
    out the same: the layout's guards in full (``_Layout.holds``, as the general path runs
    them), each ``.grad`` and each optimizer state value is the very object the last call left
    there, each storage still holds the array the last call wrote (an in-place write, or a
    ``.grad`` set by hand, takes the general path), and the arguments and grad mode are as
    recorded. Then it launches the recorded entry and writes back through the recorded plan,
    as the general path does. Checked mode is never repeated here (its errors are raised on
    the general path)."""

    layout: _Layout
    state: _StateSet  # of the recorded call, less the .grads the step discards unread
    types: tuple  # of the arguments
    input_signature: tuple
    grad_enabled: bool
    core: CompiledProgram
    entry: Entry
    info: _Info
    plan: list  # _write_plan of the state and info
    out_sig: _Hashed  # the signature of the state arrays the program returns
    out_specs: list | None  # as _RepeatedForward's
    # What the last call left, re-checked by identity on the next: the arrays it wrote into
    # the state's storages, each parameter's .grad, and the optimizers' state values.
    written: list = dataclasses.field(init=False)
    grads: list = dataclasses.field(init=False)
    values: list = dataclasses.field(init=False)
    dead: tuple = dataclasses.field(init=False)  # parameters whose .grad the step discards
    lr_groups: list = dataclasses.field(init=False)
    lr_types: list = dataclasses.field(init=False)

    def __post_init__(self):
        state = self.state
        self.dead = tuple(state.grads[i] for i in state.dead_grads)
        self.lr_groups = [group for group, _ in state.lrs]
        self.lr_types = state.lr_types
        self._remember(list(map(_ARRAY, state.storages)), list(map(_GRAD, state.grads)))

    def _remember(self, written: list, grads: list) -> None:
        self.written = written
        self.grads = grads
        self.values = _state_values(self.layout)

    def call(self, jitted: _Jitted, args: tuple):
        """The call's result, or ``_MISSED`` (nothing was changed then). Its checks run outside
        JAX's 64-bit mode, as ``_RepeatedForward.call``'s (see there), the launch inside."""
        layout = self.layout
        state = self.state
        if (
            torch.is_grad_enabled() is not self.grad_enabled
            or jitted._layout is not layout  # pyright: ignore[reportPrivateUsage]  (its own module)
            or tuple(map(type, args)) != self.types
            or bool(torchlax_core.current_env().config.checked)
            or self.entry.stale()  # traced under another float32 matmul precision
        ):
            return _MISSED
        if not any(map(view_getter, args)):  # roots are row-major
            arrays = [t.jax() for t in args]
        elif all(map(_IS_CONTIGUOUS, args)):
            with x64():
                arrays = [t.jax() for t in args]
        else:
            return _MISSED
        if (
            _signature(arrays) != self.input_signature
            or any(map(_REQUIRES_GRAD, args))  # (the general path refuses such an argument)
            or not layout.holds(args)  # pyright: ignore[reportArgumentType]  (a tuple does)
            or not all(map(is_, map(_GRAD, state.grads), self.grads))
            or not _same_objects(_state_values(layout), self.values)
            or not all(map(is_, map(_ARRAY, state.storages), self.written))
            or (self.info.constants is not None and not self.info.constants.hold())
        ):
            return _MISSED
        lr_arrays = [
            to(group["lr"]) for group, to in zip(self.lr_groups, self.lr_types, strict=True)
        ]
        info = self.info
        dead = self.dead
        dead_grads = list(map(_GRAD, dead))
        stepped = [0] * len(state.schedulers)

        def launch(out: list) -> None:
            for p in dead:
                p.grad = None  # dropped before the program runs, as the general path does
            with x64():  # the learning rates are numpy scalars: float64 ones stay float64
                out.append(self.core.run(self.entry, _distinct(self.written), lr_arrays, arrays))

        def write(results) -> None:
            _, new_storages, extra = results
            grads = _write_state(state, info, new_storages, extra, self.plan)
            jitted._last_state = (new_storages, self.out_sig)  # pyright: ignore[reportPrivateUsage]  (its own module)
            self._remember(new_storages, grads)  # (what _write_state put in the storages)
            _step_schedulers(state, info, stepped)

        out_arrays = launch_and_write(launch, write, lambda: _put_grads(dead, dead_grads))[0]
        if self.out_specs is None:
            outputs = _to_tensors(out_arrays, True, arrays, info.out_orders)
        else:
            outputs = wrap_results_like(out_arrays, self.out_specs)
        return _returned(info, outputs)


def _put_grads(params, grads) -> None:
    for p, grad in zip(params, grads, strict=True):
        if p.grad is not grad:
            p.grad = grad


def _step_schedulers(state: _StateSet, info: _Info, stepped: list[int]) -> None:
    """The schedulers' ``step()``s the program deferred; ``stepped`` counts those made (a
    write-back run again after an interruption makes only the rest)."""
    for i, (scheduler, count) in enumerate(
        zip(state.schedulers, info.scheduler_steps, strict=True)
    ):
        while stepped[i] < count:
            # One statement: an interruption lands before the step or after its count.
            stepped[i] += 1 if scheduler.step() is None else 1


def _next_state_is(layout: _Layout, state: _StateSet) -> bool:
    """Whether the next call, if nothing changes meanwhile, runs the program of this call over
    the same storages: what the write-back left (new ``.grad``s, optimizer state) assembles
    into the same structure, and the same storages once the same unread ``.grad``s are dropped.
    Not so after a step that created a ``.grad`` or state tensor the next step reads (its
    structure changes), or one that replaces a tensor it reads each time: those calls keep
    the general path."""
    after = layout.assemble()
    if after.structure() != state.structure():
        return False
    if state.dead_grads:
        after = after.without_grads(state.dead_grads)
    return _same_objects(after.storages, state.storages)


def _same_objects(now: list, then: list) -> bool:
    return len(now) == len(then) and all(map(is_, now, then))


def _state_values(layout: _Layout) -> list:
    """Every optimizer state value, in the layout's order of their dicts (what ``assemble``
    reads the storages of)."""
    return list(chain.from_iterable(map(dict.values, layout.entry_dicts)))
