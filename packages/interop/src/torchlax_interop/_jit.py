"""``jit``: compile a PyTorch function, module or whole training step into one XLA program.

One call runs one XLA program. Its inputs are the argument tensors, a PRNG key, and the
*state* the function reaches: the parameters and buffers of every module it is given or closes
over, their ``.grad``s, every optimizer's state tensors (``exp_avg``, ``step``, ...) and
learning rates, and torchlax Tensors it closes over. While ``jax.jit`` traces, each state
tensor's storage holds a tracer, so the very objects the user's code names (``model``,
``opt``) compute the program; afterwards they get their old arrays back, and each call writes
the program's new state into them (``_StateSet``). Other argument leaves are static.

When the function only computes (no state it changes but buffers) and autograd needs it, the
call is one ``torch.autograd.Function``: its forward is the plain program and its backward
recomputes it under ``jax.vjp``, until a first backward; then forwards save ``jax.vjp``'s
residuals (docs/interop.md, "Autograd across a jitted call").
"""

from __future__ import annotations

import dataclasses
import operator
import threading
from collections.abc import Callable, Sequence
from itertools import chain
from operator import is_
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torchlax_core
from jax.extend import core as jax_core
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils import _pytree as pytree
from torch.utils.hooks import RemovableHandle
from torchlax_core import JitArgumentError, JitError, Tensor, checked, raise_error
from torchlax_core.internal import (
    CompiledProgram,
    Entry,
    ReadConstants,
    ResultWrappers,
    array_of,
    dense_strides_in_order,
    get_logger,
    is_root_of,
    laid_out,
    memory_order,
    memory_ordered_array,
    output_tensors,
    result_specs,
    root_values,
    state_lock,
    storage_of,
    stored_in_order,
    tracing,
    view_getter,
    viewed_back,
    watch_constants,
    wrap_results_like,
    x64,
)
from torchlax_core.internal import signature as _signature

from . import _jit_first_call
from ._arguments import check_jit_arguments, check_static_argnums
from ._call_jax import _borrow, _give_back
from ._dlpack import check_shared_writes, from_torch
from ._jit_commit import launch_and_write
from ._jit_constant_writes import (
    changed_constant_error,
    changed_cpu_tensor_error,
    described_tensor,
    where_held,
)
from ._jit_cpu_tensors import ChangedCpuTensor
from ._jit_objects import ObjectOutput
from ._jit_objects import find as find_object_output
from ._jit_paths import path_to, reaches
from ._jit_state import (
    MAX_CONTAINER_ITEMS,
    MAX_STATE_DEPTH,
    MAX_WALKED_ITEMS,
    CpuStateError,
    _Hashed,
    _Layout,
    _StateSet,
    arg_leaves,
    cpu_state_tensors,
    find_state,
)
from ._jit_trace_watch import TraceWatch

_SLOT = object()  # a tensor's place among the flattened arguments
_STATIC = object()  # a static_argnums/static_argnames argument's place
_NONE, _KEPT, _NEW = 0, 1, 2  # what a .grad / optimizer state entry became in the program

# One trace at a time, and no call while one runs: tracing swaps tracers into shared objects
# (a module's parameters), so another thread's trace, or its call reading the same module's
# state, would read those tracers (an UnexpectedTracerError, seen with four threads making
# their first calls at once). Calls hold it while they read and write state; the program
# itself is dispatched asynchronously, so the hold is short.
_trace_lock = state_lock  # (readers of the state in other threads wait on it: see there)
_log = get_logger("jit")


def jit(
    fn_or_module: Callable | torch.nn.Module,
    *,
    static_argnums: int | Sequence[int] = (),
    static_argnames: str | Sequence[str] = (),
    donate_state: bool = True,
) -> Callable:
    """Compile ``fn_or_module`` with ``jax.jit``; the result is called like the original.

    It takes and returns torchlax Tensors (and also plain CPU tensors: then the results are CPU
    tensors, shared with XLA through DLPack; a model and optimizer on the CPU are lent to the
    program for each call and their new values written back in place). Tensors anywhere in the arguments are program
    inputs; other argument leaves (ints, floats, strings, ...) are static: a new value
    compiles a new program, as do new shapes or dtypes. ``static_argnums``/``static_argnames``
    name further arguments passed unchanged as static values (they must be hashable).

    State is an input, not a constant: the parameters and buffers of the module (or of every
    module the function receives or closes over), the ``.grad`` of each parameter, and, for
    each ``torch.optim`` optimizer it reaches, its state tensors and learning rates. So a whole
    training step compiles into one program::

        def step(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            sched.step()
            return loss

        step = torchlax.jit(step)

    What the program changes is written back after the call (the old buffers are donated to
    it, so peak memory holds one copy of the state; pass ``donate_state=False`` to keep
    arrays you hold from ``tensor.jax()`` alive). Changing a learning rate, by hand or with a
    ``torch.optim.lr_scheduler`` scheduler, compiles nothing; changing another
    hyperparameter (momentum, weight decay, betas) compiles a new program. A scheduler's
    ``step()`` inside the function runs after the program, on the host (it only computes
    Python numbers). The first call of a function whose optimizers have no state yet is
    compiled too: the state the step creates comes out of its program, and the steady step's
    program is compiled before that call returns, so later calls compile nothing
    (``_jit_first_call``).

    Random ops get their keys from a key drawn for each call from torch's generator, so dropout
    differs per call and ``torch.manual_seed`` reproduces it. Switching ``train()``/``eval()``
    selects another program.

    Autograd works across the call: if grad mode is on and a parameter or tensor argument
    requires grad, a function that changes no state is one ``torch.autograd.Function`` whose
    backward is ``jax.vjp`` of the program, so ``loss.backward()`` fills ``.grad`` as usual. A
    forward that is never differentiated costs what a ``torch.no_grad()`` call costs.
    JAX runs with 64-bit types enabled, so int64 stays int64.
    """
    static_argnums = check_static_argnums(static_argnums)
    if isinstance(static_argnames, str):
        static_argnames = (static_argnames,)
    return _Jitted(fn_or_module, tuple(static_argnums), tuple(static_argnames), donate_state)


# -- one compiled program ---------------------------------------------------------------------------


@dataclasses.dataclass
class _Info:
    """What tracing learned about one program at one input signature."""

    out_spec: Any
    out_statics: tuple
    changed: tuple[bool, ...]  # per storage: whether the program writes it
    grad_slots: tuple  # per grad parameter: (_NONE | _KEPT | _NEW, index)
    opt_slots: tuple  # per optimizer, per parameter: ((name, kind, index), ...)
    scheduler_steps: tuple[int, ...]
    cpu_changed: tuple[bool, ...]  # per CPU buffer of a module target: written by the program
    trains: bool  # changes grads or optimizer state: never wrapped for outer autograd
    # per output array: the dimension order it is returned in (a result eager PyTorch lays out
    # transposed: see _dense_order), or None (row-major)
    out_orders: tuple = ()
    # The tensors that are no state the step read: their values are baked in, so a call
    # after one of them changed (the user wrote into it) traces the program again.
    constants: ReadConstants | None = None
    # What autograd's backward of the traced code does that jax.vjp of the program would not,
    # in words: the backward hooks the step met (PyTorch runs them in its backward), the plain
    # CPU tensors requiring grad it read (constants of the program: eagerly the backward
    # gives them gradients). A call whose backward runs after it (a differentiable forward)
    # is run eagerly instead (``_Jitted._forward_with_backward_hooks``).
    eager_backward: tuple[str, ...] = ()
    # Whether such a CPU tensor is among them: the call's output requires grad eagerly even
    # where no state or input does
    reads_host_grad: bool = False
    # Precomputed for each call's write-back and output: whether any storage or CPU buffer
    # changes, and whether the output is one tensor.
    writes: bool = dataclasses.field(init=False)
    single_output: bool = dataclasses.field(init=False)
    # Whether an output is an object rebuilt around its tensors (_jit_objects), and how many
    # arrays the program outputs (its tensors count).
    rebuilds: bool = dataclasses.field(init=False)
    n_outputs: int = dataclasses.field(init=False)

    def __post_init__(self):
        self.writes = any(self.changed) or any(self.cpu_changed)
        self.single_output = self.out_spec.is_leaf() and self.out_statics[0] is _SLOT
        objects = [s.n for s in self.out_statics if isinstance(s, ObjectOutput)]
        self.rebuilds = bool(objects)
        self.n_outputs = sum(s is _SLOT for s in self.out_statics) + sum(objects)


