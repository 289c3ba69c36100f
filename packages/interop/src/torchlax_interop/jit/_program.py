"""The program of one static configuration of a jitted callable: its trace, vjp and donation.

While ``jax.jit`` traces, the state's objects hold tracers (``_Swap``) and the step runs
watched (``_watch``); what it learned is an ``_Info``. A step that trains is compiled with its
state donated (``core``), a function that only computes without (``forward_core``). Autograd's
vjp and the step less the ``.grad``s it discards unread (``without_dead_grads``) are derived
from a traced entry's jaxpr (``_evaluated``): the step's Python runs once per entry.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import torch
import torchlax_core
from jax.extend import core as jax_core
from torch.utils import _pytree as pytree
from torchlax_core import JitError, Tensor
from torchlax_core.internal import (
    CompiledProgram,
    Entry,
    array_of,
    float32_matmul_precision,
    get_logger,
    state_lock,
    storage_of,
    traced_input,
    tracing,
)

from ._inputs import _SLOT, _STATIC, _traced_array
from ._objects import ObjectOutput
from ._outputs import _output_plan
from ._refusals import _owner
from ._state import _StateSet, set_capturable
from ._watch import ReadConstants, run_watched

if TYPE_CHECKING:
    from ._call import _Jitted


_NONE, _KEPT, _NEW = 0, 1, 2  # what a .grad / optimizer state entry became in the program


# One trace at a time, and no call while one runs: another thread would read the tracers
# swapped into shared objects (an UnexpectedTracerError). Calls hold it while they read and
# write state (the program is dispatched asynchronously: the hold is short).
_trace_lock = state_lock


_log = get_logger("jit")


@dataclasses.dataclass
class _Info:
    """What tracing learned about one program at one input signature."""

    out_spec: Any
    out_statics: tuple
    changed: tuple[bool, ...]  # per storage: whether the program writes it
    # What each .grad, then each optimizer state tensor (in entry_names' order) became:
    # (_NONE | _KEPT | _NEW, its storage's index | its index in the extra results)
    slots: tuple
    entry_names: tuple  # per optimizer, per parameter: the names of its state tensors
    scheduler_steps: tuple[int, ...]
    cpu_changed: tuple[bool, ...]  # per CPU buffer of a module target: written by the program
    trains: bool  # changes grads or optimizer state: never wrapped for outer autograd
    # per output array: the order it is returned in (returned_in_memory_order), or None
    out_orders: tuple = ()
    constants: ReadConstants | None = None  # tensors read, no state: baked in (checked)
    # What a backward after the call would do that jax.vjp of the program cannot (backward
    # hooks met, plain CPU tensors requiring grad read), in words: such a differentiable
    # forward runs eagerly (``_autograd.eager_call``)
    eager_backward: tuple[str, ...] = ()
    reads_host_grad: bool = False  # such a CPU tensor read: the output requires grad
    # Precomputed for each call: any storage or CPU buffer written, one tensor returned, an
    # object rebuilt around its tensors (_objects)
    writes: bool = dataclasses.field(init=False)
    single_output: bool = dataclasses.field(init=False)
    rebuilds: bool = dataclasses.field(init=False)

    def __post_init__(self):
        self.writes = any(self.changed) or any(self.cpu_changed)
        self.single_output = self.out_spec.is_leaf() and self.out_statics[0] is _SLOT
        self.rebuilds = any(isinstance(s, ObjectOutput) for s in self.out_statics)


class _Program:
    """One static configuration of a jitted callable: its traced function and compiled forms."""

    def __init__(self, jitted: _Jitted, configuration: tuple, checks: bool, in_layouts=None):
        self.jitted = jitted
        # the tree of the arguments, each leaf's _SLOT / _STATIC / value, the static values
        self.in_spec, self.statics, self.static_values = configuration
        self.in_layouts = in_layouts  # per input: None or (strides, order): _input_layouts
        self.checks = checks  # Config.checked (checkify; the state is then not donated)
        self._state: _StateSet | None = None
        # The key input is raw key data, made on the host (a typed key would be one more JAX
        # dispatch per call). The forward's jaxprs are kept in checked mode too: autograd
        # differentiates them. (The step's donation is set by entry().)
        self.core = CompiledProgram(
            _owner(jitted), self._traced, checks=checks, keep_jaxpr=not checks, key_data=True
        )
        forward = functools.partial(self._traced, all_storages=False)
        self.forward_core = CompiledProgram(
            _owner(jitted), forward, checks=checks, keep_jaxpr=True, key_data=True
        )
        self.trains: bool | None = None  # learned by the first trace
        # Autograd: forwards run the plain program until a first backward() (which recomputes
        # it under forward_vjp), then forward_vjp (saving residuals: _autograd)
        self.saves_residuals = False
        self.forward_vjp = jax.jit(self._traced_vjp, static_argnums=(0, 1))
        self.backward = jax.jit(lambda vjp, cotangents: vjp(cotangents))
        self.logged_eager = False  # _autograd.eager_call logs once
        # (a trace and the storages it drops) the next trace derives its entry from instead
        # of tracing the step (without_dead_grads)
        self.derived: tuple[Entry, tuple[int, ...]] | None = None

    # -- tracing --------------------------------------------------------------------------

    def _traced(
        self, derived: tuple | None, state_arrays, lr_arrays, arrays: list, all_storages=True
    ) -> tuple:
        """The step on tracers, inside the caller's key scope: its results and ``_Info``; or,
        given ``derived`` (``without_dead_grads``), those of that trace less its dead grads.

        The new storages are all returned (donated state: each input buffer comes back), or,
        with ``all_storages=False``, only those the step changes (``None`` for the others:
        returning an undonated input copies it)."""
        if derived is not None:
            return _without(derived[0], derived[1], state_arrays, lr_arrays, arrays)
        state = self._state
        assert state is not None  # entry() sets it before tracing
        swap = _Swap(state, state_arrays, lr_arrays)
        try:
            with tracing(torchlax_core.current_env()):
                cpu_state, args, kwargs = self._arguments(arrays, state)
                out, constants, eager_backward, reads_host_grad = run_watched(
                    self.jitted, cpu_state, args, kwargs, state
                )
                outputs = _output_plan(out, set(swap.ids), self.jitted)
                new_storages = [s.array for s in state.storages]
                extra: list = []
                slots, entry_names = swap.slots(extra)
                cpu_new = [array_of(t) for t in cpu_state.values()]
        finally:
            swap.restore()
        changed = tuple(new is not old for new, old in zip(new_storages, state_arrays, strict=True))
        if not all_storages:
            new_storages = [
                new if c else None for new, c in zip(new_storages, changed, strict=True)
            ]
        cpu_changed = tuple(new is not old for new, old in zip(cpu_new, arrays, strict=False))
        extra.extend(new for new, c in zip(cpu_new, cpu_changed, strict=True) if c)
        out_spec, out_statics, out_arrays, out_orders = outputs
        info = _Info(
            out_spec,
            out_statics,
            changed,
            slots,
            entry_names,
            tuple(swap.scheduler_steps[id(s)] for s in state.schedulers),
            cpu_changed,
            swap.trains(slots, changed),
            out_orders,
            constants,
            eager_backward,
            reads_host_grad,
        )
        return (out_arrays, new_storages, extra), info

    def _arguments(self, arrays: list, state: _StateSet) -> tuple:
        """The step's arguments on tracers of ``arrays`` (the state's CPU tensors of a module
        target, then the inputs, each with the strides it is traced with, if any):
        ``(cpu_state, args, kwargs)``."""
        n_cpu = len(state.cpu_tensors)
        layouts = (None,) * n_cpu + (self.in_layouts or (None,) * (len(arrays) - n_cpu))
        tensors = [traced_input(a, *(at or ())) for a, at in zip(arrays, layouts, strict=True)]
        cpu_state = dict(zip(state.cpu_tensors, tensors[:n_cpu], strict=True))
        inputs, statics = iter(tensors[n_cpu:]), iter(self.static_values)
        flat = [
            next(inputs) if s is _SLOT else next(statics) if s is _STATIC else s
            for s in self.statics
        ]
        return cpu_state, *pytree.tree_unflatten(flat, self.in_spec)

    def _traced_vjp(self, selection: tuple, precision: str, arrays, lr_arrays, key):
        """The outputs of ``selection``'s entry (``(mask, entry)``, static: keyed by the
        entry's identity), its vjp by the ``arrays`` (state, then the others) its mask selects
        and its other results, from its jaxpr (a pure function: no Python is traced again).
        ``precision`` is unused: a static argument, it keys jax.jit's cache on the mode, as
        the entry is."""
        mask, entry = selection
        n_state = len(entry.info.changed)
        checks = self.checks

        def forward(diff):
            diff_ = iter(diff)
            merged = [next(diff_) if m else a for a, m in zip(arrays, mask, strict=True)]
            results = _evaluated(entry, merged[:n_state], lr_arrays, merged[n_state:], key)
            error, (outs, new_storages, extra) = results if checks else (None, results)
            return outs, (new_storages, extra, error)

        diff = [a for a, m in zip(arrays, mask, strict=True) if m]
        outs, vjp, aux = jax.vjp(forward, diff, has_aux=True)
        return outs, *aux, vjp

    def entry(self, signature, state: _StateSet, args: tuple) -> tuple[Entry, bool]:
        """This signature's entry (traced now if new: its ``info`` says what the step does), and
        whether it is the forward program's (nothing donated) or the donating one's: a step
        that trains runs the latter, guessed from the optimizers until the first trace tells,
        and checked on each new signature."""
        self._state = state  # read by the trace; the caller holds _trace_lock
        forward = self.trains is False or (self.trains is None and not state.optimizers)
        entry = self._entry(signature, args, forward)
        if entry.info.trains == forward:  # the guess was wrong: the other program's entry
            forward = not forward
            entry = self._entry(signature, args, forward)
        self.trains = entry.info.trains
        return entry, forward

    def _entry(self, signature, args: tuple, forward: bool) -> Entry:
        core = self.forward_core if forward else self.core
        # The state is donated unless the step runs on lent CPU memory (read when tracing).
        core.donate_argnums = (0,) if self.jitted.donate_state and not forward else ()
        derived, self.derived = self.derived, None
        entry = core.entry(signature, args, derived)
        constants = entry.info.constants
        if constants is not None and not constants.hold():
            self.forget_traces()
            entry = core.entry(signature, args)
        return entry

    def forget_traces(self) -> None:
        """Drop every traced signature (a constant the traces read changed): the next call
        of each traces and compiles again, reading the constants' new values."""
        self.core.clear()
        self.forward_core.clear()
        self.forward_vjp = jax.jit(self._traced_vjp, static_argnums=(0, 1))

    @property
    def compiled(self) -> dict:
        """Signature -> executable, for this program's compiled signatures."""
        return {**self.core.executables(), **self.forward_core.executables()}


