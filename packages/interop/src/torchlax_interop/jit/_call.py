"""``jit()`` and the jitted callable: the path one call takes. A repeated call runs the last
plan where its guard holds (``_repeated``); the general path (``_Jitted._call``) finds the
state (``_state``), the program for the call's static configuration (``_program``) and its
entry for the signature (``_Run``), and runs that entry's plan (docs/architecture.md,
"torchlax.jit's stages"). A step over CPU parameters lends them to the program (``_lent``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from itertools import repeat
from operator import is_
from typing import Any

import torch
import torchlax_core
from torch.utils import _pytree as pytree
from torchlax_core import JitArgumentError, JitError, Tensor
from torchlax_core.internal import LastPlan, array_of, write_back, x64
from torchlax_core.internal import signature as _signature

from .._arguments import check_jit_arguments, check_static_argnames, check_static_argnums
from .._call_jax import _borrow
from .._dlpack import check_shared_writes
from . import _first_call
from ._discover import CpuStateError, cpu_state_tensors, find_state
from ._discover import _move_cpu_state_to_jax as move_cpu_state_to_jax
from ._inputs import _SLOT, _STATIC, _inexact, _input_arrays, _input_layouts
from ._program import _Program, _trace_lock, _unread_grads, without_dead_grads
from ._refusals import _argument_requiring_grad_error
from ._repeated import _MISSED, _ForwardPlan, _StepPlan, lr_arrays
from ._state import _Hashed, _Layout, arg_leaves, set_capturable


def jit(
    fn_or_module: Callable | torch.nn.Module,
    *,
    static_argnums: int | Sequence[int] | None = (),
    static_argnames: str | Sequence[str] | None = (),
    donate_state: bool = True,
) -> Callable:
    """Compile ``fn_or_module`` with ``jax.jit``; the result is called like the original.

    It takes and returns torchlax Tensors (or CPU tensors: then a CPU model and optimizer are
    lent to the program for each call and written back in place). Tensors in the arguments are
    program inputs; other leaves are static (a new value, shape or dtype compiles a new
    program), as are the arguments ``static_argnums``/``static_argnames`` name (hashable).

    State is an input, not a constant: the parameters, buffers and ``.grad``s of every module
    the function receives or closes over, and each optimizer's state tensors and learning
    rates. So a whole training step compiles into one program::

        def step(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            sched.step()
            return loss

        step = torchlax.jit(step)

    What the program changes is written back after the call; the old buffers are donated to it
    (``donate_state=False`` keeps arrays you hold from ``tensor.jax()`` alive). A new learning
    rate compiles nothing, another hyperparameter a new program; a scheduler's ``step()`` runs
    after the program, on the host. Random ops draw a key per call from torch's generator
    (``torch.manual_seed`` reproduces them); ``train()``/``eval()`` select another program.
    Autograd works across a call that changes no state (``jax.vjp`` of the program). More in
    docs/training.md.
    """

    static_argnums = check_static_argnums(static_argnums)
    static_argnames = check_static_argnames(static_argnames)
    return _Jitted(fn_or_module, static_argnums, static_argnames, donate_state)


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
        self._state_sig: tuple = ((), _Hashed(()))  # the state arrays' avals, their signature
        self._plans: dict[bool, Any] = {}  # run.forward -> the last plan of that kind (_plan)
        # program key -> positions (in the state's grads) of .grads the step discards unread,
        # and the key whose program it runs where that is the state's without them
        # (without_dead_grads)
        self._dead_grads: dict[Any, tuple[int, ...]] = {}
        self._dead_keys: dict[Any, tuple] = {}
        self._last = LastPlan()  # the plan a repeated call may take (_repeated)
        self._cpu_outputs = False  # set while a call over lent CPU state runs
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
            last = self._last
            plan = last.plan
            if plan is not None:
                if not kwargs:
                    out = plan.call(self, args)  # (outside x64(): see its docstring)
                    if out is not _MISSED:
                        return out
                last.plan = None  # the general path records this call if it is a repeat
            check_jit_arguments(args, kwargs)  # a sparse or quantized tensor, named
            with x64():
                return self._call(args, kwargs)

    # -- calling -----------------------------------------------------------------------------

    def _call(self, args, kwargs):
        try:
            leaves, plain, layout = self._layout_of(args, kwargs)
        except CpuStateError as error:
            # A step over CPU parameters: the call over them lent to the program.
            with _lent(self, error.found):  # (each CPU tensor argument over its memory)
                out = self._call(*pytree.tree_map_only(torch.Tensor, _borrowed, (args, kwargs)))
            return pytree.tree_map_only(Tensor, lambda x: x.cpu(), out)
        if self._first_call:
            self._first_call = False
            if _optimizer_state_missing(layout.optimizer_list):
                # compiled, and the next call's program compiled ahead (_first_call.py)
                return _first_call.first_call(self, layout.optimizer_list, args, kwargs)
        run = self._prepared((args, kwargs), leaves, plain, layout)
        return self._plan(run).run_general(self, run)

    def _layout_of(self, args, kwargs) -> tuple:
        """The call's argument leaves, whether they are tensors only, positionally, and the
        layout of the state (walked again where the last one no longer holds; raises
        ``CpuStateError`` for a step over CPU parameters)."""
        leaves, tensors_only = arg_leaves(args, kwargs)
        layout = self._layout
        if layout is None or not layout.holds(leaves):
            layout = self._layout = find_state(self.target, self.module, leaves)
        return leaves, tensors_only and not self.static_argnums, layout

    def _prepared(self, call: tuple, leaves: list, plain: bool, layout: _Layout) -> _Run:
        """The call's program and entry (traced if new, not launched: ``_first_call`` compiles
        it ahead), over the state less the ``.grad``s the step discards unread (which its
        first trace finds: ``without_dead_grads``)."""
        state = layout.assemble()
        inputs, key, configuration = self._arguments(call, leaves, plain, layout)
        in_layouts = _input_layouts(inputs)
        checks = bool(torchlax_core.current_env().config.checked)
        key = (*key, state.structure, torch.is_grad_enabled(), checks, in_layouts)
        try:
            # (a forward never has dead .grads: no second hash of its key)
            dead = self._dead_grads.get(key) if self._dead_grads else None
            run_key = self._dead_keys.get(key, key) if dead else key
            program = self.programs.get(run_key)
        except TypeError:
            raise JitArgumentError(
                "torchlax.jit treats non-tensor arguments as static values, which must be "
                "hashable; got an unhashable one. Pass arrays as tensors and other values "
                "as hashable Python objects (tuples, not lists)."
            ) from None
        if program is None:
            program = self.programs[run_key] = _Program(self, configuration, checks, in_layouts)
        run_state = state.without_grads(dead) if dead else state
        run = _Run(self, layout, run_state, plain, call, inputs, in_layouts, checks, program)
        if run.info.trains and any(t.requires_grad for t in inputs):
            raise _argument_requiring_grad_error(self, inputs)
        if not run.info.trains or run.entry.jaxpr is None or dead is not None:
            return run  # (no jaxpr kept in checked mode)
        # The first trace of this step: the .grads it discards unread are left out, by this
        # call (its program not compiled yet) and later ones (without_dead_grads).
        dead = self._dead_grads[key] = _unread_grads(run.entry, state)
        if not dead:
            return run
        shared = without_dead_grads(self.programs, key, run.entry, state, dead)
        if shared is not None:
            self._dead_keys[key] = shared
        return self._prepared(call, leaves, plain, layout)  # (now over the state less them)

    def _arguments(self, call: tuple, leaves: list, plain: bool, layout: _Layout) -> tuple:
        """The call's tensors, what its arguments give the program's key, and its
        configuration (``_Program``: the arguments' tree, each leaf's place or value, the
        static values)."""
        if plain:  # tensors only, positionally (the common call): no pytree walk
            in_spec, spec_key = _tensor_args_spec(len(leaves))
            statics = (_SLOT,) * len(leaves)
            return leaves, (spec_key, statics, ()), (in_spec, statics, ())
        args, kwargs, static_values = self._split_static(*call)
        flat, in_spec = pytree.tree_flatten((args, kwargs))
        inputs = [x for x in flat if isinstance(x, torch.Tensor)]
        statics = tuple(_SLOT if isinstance(x, torch.Tensor) else x for x in flat)
        key = (str(in_spec), layout.keyed_statics(statics), static_values)
        return inputs, key, (in_spec, statics, static_values)

    def _plan(self, run: _Run) -> _ForwardPlan | _StepPlan:
        """The plan of ``run``'s entry and layout (one kept per kind: forward, step)."""
        plan = self._plans.get(run.forward)
        if plan is None or plan.entry is not run.entry or plan.layout is not run.layout:
            plan = _ForwardPlan(run) if run.forward else _StepPlan(run, self.donate_state)
            self._plans[run.forward] = plan
        return plan

    def _eager(self, args, kwargs, optimizers=()):
        """The call run eagerly (``_first_call``; ``eager_call``), the step counts the
        ``optimizers`` create on the jax device, as the program keeps them."""
        groups = set_capturable(optimizers)
        try:
            with torchlax_core.enable(torchlax_core.current_env()):
                return self.target(*args, **kwargs)
        finally:
            for g, capturable in groups:
                g["capturable"] = capturable
            for opt in optimizers:
                move_cpu_state_to_jax(opt)

    def _state_signature(self, arrays: list) -> _Hashed:
        # The last one while the arrays' avals are the very ones it was computed for (as the
        # core's CallPlan.miss: a step's results keep their avals call after call); a stand-in
        # (jax.ShapeDtypeStruct, _first_call) has none and is compared itself.
        avals, sig = self._state_sig
        now = list(map(getattr, arrays, repeat("aval"), arrays))
        if len(now) != len(avals) or not all(map(is_, now, avals)):
            sig = _Hashed(_signature(arrays))
            self._state_sig = (now, sig)
        return sig

    def _split_static(self, args: tuple, kwargs: dict) -> tuple:
        """The arguments with ``_STATIC`` in each static one's place, and the static values."""
        positional, kwargs, values = list(args), dict(kwargs), []
        for i in self.static_argnums:
            if i < len(positional):
                values.append(positional[i])
                positional[i] = _STATIC
        for name in self.static_argnames:
            if name in kwargs:
                values.append(kwargs[name])
                kwargs[name] = _STATIC
        return tuple(positional), kwargs, tuple(values)