class _Program:
    """One static configuration of a jitted callable: its traced function and compiled forms."""

    def __init__(
        self, jitted: _Jitted, in_spec, statics, static_values, checks: bool, in_layouts=None
    ):
        self.jitted = jitted
        # per input array: None (row-major), or (strides it is traced with, so that its
        # results take the strides eager PyTorch gives them; the order its array comes in:
        # see _input_layouts); None when every input is row-major
        self.in_layouts = in_layouts
        # Config.checked: value checks inside (an index out of range, ...) are recorded with
        # checkify and raised after the call; the state is then not donated, so a failed call
        # leaves it as it was.
        self.checks = checks
        self.in_spec = in_spec
        self.statics = statics
        self.static_values = static_values
        self._state: _StateSet | None = None
        name = getattr(jitted.target, "__qualname__", type(jitted.target).__name__)
        # The signature -> executable cache, key input, donation of the state arrays (the
        # program returns their new values) and checks: the compiled-program core's.
        # The key input is raw key data, made on the host for each call that draws (a typed
        # key would be one more JAX dispatch per call, longer than the launch itself).
        self.core = CompiledProgram(
            f"torchlax.jit({name})",
            self._traced_entry,
            donate_argnums=(0,) if jitted.donate_state else (),
            checks=checks,
            keep_jaxpr=not checks,
            key_data=True,
        )
        # A function that changes no state but buffers runs this program instead: no
        # donation, and only the storages it changes come back (docs/interop.md, "Autograd").
        self.forward_core = CompiledProgram(
            f"torchlax.jit({name})",
            self._traced_forward_entry,
            checks=checks,
            keep_jaxpr=not checks,
            key_data=True,
        )
        self.trains: bool | None = None  # learned by the first trace
        # Autograd: the forward is the plain program; backward() runs one program that
        # recomputes the forward from the entry's jaxpr and applies its vjp. Once a backward
        # has run, later calls save jax.vjp's residuals in the forward instead (a training
        # loop then computes the forward once).
        self.saves_residuals = checks  # checked mode: checkify's errors come from the forward
        self.forward_vjp = jax.jit(self._traced_vjp, static_argnums=(0, 1))
        self.backward = jax.jit(lambda vjp, cotangents: vjp(cotangents))
        self._recomputing_backwards: dict = {}
        self.logged_eager = False  # _Jitted._forward_with_backward_hooks logs once

    # -- tracing --------------------------------------------------------------------------

    def _traced_entry(self, _static, state_arrays: list, lr_arrays: list, arrays: list):
        return self._traced(state_arrays, lr_arrays, arrays)

    def _traced_forward_entry(self, _static, state_arrays: list, lr_arrays: list, arrays: list):
        return self._traced(state_arrays, lr_arrays, arrays, all_storages=False)

    def _traced(
        self, state_arrays: list, lr_arrays: list, arrays: list, all_storages: bool = True
    ) -> tuple:
        """The step on tracers, inside the caller's key scope: its results and ``_Info``.

        The new storages are all returned (donated state: each input buffer comes back), or,
        with ``all_storages=False``, only those the step changes (``None`` for the others:
        returning an undonated input copies it)."""
        state = self._state
        assert state is not None  # info() sets it before tracing
        env = torchlax_core.current_env()
        saved = _swap_in(state, state_arrays, lr_arrays)
        recorded = _defer_schedulers(state.schedulers)
        try:
            with tracing(env):
                n_cpu = len(state.cpu_tensors)
                tensors = [Tensor(a) for a in arrays]
                if self.in_layouts is not None:
                    for k, layout in enumerate(self.in_layouts):
                        if layout is not None:
                            tensors[n_cpu + k] = _traced_input(arrays[n_cpu + k], *layout)
                cpu_state = dict(zip(state.cpu_tensors, tensors[:n_cpu], strict=True))
                inputs = iter(tensors[n_cpu:])
                statics = iter(self.static_values)
                flat = [
                    next(inputs) if s is _SLOT else next(statics) if s is _STATIC else s
                    for s in self.statics
                ]
                args, kwargs = pytree.tree_unflatten(flat, self.in_spec)
                out, constants, eager_backward, reads_host_grad = self._run_watched(
                    cpu_state, args, kwargs, state
                )
                out_flat, out_spec = pytree.tree_flatten(out)
                out_statics, out_tensors = _output_plan(
                    out, out_flat, set(saved["storage_ids"]), self.jitted
                )
                out_orders = tuple(map(_dense_order, out_tensors))
                out_arrays = [
                    _traced_array(x) if order is None else jnp.transpose(_traced_array(x), order)
                    for x, order in zip(out_tensors, out_orders, strict=True)
                ]
                new_storages = [s.array for s in state.storages]
                extra: list = []
                grad_slots = tuple(_slot(p.grad, saved, extra) for p in state.grads)
                opt_slots = tuple(_optimizer_slots(opt, saved, extra) for opt in state.optimizers)
                cpu_new = [array_of(t) for t in cpu_state.values()]
                _check_hyperparameters(state, saved)
        finally:
            _swap_out(state, saved)
            _undefer_schedulers(state.schedulers)
        changed = tuple(new is not old for new, old in zip(new_storages, state_arrays, strict=True))
        if not all_storages:
            new_storages = [
                new if c else None for new, c in zip(new_storages, changed, strict=True)
            ]
        cpu_changed = tuple(new is not old for new, old in zip(cpu_new, arrays, strict=False))
        extra.extend(new for new, c in zip(cpu_new, cpu_changed, strict=True) if c)
        trains = any(
            _grad_changed(kind, index, saved["grad_storage"][i], changed)
            for i, (kind, index) in enumerate(grad_slots)
        ) or any(
            kind != _KEPT or changed[index]
            for slots in opt_slots
            for entries in slots
            for _, kind, index in entries
        )
        info = _Info(
            out_spec,
            out_statics,
            changed,
            grad_slots,
            opt_slots,
            tuple(recorded[id(s)] for s in state.schedulers),
            cpu_changed,
            trains,
            out_orders if any(o is not None for o in out_orders) else (),
            constants,
            eager_backward,
            reads_host_grad,
        )
        return (out_arrays, new_storages, extra), info

    def _run_watched(self, cpu_state: dict, args, kwargs, state: _StateSet):
        """The step on tracers, refusing what cannot be one program: an optimizer stepped
        that is no state, a module trained that is no state, a constant (a tensor that is no
        state) or a plain CPU tensor changed. What the step changed is put back before it
        raises. Returns the step's output, the constants it read (``ReadConstants``, or None),
        what its backward after the call would do only eagerly (``_Info.eager_backward``:
        the backward hooks it met, the plain CPU tensors requiring grad it read) and whether
        it read such a tensor."""
        jitted = self.jitted
        owner = _owner(jitted)
        unfound = _refuse_unfound_optimizers(state, jitted)
        trace_watch = TraceWatch(
            {id(p) for p in (*state.grads, *state.cpu_tensors.values(), *cpu_state.values())}
        )
        with watch_constants() as watch:
            try:
                try:
                    with trace_watch:
                        out = jitted._run(cpu_state, args, kwargs)
                except jax.errors.UnexpectedTracerError as exc:
                    raise _leaked_tracer_error(jitted) from exc
                finally:
                    unfound.remove()
            except BaseException:
                watch.restore(watch.changed())
                trace_watch.restore(trace_watch.changed_cpu_tensors())
                if trace_watch.refused_leaves:  # a backward() that would give CPU leaves .grads
                    raise _refused_backward_error(trace_watch, jitted, args, kwargs) from None
                raise
        if trace_watch.refused_leaves:  # (the step caught the refusal and went on)
            watch.restore(watch.changed())
            trace_watch.restore(trace_watch.changed_cpu_tensors())
            raise _refused_backward_error(trace_watch, jitted, args, kwargs)
        cpu_changed = trace_watch.changed_cpu_tensors()
        if cpu_changed:  # a plain CPU tensor the step changed: put back, and named
            trace_watch.restore(cpu_changed)
            watch.restore(watch.changed())
            named = [(c, path_to(c.tensor, jitted.target, args, kwargs)) for c in cpu_changed]
            raise changed_cpu_tensor_error(owner, named)
        untrained = trace_watch.modules.error(owner, jitted.target, args, kwargs)
        # A changed tensor the function reaches is a constant of the user's: put back, and
        # named. Any other is one the step made from host data (torch.tensor(...)): its
        # own, left alone where the program returns it from (a new optimizer state entry or
        # .grad, the output), else put back (an output's autograd graph may save it).
        changed = [c for c in watch.changed() if not _kept_as_state(c.tensor, state)]
        named = [(c, path_to(c.tensor, jitted.target, args, kwargs)) for c in changed]
        named = [(c, path) for c, path in named if path is not None]
        if named or untrained is not None:
            watch.restore(changed)
        else:
            watch.restore([c for c in changed if not reaches(out, c.tensor)])
        if untrained is not None:
            raise untrained
        if named:
            raise changed_constant_error(owner, named)
        host_grad = [
            f"{described_tensor(t, cpu=t.device.type == 'cpu')} "
            f"{where_held(path_to(t, jitted.target, args, kwargs))}, which requires grad: a "
            "constant of the program, given its gradient by PyTorch's backward only"
            for t in (*trace_watch.host_tensors_requiring_grad, *watch.requiring_grad())
        ]
        eager_backward = tuple(
            f"{hook}, which PyTorch runs in its backward" for hook in trace_watch.backward_hooks
        ) + tuple(host_grad)
        return out, watch.read(), eager_backward, bool(host_grad)

    def _traced_vjp(
        self,
        mask: tuple[bool, ...],
        precision: str,
        diff: list,
        other: list,
        lr_arrays,
        arrays,
        key,
    ):
        # ``precision`` (the float32 matmul precision, which the lowerings read while tracing)
        # is unused here: a static argument, it keys jax.jit's cache on the mode.
        assert self._state is not None  # info() sets it before tracing
        n_state = len(self._state.storages)

        def results_only(*inputs):
            return self._traced(*inputs)[0]

        traced = checked(results_only) if self.checks else results_only
        env = torchlax_core.current_env()

        def differentiable(diff):
            merged = _merge(mask, diff, other)
            with env.prng_key_scope(jax.random.wrap_key_data(key)):
                results = traced(merged[:n_state], lr_arrays, merged[n_state:], False)
            checked = results if self.checks else (None, results)
            error, (outs, new_storages, extra) = checked  # pyright: ignore[reportAssignmentType]  (results is (error, results) exactly when self.checks)
            return outs, (new_storages, extra, error)

        outs, vjp, (new_storages, extra, error) = jax.vjp(differentiable, diff, has_aux=True)
        return outs, new_storages, extra, error, vjp

    def entry(self, signature, state: _StateSet, args: tuple, forward: bool = False) -> Entry:
        """This signature's entry (traced now if new: its ``info`` says what the step does):
        of the forward program (``forward``: nothing donated) or of the donating one."""
        self._state = state  # read by the trace; the caller holds _trace_lock
        if forward:
            core = self.forward_core
        else:
            # The state is donated unless the step runs on lent CPU memory (read when tracing).
            core = self.core
            core.donate_argnums = (0,) if self.jitted.donate_state else ()
        entry = core.entry(signature, args)
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
        self._recomputing_backwards.clear()

    @property
    def compiled(self) -> dict:
        """Signature -> executable, for this program's compiled signatures."""
        return {**self.core.executables(), **self.forward_core.executables()}

    def recomputing_backward(self, entry: Entry, mask: tuple[bool, ...]) -> Callable:
        """One program computing the input gradients of ``entry``'s outputs: it reruns the
        forward (the entry's jaxpr, a pure function: no Python is traced again) under
        ``jax.vjp`` and applies the cotangents."""
        backward = self._recomputing_backwards.get((entry, mask))
        if backward is not None:
            return backward
        assert entry.jaxpr is not None  # forward_core keeps jaxprs unless checks are on
        forward_fn = jax_core.jaxpr_as_fun(entry.jaxpr)
        n_state = len(entry.info.changed)
        n_outs = entry.info.n_outputs

        def backward_program(diff, other, lr_arrays, key, cotangents):
            def forward(diff):
                merged = _merge(mask, diff, other)
                flat = [*merged[:n_state], *lr_arrays, *merged[n_state:], key]
                return forward_fn(*flat)[:n_outs]

            _, vjp = jax.vjp(forward, diff)
            return vjp(cotangents)[0]

        backward = jax.jit(backward_program)
        if len(self._recomputing_backwards) >= self.forward_core.max_signatures:
            self._recomputing_backwards.pop(next(iter(self._recomputing_backwards)))
        self._recomputing_backwards[(entry, mask)] = backward
        return backward