class _Held:
    """What a trace (or the first call's stand-ins) changes of the state's objects, until
    ``put_back``: the arrays of ``storages`` (default: the state's), the ``.grad``s, each
    optimizer's state dict and entries, and its groups' learning rates and ``capturable``."""

    def __init__(self, state: _StateSet, storages=None):
        self.state = state
        self.arrays = [(s, s.array) for s in (state.storages if storages is None else storages)]
        self.grads = [p.grad for p in state.grads]
        self.optimizers = [
            (opt, dict(opt.state), {p: dict(v) for p, v in opt.state.items()})
            for opt in state.optimizers
        ]
        self.settings = [(g, "lr", g["lr"]) for g, _ in state.lrs] + [
            (g, "capturable", g["capturable"])
            for o in state.optimizers
            for g in o.param_groups
            if "capturable" in g
        ]

    def put_back(self) -> None:
        """The state's objects as found (the same dicts: the step's own references to them
        stay valid)."""
        for storage, array in self.arrays:
            storage.array = array
        for group, name, value in self.settings:
            group[name] = value
        for p, grad in zip(self.state.grads, self.grads, strict=True):
            if p.grad is not grad:
                p.grad = grad
        for opt, dicts, entries in self.optimizers:
            opt.state.clear()
            for p, values in dicts.items():
                values.clear()
                values.update(entries[p])
                opt.state[p] = values