@functools.cache
def _tensor_args_spec(n: int) -> tuple:
    """The tree of ``n`` positional tensor arguments, and its key."""
    in_spec = pytree.tree_flatten((tuple(range(n)), {}))[1]
    return in_spec, str(in_spec)


@contextlib.contextmanager
def _lent(jitted: _Jitted, found: list):
    """A step over CPU parameters (``found``: what ``find_state`` reached): their memory lent
    to the program (DLPack) while entered, the new state written into them in place on exit."""
    tensors, optimizers = cpu_state_tensors(found)
    # The program must not reuse memory that torch owns.
    jitted.donate_state = False
    jitted._layout = None
    lent = []
    try:
        for t in tensors:
            grad = t.grad if t.is_leaf else None
            array = _borrow(t)
            promoted = Tensor(array, requires_grad=t.requires_grad)
            # the very objects become torchlax Tensors (identity, opt.state keys unchanged)
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
        jitted._cpu_outputs = True
        yield
    finally:
        jitted._cpu_outputs = False
        jitted._layout = None  # found over the lent tensors: stale once they are given back
        for t, cpu, array in reversed(lent):
            new, grad = array_of(t), t.grad
            t.grad = None
            torch.utils.swap_tensors(t, cpu)
            if new is not array:
                write_back(t, new)  # in place: bumps _version
            if grad is not None:
                t.grad = grad.cpu()
        for opt in optimizers:  # state the step created (on its first, eager, call)
            for entries in opt.state.values():
                for name, value in list(entries.items()):
                    if isinstance(value, Tensor):
                        entries[name] = value.cpu()