def _grad_changed(kind, index, before, changed) -> bool:
    if kind == _NONE:
        return before != -1
    return kind == _NEW or index != before or changed[index]


def _kept_as_state(t: Tensor, state: _StateSet) -> bool:
    """Whether ``t`` (a tensor the step changed that held a concrete array when the trace
    first saw it) is a parameter's new ``.grad`` or an optimizer's new state entry: a tensor
    the step made (a new optimizer's step count), which the program returns."""
    if any(p.grad is t for p in state.grads):
        return True
    return any(
        v is t
        for opt in state.optimizers
        for entries in opt.state.values()
        for v in entries.values()
    )


def _slot(value, saved: dict, extra: list) -> tuple:
    """How a program's final ``.grad`` (or state entry) is returned: none, kept, or new."""
    if value is None:
        return _NONE, -1
    if isinstance(value, Tensor) and id(storage_of(value)) in saved["storage_ids"]:
        return _KEPT, saved["storage_ids"][id(storage_of(value))]
    extra.append(_traced_array(value))
    return _NEW, len(extra) - 1


def _optimizer_slots(opt, saved: dict, extra: list) -> tuple:
    slots = []
    for group in opt.param_groups:
        for p in group["params"]:
            entries = opt.state.get(p) or {}
            before = saved["opt_state"][id(opt)].get(p, {})
            row = []
            for name, value in entries.items():
                if isinstance(value, torch.Tensor):
                    row.append((name, *_slot(value, saved, extra)))
                elif name not in before or before[name] != value:
                    raise JitError(
                        f"torchlax.jit: the optimizer {type(opt).__name__} stores a non-tensor "
                        f"state value {name!r} that the compiled step changes; it would be a "
                        "constant of the program. Keep optimizer state in tensors."
                    )
            slots.append(tuple(row))
    return tuple(slots)


def _check_hyperparameters(state: _StateSet, saved: dict) -> None:
    for (group, _), tracer_lr in zip(state.lrs, saved["lr_tensors"], strict=True):
        if group["lr"] is not tracer_lr:
            raise JitError(
                "torchlax.jit: the compiled step assigns param_group['lr'] itself; the new "
                "value would be a constant of the program. Change learning rates with a "
                "torch.optim.lr_scheduler scheduler, or outside the compiled function."
            )