class _Swap(_Held):
    """The state's objects holding a trace's tracers (``_Program._traced``) until ``restore``:
    the storages' arrays, the learning rates (tensors of their inputs), the optimizers'
    ``capturable`` flags and the schedulers' ``step()`` (counted, made after the call). It
    tells how each ``.grad`` and optimizer entry the trace leaves is returned (``slot``)."""

    def __init__(self, state: _StateSet, state_arrays: list, lr_arrays: list):
        dead: list[Any] = [storage_of(state.grads[i].grad) for i in state.dead_grads]
        super().__init__(state, [*state.storages, *dead])
        self.ids = {id(s): i for i, s in enumerate(state.storages)}
        self.scheduler_steps = {id(s): 0 for s in state.schedulers}
        for storage, array in zip(state.storages, state_arrays, strict=True):
            storage.array = array
        # A .grad the step discards unread is no input: it holds a stand-in of its shape while
        # tracing (it is not None, so the step's Python takes the path it took when the grad
        # was fed and found unread). (Its array may be a jax.ShapeDtypeStruct: _first_call.)
        for storage in dead:
            storage.array = jnp.zeros(storage.array.shape, storage.array.dtype)
        self.lr_tensors = [Tensor(array) for array in lr_arrays]
        for (group, _), lr in zip(state.lrs, self.lr_tensors, strict=True):
            group["lr"] = lr
        set_capturable(state.optimizers)
        for s in state.schedulers:
            s.step = functools.partial(self._scheduler_step, s)

    def _scheduler_step(self, scheduler, *args, **kwargs) -> None:
        if args or kwargs:
            raise JitError(
                "torchlax.jit: scheduler.step() with arguments (an epoch or a metric) "
                "inside a compiled step is not supported; call it outside the step."
            )
        self.scheduler_steps[id(scheduler)] += 1

    def restore(self) -> None:
        self.put_back()
        for s in self.state.schedulers:
            del s.step

    def slot(self, value, extra: list) -> tuple:
        """How a program's final ``.grad`` (or state entry) is returned: none, kept (the index
        of its storage), or new (its index in ``extra``, the program's extra results)."""
        if value is None:
            return _NONE, -1
        index = self.ids.get(id(storage_of(value))) if isinstance(value, Tensor) else None
        if index is not None:
            return _KEPT, index
        extra.append(_traced_array(value))
        return _NEW, len(extra) - 1

    def slots(self, extra: list) -> tuple:
        """``_Info``'s ``slots`` and ``entry_names`` of the trace's final state; a non-tensor
        optimizer entry the step changed is refused, as is a learning rate it assigned."""
        slots = [self.slot(p.grad, extra) for p in self.state.grads]
        names = tuple(
            tuple(self._entries(opt, p, before.get(p, {}), slots, extra) for p in _params(opt))
            for opt, _, before in self.optimizers
        )
        for (group, _), lr in zip(self.state.lrs, self.lr_tensors, strict=True):
            if group["lr"] is not lr:
                raise JitError(
                    "torchlax.jit: the compiled step assigns param_group['lr'] itself; the new "
                    "value would be a constant of the program. Change learning rates with a "
                    "torch.optim.lr_scheduler scheduler, or outside the compiled function."
                )
        return tuple(slots), names

    def _entries(self, opt, p, before: dict, slots: list, extra: list) -> tuple:
        row = []
        for name, value in (opt.state.get(p) or {}).items():
            if isinstance(value, torch.Tensor):
                row.append(name)
                slots.append(self.slot(value, extra))
            elif name not in before or before[name] != value:
                raise JitError(
                    f"torchlax.jit: the optimizer {type(opt).__name__} stores a non-tensor "
                    f"state value {name!r} that the compiled step changes; it would be a "
                    "constant of the program. Keep optimizer state in tensors."
                )
        return tuple(row)

    def trains(self, slots: tuple, changed: tuple) -> bool:
        """Whether the step changes a ``.grad`` or optimizer state (it then never runs as a
        forward that outer autograd differentiates): a slot other than it was (an optimizer
        entry: kept), or kept and written."""
        before = [  # (a .grad of no storage: index -2, equal to no slot after)
            (_NONE, -1) if g is None else (_KEPT, self.ids.get(id(storage_of(g)), -2))
            for g in self.grads
        ]
        return any(
            (kind, i) != (b or (_KEPT, i)) or kind == _NEW or (kind == _KEPT and changed[i])
            for (kind, i), b in itertools.zip_longest(slots, before)
        )