def _borrowed(x: torch.Tensor) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor(_borrow(x))


def _optimizer_state_missing(optimizers) -> bool:
    """Whether a first step would create optimizer state or gradients (``_first_call``)."""
    return any(
        not opt.state.get(p) or p.grad is None
        for opt in optimizers
        for g in opt.param_groups
        for p in g["params"]
    )


class _Run:
    """One call on the general path (``_Jitted._prepared``): its state and arguments, and the
    arrays and entry of ``program`` it runs (the entry traced here if new)."""

    __slots__ = (
        *("layout", "state", "plain_args", "call", "inputs", "in_layouts", "checks", "program"),
        *("cpu_tensors", "state_arrays", "lr_arrays", "arrays", "on_jax", "signature"),
        *("entry", "info", "forward"),
    )

    def __init__(
        self, jitted, layout, state, plain_args, call, inputs, in_layouts, checks, program
    ):
        self.layout, self.state, self.call, self.program = layout, state, call, program
        self.plain_args = plain_args  # tensors only, positionally: a repeat checks them cheaply
        self.inputs, self.in_layouts, self.checks = inputs, in_layouts, checks
        self.cpu_tensors = list(state.cpu_tensors.values())
        self.state_arrays = [s.array for s in state.storages]
        self.lr_arrays = lr_arrays(layout)
        self.arrays = [_borrow(t) for t in self.cpu_tensors] + _input_arrays(inputs, in_layouts)
        self.on_jax = bool(state.storages) or any(isinstance(t, Tensor) for t in inputs)
        self.signature = (jitted._state_signature(self.state_arrays), _signature(self.arrays))
        call_args = (self.state_arrays, self.lr_arrays, self.arrays)
        self.entry, self.forward = program.entry(self.signature, state, call_args)
        self.info = self.entry.info

    def grad_mask(self) -> tuple | None:
        """Per tensor of ``tensors()``, whether autograd differentiates the call by it; None
        where autograd does not need the call (a step, grad off, nothing requiring grad)."""
        if self.info.trains or not torch.is_grad_enabled():
            return None
        mask = tuple(t.requires_grad and _inexact(t) for t in self.tensors())
        return mask if self.info.reads_host_grad or any(mask) else None

    def tensors(self) -> list:
        """The tensors an autograd call differentiates by: state owners, CPU tensors, inputs."""
        return list(self.state.owners) + self.cpu_tensors + self.inputs

    def repeatable(self) -> bool:
        """Whether a repeat can check the arguments cheaply (row-major torchlax Tensors,
        positionally) and lends no CPU state."""

        return (
            self.plain_args
            and not self.cpu_tensors
            and self.in_layouts is None  # (row-major inputs: a repeat checks they still are)
            and all(isinstance(t, Tensor) for t in self.inputs)
        )