def _swap_in(state: _StateSet, state_arrays, lr_arrays) -> dict:
    """Put the program's tracers into the state objects; return what to restore."""
    ids = {id(s): i for i, s in enumerate(state.storages)}
    saved: dict[str, Any] = {
        "arrays": [s.array for s in state.storages],
        "storage_ids": ids,
        "grads": [p.grad for p in state.grads],
        "opt_state": {
            id(opt): {p: dict(v) for p, v in opt.state.items()} for opt in state.optimizers
        },
        "opt_dicts": {id(opt): dict(opt.state) for opt in state.optimizers},
        "lrs": [group["lr"] for group, _ in state.lrs],
        "capturable": [
            (group, group["capturable"])
            for opt in state.optimizers
            for group in opt.param_groups
            if "capturable" in group
        ],
    }
    # A .grad the step discards unread is no input: it holds a stand-in of its shape while
    # tracing (it is not None, so the step's Python takes the path it took when the grad was
    # fed and found unread).
    dead: list[Any] = [storage_of(state.grads[i].grad) for i in state.dead_grads]
    saved["dead"] = [(storage, storage.array) for storage in dead]
    for storage in dead:
        storage.array = jnp.zeros_like(storage.array)
    saved["grad_storage"] = [
        -1 if p.grad is None else ids.get(id(storage_of(p.grad)), -2) for p in state.grads
    ]
    for storage, array in zip(state.storages, state_arrays, strict=True):
        storage.array = array
    lr_tensors = []
    for (group, _), array in zip(state.lrs, lr_arrays, strict=True):
        group["lr"] = lr = Tensor(array)
        lr_tensors.append(lr)
    saved["lr_tensors"] = lr_tensors
    for group, _ in saved["capturable"]:
        # The optimizers' capturable code path keeps step counts and learning rates as
        # tensors (no host reads), as it does for CUDA graphs.
        group["capturable"] = True
    return saved


def _swap_out(state: _StateSet, saved: dict) -> None:
    for storage, array in zip(state.storages, saved["arrays"], strict=True):
        storage.array = array
    for storage, array in saved["dead"]:
        storage.array = array
    for p, grad in zip(state.grads, saved["grads"], strict=True):
        p.grad = grad
    for opt in state.optimizers:
        entries = saved["opt_state"][id(opt)]
        opt.state.clear()
        for p, original in saved["opt_dicts"][id(opt)].items():
            original.clear()
            original.update(entries[p])
            opt.state[p] = original
    for (group, _), lr in zip(state.lrs, saved["lrs"], strict=True):
        group["lr"] = lr
    for group, capturable in saved["capturable"]:
        group["capturable"] = capturable


def _defer_schedulers(schedulers) -> dict:
    """Inside the trace, a scheduler's step() is counted, and run on the host after the call."""
    recorded = {id(s): 0 for s in schedulers}
    for s in schedulers:

        def step(*args, _s=s, **kwargs):
            if args or kwargs:
                raise JitError(
                    "torchlax.jit: scheduler.step() with arguments (an epoch or a metric) "
                    "inside a compiled step is not supported; call it outside the step."
                )
            recorded[id(_s)] += 1

        s.step = step
    return recorded


def _undefer_schedulers(schedulers) -> None:
    for s in schedulers:
        del s.step


def _refuse_unfound_optimizers(state: _StateSet, jitted) -> RemovableHandle:
    """While the step is traced: an optimizer stepped that is not among the state raises.

    Its state tensors would be created or written inside the program without being its
    inputs or outputs: JAX values of a finished trace kept in ``opt.state`` (the next trace
    would read them as extra inputs the call does not pass). Checked once per trace, by a
    global optimizer pre-hook that only this thread's steps trip."""
    known = {id(opt) for opt in state.optimizers}
    thread = threading.get_ident()

    def refuse(opt, _args, _kwargs) -> None:
        if id(opt) not in known and threading.get_ident() == thread:
            raise JitError(
                f"{_owner(jitted)}: the step calls {type(opt).__name__}.step() on an optimizer "
                "that is not part of the compiled step's state: torchlax.jit finds optimizers "
                "and modules the function closes over, names as globals or receives as "
                "arguments, and those in the lists, tuples, dicts and objects' attributes "
                f"these hold (up to {MAX_STATE_DEPTH} levels deep, {MAX_CONTAINER_ITEMS} items "
                f"per container or object and {MAX_WALKED_ITEMS} in all; not inside data "
                "loaders, datasets, loggers or threads). Close over the optimizer directly, or "
                "pass it as an argument of the jitted function."
            )

    return register_optimizer_step_pre_hook(refuse)


def _refused_backward_error(trace: TraceWatch, jitted, args, kwargs) -> JitError:
    """The error for a ``backward()`` of the step that would give plain CPU leaves ``.grad``s,
    or a ``backward()`` or ``torch.autograd.grad()`` that would carry a gradient from the
    traced program to a plain CPU tensor (refused before it ran): naming the module, where a
    leaf given a ``.grad`` is the parameter of a module the trace called that is no state,
    else the first tensor, by the path the function reaches it (or as the step's own)."""
    owner = _owner(jitted)
    if not trace.refused_crossing:
        refused = {id(t) for t in trace.refused_leaves}
        untrained = trace.modules.error(owner, jitted.target, args, kwargs, refused)
        if untrained is not None:
            return untrained
    named = [
        (
            ChangedCpuTensor(
                t,
                written=False,
                grad_given=True,
                seen=None,
                by_backward=True,
                call=trace.refused_call,
                crossing=trace.refused_crossing,
                made=trace.made(t),
            ),
            None if trace.made(t) else path_to(t, jitted.target, args, kwargs),
        )
        for t in trace.refused_leaves
    ]
    return changed_cpu_tensor_error(owner, named)


def _argument_requiring_grad_error(jitted, inputs: list) -> JitError:
    """The error for a step that trains called with a tensor argument that requires grad."""
    k, t = next((k, t) for k, t in enumerate(inputs) if t.requires_grad)
    described = described_tensor(t)
    return JitError(
        f"{_owner(jitted)}: tensor argument {k} ({described}) requires grad, and the step "
        "trains: eagerly its backward() would give that tensor a .grad (or carry gradients "
        "into the graph it was computed by), but an argument is an input of the compiled "
        "program, traced as a value that does not require grad, and no gradient is given back "
        "to it. Close over the tensor or register it in a module as a parameter (then it is "
        "part of the step's state and its .grad is written back), or pass it detached "
        "(tensor.detach())."
    )


def _leaked_tracer_error(jitted) -> JitError:
    name = getattr(jitted.target, "__qualname__", repr(jitted.target))
    return JitError(
        f"torchlax.jit({name}): a tensor from another (finished) trace reached this program. "
        "A value computed inside a compiled function was kept outside it (stored on an object "
        "torchlax does not track as state, or a global list). Return such values from the "
        "function instead, or keep them in a module buffer, an optimizer or a torchlax Tensor "
        "the function closes over."
    )


def _merge(mask, diff, other) -> list:
    diff, other = iter(diff), iter(other)
    return [next(diff) if m else next(other) for m in mask]


def _dense_order(x: torch.Tensor) -> tuple[int, ...] | None:
    """The memory order of a traced output that eager PyTorch lays out densely other than
    row-major (``x.t() * 2``: TensorIterator follows its operand), else None. Such an output
    is returned in that order and viewed back, so the caller sees eager PyTorch's strides; an
    output with gaps (a slice) comes back row-major."""
    if not isinstance(x, Tensor) or x.is_contiguous():
        return None
    return memory_order(tuple(x.shape), x.stride())


def _input_layouts(inputs: list) -> tuple | None:
    """Per input tensor, None (row-major) or ``(strides, order)``: the strides it is traced
    with (``_traced_strides``) and, for a torchlax Tensor densely laid out other than
    row-major (``x.t()``), the memory order its array is passed in (its storage array: no
    transpose, in or out of the program), else None (its value is passed). None when every
    input is row-major (the common call: one ``is_contiguous`` per input)."""
    if all(t.is_contiguous() for t in inputs):
        return None
    layouts = tuple(None if t.is_contiguous() else _input_layout(t) for t in inputs)
    return layouts if any(s is not None for s in layouts) else None


# (sizes, strides, whether a torchlax Tensor) -> _input_layout's answer (``memory_order`` is
# Python arithmetic, ~15 us: a call with transposed inputs must not pay it each time)
_input_layout_cache: dict = {}