def _params(opt) -> list:
    return [p for group in opt.param_groups for p in group["params"]]


def _unread_grads(entry: Entry, state: _StateSet) -> tuple[int, ...]:
    """Positions of the ``.grad``s whose arrays the traced step never reads (it sets them to
    ``None`` first) and only hands back unchanged."""
    assert entry.jaxpr is not None
    jaxpr = entry.jaxpr.jaxpr
    invars = jaxpr.invars[: len(state.storages)]
    outs, new_storages, extra = jax.tree.unflatten(entry.out_tree, jaxpr.outvars)
    read = {id(v) for v in (*outs, *extra)} | {id(v) for e in jaxpr.eqns for v in e.invars}
    # (a storage's output reads it unless it is its own unchanged value; a slot kept reads it)
    read.update(id(v) for v, old in zip(new_storages, invars, strict=True) if v is not old)
    read.update(id(invars[i]) for kind, i in entry.info.slots if kind == _KEPT)
    index = {id(s): i for i, s in enumerate(state.storages)}
    return tuple(
        position
        for position, p in enumerate(state.grads)
        if isinstance(p.grad, Tensor)
        and id(invars[i := index[id(storage_of(p.grad))]]) not in read
        and state.owners[i] is p.grad
    )


def without_dead_grads(
    programs: dict, key: tuple, entry: Entry, state: _StateSet, dead: tuple[int, ...]
) -> tuple | None:
    """Where the step traced at ``key`` over ``state`` (``entry``: that trace, dropped) runs
    less the ``.grad``s at positions ``dead`` it discards unread: the key of the state without
    them, returned, where its program computes the same equations (a resumed process's first
    call; the step's Python may branch on a ``.grad`` being ``None``); else (None) ``key``'s
    own program, its next entry derived from ``entry`` (``_without``), not traced again."""
    spec, statics, values, (grads, static), *rest = key
    present = tuple(g and i not in dead for i, g in enumerate(grads))
    without = (spec, statics, values, (present, static), *rest)
    other = programs.get(without)
    if other is not None and entry.jaxpr is not None:
        computes = _equations(entry.jaxpr.jaxpr)
        for e in other.core.entries():
            if e.jaxpr is not None and _equations(e.jaxpr.jaxpr) == computes:
                del programs[key]
                return without
    program = programs[key]
    program.forget_traces()  # (its one trace: what the program less those .grads derives from)
    dropped = {id(storage_of(state.grads[i].grad)) for i in dead}
    program.derived = (entry, tuple(i for i, s in enumerate(state.storages) if id(s) in dropped))
    return None