def _input_layout(t: torch.Tensor):
    key = (t.shape, t.stride(), type(t) is Tensor)
    if key in _input_layout_cache:
        return _input_layout_cache[key]
    strides = _traced_strides(t)
    layout = None
    if strides is not None:
        dense = memory_order(tuple(t.shape), t.stride()) if isinstance(t, Tensor) else None
        layout = (strides, dense)
    if len(_input_layout_cache) < 4096:
        _input_layout_cache[key] = layout
    return layout


def _input_arrays(inputs: list, layouts: tuple | None) -> list:
    """The program's input arrays: each tensor's value, or its elements in memory order where
    its layout says so (``_input_layouts``)."""
    if layouts is None:
        return [t.jax() if isinstance(t, Tensor) else _borrow(t) for t in inputs]
    arrays = []
    for t, layout in zip(inputs, layouts, strict=True):
        if layout is not None and layout[1] is not None:
            arrays.append(memory_ordered_array(t, layout[1])[0])  # pyright: ignore[reportOptionalSubscript]  (dense: never None)
        else:
            arrays.append(t.jax() if isinstance(t, Tensor) else _borrow(t))
    return arrays


def _traced_input(array, strides: tuple[int, ...], order: tuple[int, ...] | None) -> Tensor:
    """An input inside the trace, laid out with ``strides``; ``array`` holds its elements in
    memory ``order`` when that is given, else its value."""
    if order is None:
        return laid_out(array, strides)
    return stored_in_order(array, order, strides)


def _input_order(layout) -> tuple[int, ...] | None:
    return None if layout is None else layout[1]


def _traced_strides(t: torch.Tensor) -> tuple[int, ...] | None:
    """Dense strides in the dimension order of ``t``'s strides (its own, for a transposed or
    permuted tensor; for a slice, those of a dense tensor of the same order: TensorIterator
    only compares strides), or None for row-major order, an empty tensor, or a broadcast one
    (a stride-0 dimension tells TensorIterator nothing, a dense order would)."""
    shape, strides = tuple(t.shape), t.stride()
    if 0 in shape or any(s == 0 and n > 1 for n, s in zip(shape, strides, strict=True)):
        return None
    return dense_strides_in_order(shape, strides)


def _traced_array(x: torch.Tensor):
    if isinstance(x, Tensor):
        return x.jax()
    return from_torch(x).jax()  # a constant the function made on the CPU


class _Jitted:
    def __init__(self, target, static_argnums, static_argnames, donate_state: bool):
        self.target = target
        self.module = target if isinstance(target, torch.nn.Module) else None
        self.static_argnums = static_argnums
        self.static_argnames = static_argnames
        self.donate_state = donate_state
        self.programs: dict[Any, _Program] = {}
        self._first_call = True
        self._layout: _Layout | None = None  # where the state lives (re-checked each call)
        self._tensor_args_specs: dict[int, tuple] = {}
        self._last_state: tuple | None = None  # (state arrays, their signature)
        # (layout, info, the _write_plan of both, the signature of the state it writes)
        self._plan: tuple | None = None
        # program key -> positions (in the state's grads) of .grads the step discards unread
        self._dead_grads: dict[Any, tuple[int, ...]] = {}
        # The last call, if it was a forward that the next call may repeat cheaply
        self._repeat: _RepeatedForward | _RepeatedStep | None = None
        self._cpu_outputs = False  # set while a call over lent CPU state runs
        # set while the first call compiles the next call's program ahead (_jit_first_call)
        self._compile_only = False
        self.__wrapped__ = target

    @property
    def compilations(self) -> int:
        """XLA compilations this callable has made (one per program and input signature)."""
        return sum(
            p.core.compilations + p.forward_core.compilations for p in list(self.programs.values())
        )

    def _run(self, cpu_state: dict, args, kwargs):
        if self.module is None:
            return self.target(*args, **kwargs)
        if cpu_state:
            # A module on the CPU: its tensors are replaced by torchlax Tensors of the program.
            return torch.func.functional_call(
                self.module, cpu_state, args, kwargs, tie_weights=True, strict=False
            )
        return self.module(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        check_shared_writes()
        with _trace_lock:
            repeat = self._repeat
            if repeat is not None:
                if not kwargs:
                    out = repeat.call(self, args)  # (outside x64(): see its docstring)
                    if out is not _MISSED:
                        return out
                self._repeat = None  # the general path records this call if it is a repeat
            check_jit_arguments(args, kwargs)  # a sparse or quantized tensor, named
            with x64():
                try:
                    return self._call(args, kwargs)
                except CpuStateError as error:
                    return self._call_on_cpu_state(args, kwargs, error.found)

    def _call_on_cpu_state(self, args, kwargs, found: list):
        """A step over CPU parameters: their memory is lent to the program (DLPack), and the
        new state is written back into the same tensor objects, as an in-place step does."""
        tensors, optimizers = cpu_state_tensors(found)
        # The program must not reuse memory that torch owns.
        self.donate_state = False
        self._layout = None
        lent = []
        try:
            for t in tensors:
                grad = t.grad if t.is_leaf else None
                array = _borrow(t)
                promoted = Tensor(array, requires_grad=t.requires_grad)
                # The very objects the model and optimizer name become torchlax Tensors for
                # the call (identity, opt.state keys and module attributes unchanged).
                t.grad = None
                try:
                    torch.utils.swap_tensors(t, promoted)
                except RuntimeError as exc:
                    t.grad = grad
                    raise JitError(
                        f"torchlax.jit: cannot lend the CPU tensor of shape {tuple(t.shape)} "
                        f"(a parameter, buffer or optimizer state) to the compiled step: {exc} "
                        "Move the model to the 'jax' device before creating the optimizer "
                        "(model.to('jax') inside torchlax.enable())."
                    ) from exc
                lent.append((t, promoted, array))
                if grad is not None:
                    t.grad = Tensor(_borrow(grad))
            args, kwargs = pytree.tree_map_only(
                torch.Tensor,
                lambda x: x if isinstance(x, Tensor) else Tensor(_borrow(x)),
                (args, kwargs),
            )
            self._cpu_outputs = True
            out = self._call(args, kwargs)
        finally:
            self._cpu_outputs = False
            self._layout = None  # found over the lent tensors: stale once they are given back
            for t, cpu, array in reversed(lent):
                new, grad = array_of(t), t.grad
                t.grad = None
                torch.utils.swap_tensors(t, cpu)
                if new is not array:
                    with torch.no_grad():
                        t.copy_(torch.from_dlpack(new))  # in place: bumps _version
                if grad is not None:
                    t.grad = grad.cpu()
            for opt in optimizers:  # state the step created (on its first, eager, call)
                for entries in opt.state.values():
                    for name, value in list(entries.items()):
                        if isinstance(value, Tensor):
                            entries[name] = value.cpu()
        return pytree.tree_map_only(Tensor, lambda x: x.cpu(), out)

    # -- calling -----------------------------------------------------------------------------

    def _call(self, args, kwargs):  # noqa: C901  (the jit restructuring rewrites it)
        call_args = args, kwargs
        leaves, tensors_only = arg_leaves(args, kwargs)
        layout = self._layout
        if layout is None or not layout.holds(leaves):
            layout = self._layout = find_state(self.target, self.module, leaves)
        state = layout.assemble()
        if self._first_call:
            self._first_call = False
            if _optimizer_state_missing(state.optimizers):
                # (first-call hook: compiled, and the next call's program compiled ahead)
                return _jit_first_call.first_call(self, state, args, kwargs)
        args, kwargs, static_values = self._split_static(args, kwargs)
        if tensors_only and not self.static_argnums:
            # Tensors only, positionally (the common call): no pytree walk.
            inputs, in_spec, spec_key = leaves, *self._tensor_args_spec(len(leaves))
            statics = key_statics = (_SLOT,) * len(leaves)
        else:
            flat, in_spec = pytree.tree_flatten((args, kwargs))
            inputs = [x for x in flat if isinstance(x, torch.Tensor)]
            statics = tuple(_SLOT if isinstance(x, torch.Tensor) else x for x in flat)
            spec_key = str(in_spec)
            key_statics = layout.keyed_statics(statics)
        checks = bool(torchlax_core.current_env().config.checked)
        in_layouts = _input_layouts(inputs)
        program_key = (
            spec_key,
            key_statics,
            static_values,
            state.structure(),
            torch.is_grad_enabled(),
            checks,
            in_layouts,
        )
        try:
            # (a forward never has dead .grads: no second hash of its key)
            dead_grads = self._dead_grads.get(program_key) if self._dead_grads else None
            if dead_grads:
                state = state.without_grads(dead_grads)
                program_key = (*program_key, dead_grads)
            program = self.programs.get(program_key)
        except TypeError:
            raise JitArgumentError(
                "torchlax.jit treats non-tensor arguments as static values, which must be "
                "hashable; got an unhashable one. Pass arrays as tensors and other values as "
                "hashable Python objects (tuples, not lists)."
            ) from None
        if program is None:
            with _trace_lock:
                program = self.programs.setdefault(
                    program_key,
                    _Program(self, in_spec, statics, static_values, checks, in_layouts),
                )
        cpu_tensors = list(state.cpu_tensors.values())
        state_arrays = [s.array for s in state.storages]
        lr_arrays = [to(lr) for (_, lr), to in zip(state.lrs, state.lr_types, strict=True)]
        arrays = [_borrow(t) for t in cpu_tensors] + _input_arrays(inputs, in_layouts)
        on_jax = bool(state.storages) or any(isinstance(t, Tensor) for t in inputs)
        signature = (self._state_signature(state_arrays), _signature(arrays))
        # A step that trains runs the donating program; a function that only computes, the
        # forward program. Which one is learned by the first trace (guessed from whether
        # there are optimizers) and checked on each new signature.
        forward = program.trains is False or (program.trains is None and not state.optimizers)
        if not forward:
            state_arrays = _distinct(state_arrays)
        entry = program.entry(signature, state, (state_arrays, lr_arrays, arrays), forward)
        info: _Info = entry.info
        if info.trains == forward:
            forward = not info.trains
            if not forward:
                state_arrays = _distinct(state_arrays)
            entry = program.entry(signature, state, (state_arrays, lr_arrays, arrays), forward)
        program.trains = info.trains
        if info.trains and any(t.requires_grad for t in inputs):
            raise _argument_requiring_grad_error(self, inputs)
        if info.trains and entry.jaxpr is not None:  # no jaxpr kept in checked mode
            if dead_grads is None:
                # The first trace of this step: which .grads does it discard unread? Later
                # calls (this one too, traced again: the program was not compiled yet) leave
                # them out.
                dead = _unread_grads(entry, state)
                self._dead_grads[program_key] = dead
                if dead:
                    del self.programs[program_key]  # never compiled: the next one replaces it
                    return self._call(*call_args)
        if self._compile_only:  # (first-call hook: compile this call's program, run nothing)
            return _jit_first_call.compile_only(entry)

        all_tensors: list = []
        mask: tuple[bool, ...] = ()
        if not info.trains and torch.is_grad_enabled():
            all_tensors = list(state.owners) + cpu_tensors + inputs
            mask = tuple(t.requires_grad and _inexact(t) for t in all_tensors)
        if any(mask) or (info.reads_host_grad and torch.is_grad_enabled() and not info.trains):
            if info.eager_backward:
                return self._forward_with_backward_hooks(program, info, *call_args)
            diff = [t for t, m in zip(all_tensors, mask, strict=True) if m]
            call = _Call(
                program,
                info,
                state,
                mask,
                state_arrays + arrays,
                lr_arrays,
                entry,
                entry.key(),
                on_jax,
                all_tensors,
                ()
                if in_layouts is None
                else (None,) * (len(all_tensors) - len(inputs))
                + tuple(map(_input_order, in_layouts)),
            )
            outputs = _JitFunction.apply(call, *diff)
        elif forward:

            def write_changed(results) -> None:
                if info.writes:
                    self._last_state = None
                    _write_changed(state, info, results[1], results[2])

            out_arrays = launch_and_write(
                lambda out: out.append(
                    program.forward_core.run(entry, state_arrays, lr_arrays, arrays)
                ),
                write_changed,
            )[0]
            outputs = _to_tensors(out_arrays, on_jax, arrays, info.out_orders)
            if (
                not info.writes
                and tensors_only
                and not self.static_argnums
                and not cpu_tensors
                and not state.lrs
                and not torch.is_grad_enabled()
                and layout.reused(state)
                and all(isinstance(t, Tensor) for t in inputs)
                and in_layouts is None  # (row-major inputs: a repeat checks they still are)
            ):
                self._repeat = _RepeatedForward(
                    layout,
                    state,
                    tuple(map(type, inputs)),
                    signature[1],
                    tuple(getattr(a, "aval", None) for a in arrays),
                    checks,
                    program.forward_core,
                    entry,
                    info,
                    None if info.out_orders else _plain_result_specs(outputs, out_arrays),
                )
        else:
            last_plan = self._plan
            plan: tuple = (
                last_plan
                if last_plan is not None and last_plan[0] is layout and last_plan[1] is info
                else (layout, info, _write_plan(state, info), None)
            )
            dead = [state.grads[i] for i in state.dead_grads]
            dead_grads = list(map(_GRAD, dead))
            stepped = [0] * len(state.schedulers)

            def launch(out: list) -> None:
                for p in dead:
                    p.grad = None  # dropped before the program runs: not alive in it
                # Check errors are raised before any output or state is written back.
                out.append(program.core.run(entry, state_arrays, lr_arrays, arrays))

            def write(results) -> None:
                new_storages = results[1]
                _write_state(state, info, new_storages, results[2], plan[2])
                # The executable's outputs have the same signature every call: the next
                # call's state (these arrays, unless something replaces one) is not re-read.
                out_sig = plan[3] or _Hashed(_signature(new_storages))
                self._plan = (*plan[:3], out_sig)
                self._last_state = (new_storages, out_sig)
                _step_schedulers(state, info, stepped)

            out_arrays = launch_and_write(launch, write, lambda: _put_grads(dead, dead_grads))[0]
            outputs = _to_tensors(out_arrays, on_jax, arrays, info.out_orders)
            written_plan: tuple = self._plan  # pyright: ignore[reportAssignmentType]  (write() set it)
            if (
                tensors_only
                and not self.static_argnums
                and not checks
                and not cpu_tensors
                and not self._cpu_outputs
                and in_layouts is None  # (row-major inputs: a repeat checks they still are)
                and all(isinstance(t, Tensor) for t in inputs)
                and _next_state_is(layout, state)
            ):
                self._repeat = _RepeatedStep(
                    layout,
                    state,
                    tuple(map(type, inputs)),
                    signature[1],
                    torch.is_grad_enabled(),
                    program.core,
                    entry,
                    info,
                    written_plan[2],
                    written_plan[3],
                    None if info.out_orders else _plain_result_specs(outputs, out_arrays),
                )
        if state.schedulers and not info.trains:  # (a step's are made by its write-back)
            _step_schedulers(state, info, [0] * len(state.schedulers))
        if self._cpu_outputs and info.rebuilds:
            # A step over lent CPU state returns CPU tensors; those inside returned objects
            # are put in place as such (the caller converts only the pytree's leaves).
            outputs = [o.cpu() if isinstance(o, Tensor) else o for o in outputs]
        return _returned(info, outputs)

    def _forward_with_backward_hooks(self, program: _Program, info: _Info, args, kwargs):
        """A differentiable call of a forward that met backward hooks or read a plain CPU tensor
        requiring grad, run eagerly.

        Its ``backward()`` would be ``jax.vjp`` of the program, where no PyTorch hook runs
        (a full backward hook scaling ``grad_input`` would silently not scale it) and a CPU
        tensor is a constant (it would silently get no ``.grad``); run eagerly, the hooks run
        where PyTorch runs them and the gradients are eager PyTorch's.
        Calls without grad, and steps that call ``backward()`` themselves (the backward is
        then traced, hooks included), stay compiled."""
        if self._cpu_outputs:
            raise JitError(
                f"{_owner(self)}: the forward meets {info.eager_backward[0]}; a backward after "
                "a compiled call of a step over CPU state would not do that. Move the model to the 'jax' device (model.to('jax') inside "
                "torchlax.enable()), or call backward() inside the jitted function."
            )
        if not program.logged_eager:
            program.logged_eager = True
            _log.info(
                "%s: runs eagerly while autograd records: the forward meets %s (calls without "
                "grad, or with backward() inside the jitted function, are compiled)",
                _owner(self),
                info.eager_backward[0],
            )
        with torchlax_core.enable(torchlax_core.current_env()):
            return self.target(*args, **kwargs)

    def _state_signature(self, arrays: list) -> _Hashed:
        # The state's arrays are those of the last call unless a step or the user replaced
        # one: then their signature is too (kept only while they are the live state, so no
        # replaced array is held alive).
        last = self._last_state
        if last is not None and len(last[0]) == len(arrays) and all(map(is_, arrays, last[0])):
            return last[1]
        sig = _Hashed(_signature(arrays))
        self._last_state = (arrays, sig)
        return sig

    def _tensor_args_spec(self, n: int) -> tuple:
        spec = self._tensor_args_specs.get(n)
        if spec is None:
            in_spec = pytree.tree_flatten((tuple(range(n)), {}))[1]
            spec = self._tensor_args_specs[n] = (in_spec, str(in_spec))
        return spec

    def _split_static(self, args, kwargs):
        static_values = []
        if self.static_argnums:
            args = list(args)
            for i in self.static_argnums:
                if i < len(args):
                    static_values.append(args[i])
                    args[i] = _STATIC
            args = tuple(args)
        if self.static_argnames:
            kwargs = dict(kwargs)
            for name in self.static_argnames:
                if name in kwargs:
                    static_values.append(kwargs[name])
                    kwargs[name] = _STATIC
        return args, kwargs, tuple(static_values)


def _returned(info: _Info, outputs: list):
    """What the function returned, with the program's output tensors in their places."""
    if info.single_output:
        return outputs[0]
    if info.rebuilds:
        return _returned_with_objects(info, outputs)
    if info.out_spec.is_leaf():
        return info.out_statics[0]
    it = iter(outputs)
    flat_out = [next(it) if s is _SLOT else s for s in info.out_statics]
    return pytree.tree_unflatten(flat_out, info.out_spec)


def _returned_with_objects(info: _Info, outputs: list):
    """``_returned`` where some output leaves are objects: each gets a fresh copy holding its
    tensors of this call."""
    flat_out = []
    at = 0
    for s in info.out_statics:
        if s is _SLOT:
            flat_out.append(outputs[at])
            at += 1
        elif isinstance(s, ObjectOutput):
            flat_out.append(s.rebuilt(outputs[at : at + s.n]))
            at += s.n
        else:
            flat_out.append(s)
    return pytree.tree_unflatten(flat_out, info.out_spec)


def _output_plan(out, out_flat: list, stateful: set, jitted) -> tuple[tuple, list]:
    """Per output leaf, ``_SLOT`` (a tensor), an ``ObjectOutput`` (an object holding tensors
    computed in the trace: they are outputs too) or the leaf (a constant); and the output
    tensors, in the program's order."""
    statics: list = []
    tensors: list = []
    for i, x in enumerate(out_flat):
        if isinstance(x, torch.Tensor):
            statics.append(_SLOT)
            tensors.append(x)
            continue
        found = find_object_output(x, lambda i=i: _leaf_name(out, i), stateful, _owner(jitted))
        if found is None:
            statics.append(x)
        else:
            statics.append(found[0])
            tensors.extend(found[1])
    return tuple(statics), tensors


def _leaf_name(out, i: int) -> str:
    """The ``i``-th output leaf's path, as ``output['past_key_values']`` (for errors)."""
    try:
        path = pytree.tree_flatten_with_path(out)[0][i][0]
    except Exception:  # a node type registered without key paths
        return f"output leaf {i}"
    return "output" + pytree.keystr(path)


def _owner(jitted) -> str:
    return f"torchlax.jit({getattr(jitted.target, '__qualname__', type(jitted.target).__name__)})"


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

    What it costs: on 2 cores our Python competes with XLA's two compute threads, so each
    microsecond of it, before or after the launch, delays the result about as much (a 40 us
    busy loop after the launch: +37 us until ready). A call follows an XLA computation, which
    left the caches cold: each frame, attribute lookup and PyTorch call costs several times
    its warm cost (the whole call with its launch memoised: ~14 us warm in a loop, ~40 us
    inside calls), so what counts is how much code and data a call touches. MLP forward
    (256 -> 512 -> 512 -> 10, batch 64), interleaved call by call with the hand-written JAX
    forward in one process, loaded 2-core machine (load 7-13), session 15's call against
    this one in the same process, two sittings of three runs of 1500 rounds: thread CPU until
    the call returns min 82-93 -> 62-74 us, median 127-164 -> 108-132 us (JAX's whole call
    30-36 / 58-68); inside calls, min: the launch ~27-29 us (JAX's whole call ~30-34), the
    guard and checked mode after it ~12-15, the checks before it ~7-8, the wrapper ~2
    (benchmarks/README.md, "Session 16";
    ``benchmarks/jit_call_parts.py`` times the call's parts). Each kind of read the guard
    makes costs about what the memory it reads again costs (each parameter's autograd state
    for ``requires_grad`` and ``.grad``: ~5 us for the MLP's six; the module dicts ~10 us
    median, loaded), so the same reads in another shape gain nothing: folded into the pass
    before the launch, dicts iterated instead of keyed, this call as a closure over locals,
    measured in one process beside this form: no faster (session 17). A C++ check of the
    layout's objects (Dynamo's guard manager) measured no faster in such calls, only in a
    warm loop (session 13)."""

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


def _plain_result_specs(outputs: list, out_arrays: list) -> list | None:
    """``result_specs`` of a call's outputs when each is a root torchlax Tensor of its array
    (what ``wrap_results_like`` makes), else None."""
    if all(map(is_root_of, outputs, out_arrays)):
        return result_specs(outputs, out_arrays)
    return None


def _unread_grads(entry: Entry, state: _StateSet) -> tuple[int, ...]:
    """Positions of the ``.grad``s whose arrays the traced step never reads (it sets them to
    ``None`` first) and only hands back unchanged."""
    assert entry.jaxpr is not None
    jaxpr = entry.jaxpr.jaxpr
    info: _Info = entry.info
    n_state = len(state.storages)
    n_outs = info.n_outputs
    invars = jaxpr.invars[:n_state]
    read = {id(v) for eqn in jaxpr.eqns for v in eqn.invars}
    for i, v in enumerate(jaxpr.outvars):
        if not n_outs <= i < n_outs + n_state or v is not invars[i - n_outs]:
            read.add(id(v))  # an output other than its own storage's unchanged value
    kept = {index for kind, index in info.grad_slots if kind == _KEPT}
    kept.update(
        index
        for slots in info.opt_slots
        for entries in slots
        for _, kind, index in entries
        if kind == _KEPT
    )
    index = {id(s): i for i, s in enumerate(state.storages)}
    dead = []
    for position, p in enumerate(state.grads):
        if not isinstance(p.grad, Tensor):
            continue
        i = index[id(storage_of(p.grad))]
        if id(invars[i]) not in read and i not in kept and state.owners[i] is p.grad:
            dead.append(position)
    return tuple(dead)


def _distinct(arrays: list) -> list:
    # A buffer donated to the program may be passed once only; two state tensors holding the
    # very same array (one made from the other's .jax()) each get their own.
    if len(set(map(id, arrays))) == len(arrays):
        return arrays
    seen: set = set()
    out = []
    for a in arrays:
        if id(a) in seen:
            a = jnp.array(a, copy=True)
        seen.add(id(a))
        out.append(a)
    return out


def _optimizer_state_missing(optimizers) -> bool:
    """Whether a first step would create optimizer state or gradients (then it runs eagerly)."""
    return any(
        not opt.state.get(p) or p.grad is None
        for opt in optimizers
        for g in opt.param_groups
        for p in g["params"]
    )


def _inexact(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()


def _to_tensors(arrays, on_jax: bool, inputs, orders: tuple = ()) -> list[torch.Tensor]:
    outputs = output_tensors(arrays, on_jax, lambda arrays, _: _give_back(arrays, inputs))
    for i, order in enumerate(orders):
        if order is not None:
            outputs[i] = viewed_back(outputs[i], order)
    return outputs


def _write_state(state: _StateSet, info: _Info, new_storages, extra, plan: list) -> list:
    """Put one call's new state into the objects it belongs to (``plan``: ``_write_plan``).
    Returns the ``.grad`` it leaves on each parameter of ``state.grads`` (reading them back
    costs a property read per parameter)."""
    for storage, array in zip(state.storages, new_storages, strict=True):
        storage.array = array  # changed, or donated: the program's output is the live array
    owners = state.owners
    grads = []
    for p, kind, index in plan[0]:
        if kind == _NEW:
            grad = Tensor(extra[index])
            p.grad = grad  # (a new tensor: no need to read whether p holds it already)
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
        value = None if kind == _NONE else Tensor(extra[index])
        if values.get(name) is not value:
            values[name] = value
    _write_cpu_buffers(state, info, extra)
    return grads


def _write_plan(state: _StateSet, info: _Info) -> list:
    """Where ``_write_state`` puts each ``.grad`` and optimizer state value of ``info``'s
    program: ``[(param, kind, index), ...]``, ``[(state dict, name, kind, index), ...]`` of
    the entries that become ``None`` or new tensors, and ``(state dicts, names, indices, their
    get)`` of those that keep their tensors (the state's owner at each index; flat, so that a step
    checks them all in one C-level pass: they are in place already after the first call).
    It holds while the state's layout does (which checks the optimizers' state dicts)."""
    grads = [
        (p, kind, index) for p, (kind, index) in zip(state.grads, info.grad_slots, strict=True)
    ]
    entries = []
    for opt, slots in zip(state.optimizers, info.opt_slots, strict=True):
        params = [p for g in opt.param_groups for p in g["params"]]
        for p, row in zip(params, slots, strict=True):
            if row:
                values = opt.state[p]
                entries.extend((values, name, kind, index) for name, kind, index in row)
    kept = [(values, name, index) for values, name, kind, index in entries if kind == _KEPT]
    others = [entry for entry in entries if entry[2] != _KEPT]
    dicts = tuple(values for values, _, _ in kept)
    flat_kept = (
        dicts,
        tuple(name for _, name, _ in kept),
        tuple(index for _, _, index in kept),
        # (an optimizer keeping its state in another mapping type: that type's get)
        dict.get if all(isinstance(d, dict) for d in dicts) else _mapping_get,
    )
    return [grads, others, flat_kept]


def _mapping_get(mapping, key):
    return mapping.get(key)


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
    with torch.no_grad():
        for t, changed in zip(state.cpu_tensors.values(), info.cpu_changed, strict=True):
            if changed:
                t.copy_(torch.from_dlpack(jnp.array(next(cpu_new), copy=True)))


@dataclasses.dataclass
class _Call:
    """One differentiable call: what its backward needs."""

    program: _Program
    info: _Info
    state: _StateSet
    mask: tuple[bool, ...]
    arrays: list  # state arrays, then CPU module tensors and inputs
    lr_arrays: list
    entry: Entry  # of the forward program
    key: Any
    on_jax: bool
    tensors: list
    # per tensor: the memory order its array was passed in (its gradient comes in that order),
    # or None; empty when every array is a value
    orders: tuple = ()
    vjp: Any = None
    out_arrays: Any = None


class _JitFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, call: _Call, *diff_tensors):
        program = call.program
        n_state = len(call.state.storages)
        if program.saves_residuals:
            diff = [a for a, m in zip(call.arrays, call.mask, strict=True) if m]
            other = [a for a, m in zip(call.arrays, call.mask, strict=True) if not m]
            with _trace_lock:
                program._state = call.state
                outs, new_storages, extra, error, vjp = program.forward_vjp(
                    call.mask,
                    torch.get_float32_matmul_precision(),
                    diff,
                    other,
                    call.lr_arrays,
                    call.arrays[n_state:],
                    call.key,
                )
            if error is not None:
                raise_error(error)  # before any output or state is written back
            call.vjp = vjp
        else:
            # The plain forward; backward() recomputes it (this call's key: same dropout).
            outs, new_storages, extra = program.forward_core.run(
                call.entry,
                call.arrays[:n_state],
                call.lr_arrays,
                call.arrays[n_state:],
                key=call.key,
            )
        call.out_arrays = outs
        ctx.call = call
        outputs = _to_tensors(outs, call.on_jax, call.arrays, call.info.out_orders)
        if call.info.writes:
            program.jitted._last_state = None  # pyright: ignore[reportPrivateUsage]  (its own module)
            _write_changed(call.state, call.info, new_storages, extra)
        ctx.mark_non_differentiable(*[o for o in outputs if not _inexact(o)])
        ctx.set_materialize_grads(False)
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grads):
        call: _Call = ctx.call
        if torch.is_grad_enabled():  # create_graph=True: the gradients would be constants
            raise JitError(
                "torchlax.jit: double backward (create_graph=True, or torch.autograd.grad of a "
                "gradient) through a jitted call is not supported: its backward is a JAX "
                "program that autograd cannot differentiate. Call the function without "
                "torchlax.jit for higher-order gradients, or use jax.grad via torchlax.call_torch."
            )
        orders = call.info.out_orders or (None,) * len(grads)
        # Inside JAX's 64-bit mode, as the forward ran: backward() runs after the call, outside
        # its x64() (on the CPU, on the caller's thread), where a float64 cotangent (its
        # astype, or the zeros of an output with no gradient) would narrow to float32.
        with x64():
            cotangents = [
                _cotangent(out, g, order)
                for out, g, order in zip(call.out_arrays, grads, orders, strict=True)
            ]
            if call.vjp is not None:
                (grad_arrays,) = call.program.backward(call.vjp, cotangents)
            else:
                call.program.saves_residuals = True  # a backward follows this forward
                backward = call.program.recomputing_backward(call.entry, call.mask)
                diff = [a for a, m in zip(call.arrays, call.mask, strict=True) if m]
                other = [a for a, m in zip(call.arrays, call.mask, strict=True) if not m]
                grad_arrays = backward(diff, other, call.lr_arrays, call.key, cotangents)
        diff = [t for t, m in zip(call.tensors, call.mask, strict=True) if m]
        if call.orders:
            orders = [o for o, m in zip(call.orders, call.mask, strict=True) if m]
            grad_arrays = [
                g if o is None else jnp.transpose(g, [int(d) for d in np.argsort(o)])
                for g, o in zip(grad_arrays, orders, strict=True)
            ]
        results = []
        for grad, tensor in zip(grad_arrays, diff, strict=True):
            if isinstance(tensor, Tensor):
                results.append(torchlax_core.wrap(grad))
            else:
                results.append(_give_back([grad], [])[0].to(tensor.device))
        return (None, *results)


def _cotangent(out, grad, order=None):
    """The cotangent of the program's output ``out`` (returned in memory ``order``, if any)."""
    if not jnp.issubdtype(out.dtype, jnp.inexact):
        return np.zeros(out.shape, dtype=jax.dtypes.float0)
    if grad is None:
        return jnp.zeros(out.shape, out.dtype)
    array = grad.jax() if isinstance(grad, Tensor) else _borrow(grad)
    if order is not None:
        array = jnp.transpose(array, order)
    return array.astype(out.dtype)