def _without(source: Entry, drop: tuple[int, ...], state_arrays, lr_arrays, arrays) -> tuple:
    """The results and ``_Info`` of ``source``'s program over the state less the storages at
    ``drop`` (``.grad``s it discards unread): its jaxpr evaluated, storage indices renumbered."""
    info = source.info
    full = list(state_arrays)
    for i in drop:
        full.insert(i, None)  # (never read: _unread_grads)
    key = source.key()  # (if random, one more split of the call's key: not the same values)
    if source.precision is not None:  # stale, as its source, once the matmul precision changes
        float32_matmul_precision()
    outs, storages, extra = _evaluated(source, full, lr_arrays, arrays, key)
    n_state = len(info.changed)
    kept = {old: new for new, old in enumerate(i for i in range(n_state) if i not in drop)}
    info = dataclasses.replace(
        info,
        changed=tuple(info.changed[i] for i in kept),
        slots=tuple((kind, kept[i] if kind == _KEPT else i) for kind, i in info.slots),
    )
    return (outs, [storages[i] for i in kept], extra), info


def _evaluated(entry: Entry, state_arrays, lr_arrays, arrays, key) -> Any:
    """The results of ``entry``'s program on these inputs from its jaxpr (a pure function:
    the step's Python is not traced again), as the pytree the program returns."""
    assert entry.jaxpr is not None  # (kept by forward_core, and by core unless checked)
    flat = jax_core.jaxpr_as_fun(entry.jaxpr)(*state_arrays, *lr_arrays, *arrays, key)
    return jax.tree.unflatten(entry.out_tree, flat)


def _equations(jaxpr) -> str:
    """What a jaxpr computes, its inputs and outputs aside: its equations printed, variables
    named in the order they are used (an unread input takes no name), object addresses
    dropped (a custom rule is a new function each trace)."""
    return _ADDRESS.sub("", str(jax_core.Jaxpr(jaxpr.constvars, [], [], jaxpr.eqns)))


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
