"""The capture while ``torchlax.jit`` traces a step: one watch (``TraceWatch``: a torch
function mode and module and optimizer pre-hooks) over what the step does that the compiled
program would not do on its calls: constants read or changed, modules trained and optimizers
stepped that are no state, plain CPU tensors changed, refused ``backward()``s, backward hooks;
and the refusals it leads to (``run_watched``). Trace time only: a program's calls never see
it. What it watches, and why: docs/architecture.md, "What the capture watches".
"""

from __future__ import annotations

import inspect
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from itertools import chain
from typing import Any, NamedTuple

import jax.core
import torch
from torch.nn.modules import module as _torch_module
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.overrides import TorchFunctionMode
from torchlax_core import JitError, Tensor
from torchlax_core.internal import (
    array_of,
    graph_leaf,
    graph_nodes,
    rebind,
    storage_getter,
    storage_of,
    view_getter,
)

from ._refusals import (
    _owner,
    changed_tensor_error,
    described_tensor,
    unfound_state_error,
    where_held,
)
from ._state import _NO_TORCH_FUNCTION, _StateSet
from ._walk import path_to, reaches

# A storage (``.array``: its root's current array; ``.exclusive``), typed for what is read here
_storage_of: Callable[[Tensor], Any] = storage_of

_DATA = torch.Tensor.data  # the descriptor: ``t.data``'s getter is a method-wrapper of it
_REGISTER_HOOK = torch.Tensor.register_hook
_REGISTER_POST_ACCUMULATE = torch.Tensor.register_post_accumulate_grad_hook
_AUTOGRAD_GRAD = torch.autograd.grad
# Each call refused: in words, and its roots' and inputs' parameter names
_REFUSED_CALLS = {
    torch.Tensor.backward: ("backward()", "self", "inputs"),
    torch.autograd.backward: ("torch.autograd.backward()", "tensors", "inputs"),
    _AUTOGRAD_GRAD: ("torch.autograd.grad()", "outputs", "inputs"),
}


class RefusedBackward(RuntimeError):
    """Raised in the step before a refused ``backward()`` or ``torch.autograd.grad()`` runs
    (``TraceWatch.refused``); ``run_watched`` replaces it with an error naming the tensors."""


class _SeenConstant:
    """A constant as first seen: the tensor (weakly: a tensor the traced code made and
    dropped is no one's constant), its storage, view and array, and its ``.grad``'s."""

    __slots__ = ("ref", "storage", "view", "array", "layout", "grad", "grad_storage", "grad_array")
    origin = None

    def __init__(self, t: Tensor):
        self.ref = weakref.ref(t)
        self.storage = _storage_of(t)
        self.view = view_getter(t)
        self.array = self.storage.array
        self.layout = (tuple(t.shape), t.stride(), t.storage_offset())
        self.grad = grad = t.grad if t.is_leaf else None
        self.grad_storage = _storage_of(grad) if isinstance(grad, Tensor) else None
        self.grad_array = None if self.grad_storage is None else self.grad_storage.array

    def written(self, t: Tensor) -> bool:
        return _storage_of(t) is not self.storage or self.storage.array is not self.array

    def grad_changed(self, t: Tensor) -> bool:
        grad = t.grad if t.is_leaf else None
        return grad is not self.grad or (
            self.grad_storage is not None and self.grad_storage.array is not self.grad_array
        )

    def put_back(self, t: Tensor, written: bool, grad_given: bool) -> None:
        with _NO_TORCH_FUNCTION():
            if written:
                if _storage_of(t) is not self.storage:  # ``t.data = other``: its metadata
                    alias = torch.as_strided(Tensor(self.array), *self.layout)
                    torch.Tensor.data.__set__(t, alias)  # pyright: ignore[reportAttributeAccessIssue]  (torch's stubs type Tensor.data as a Tensor, not its descriptor)
                rebind(t, self.storage, self.view)
                self.storage.array = self.array
                self.storage.exclusive = False  # (never donated: the user holds it)
            if grad_given:
                if self.grad_storage is not None:
                    self.grad_storage.array = self.grad_array
                t.grad = self.grad


class _SeenCpu:
    """A plain CPU tensor as first seen: the tensor (weakly), its version counter, an alias
    of its data (what ``t.data = other`` would replace), a copy of its value, its ``.grad``
    and that one's version counter and value (``backward()`` accumulates into it)."""

    __slots__ = ("ref", "origin", "version", "alias", "value", "grad", "grad_version", "grad_value")

    def __init__(self, t: torch.Tensor, origin: Callable | None = None):
        # (``t.data`` is a temporary: held here, so that a write through it is still seen)
        self.ref: Callable = weakref.ref(t) if origin is None else lambda: t
        self.origin = origin  # for ``t.data``: t's ref (the tensor to name)
        self.version = _version(t)
        with torch.no_grad():
            self.alias = t.detach()
            self.value = self.alias.clone()
            self.grad = t.grad if t.is_leaf else None
            self.grad_version = -1 if self.grad is None else _version(self.grad)
            self.grad_value = None if self.grad is None else self.grad.clone()

    def written(self, t: torch.Tensor) -> bool:
        return _version(t) != self.version or not _same_data(t, self.alias)

    def grad_changed(self, t: torch.Tensor) -> bool:
        grad = t.grad if t.is_leaf else None
        return grad is not self.grad or (grad is not None and _version(grad) != self.grad_version)

    def put_back(self, t: torch.Tensor, written: bool, grad_given: bool) -> None:
        with torch.no_grad():
            if written:
                if not _same_data(t, self.alias):  # ``t.data = other``
                    t.data = self.alias
                self.alias.copy_(self.value)
            if grad_given:
                t.grad = grad = self.grad
                if grad is not None and self.grad_value is not None:
                    if _version(grad) != self.grad_version:
                        grad.copy_(self.grad_value)


class Changed(NamedTuple):
    """A tensor the traced step changed (``tensor``: for ``t.data``, t), whether its data
    (``written``: in place, or through ``.data``) or its ``.grad`` (``grad_given``: given,
    replaced or written in place) changed, and what it held when first seen (``seen``)."""

    tensor: Any
    written: bool
    grad_given: bool
    seen: _SeenConstant | _SeenCpu

    @property
    def kind(self) -> str:
        """What the step did, in ``_refusals``' words: ``"grad"`` or ``"write"``."""
        return "grad" if self.grad_given and not self.written else "write"


def restore(changed: list[Changed]) -> None:
    """Put back the data and ``.grad`` each of ``changed`` held when first seen."""
    for c in changed:
        t = c.seen.ref()
        if t is not None:
            c.seen.put_back(t, c.written, c.grad_given)


class _Noted(dict):
    """The tensors of one kind a trace saw, by id: each one's first sight (``_SeenConstant``,
    ``_SeenCpu``), or None for one the trace made (a torchlax Tensor holding a tracer too).
    Ids stay unique: a tensor noted outlives the trace it is seen in."""

    def alive(self) -> Iterator[tuple[Any, Any]]:
        for seen in self.values():
            t = None if seen is None else seen.ref()
            if t is not None:
                yield seen, t

    def changed(self) -> list[Changed]:
        """Those still alive whose data or ``.grad`` the traced code changed (first seen
        first); among the constants, maybe ones it made from host data (``_kept_as_state``)."""
        found = []
        with _NO_TORCH_FUNCTION():
            for seen, t in self.alive():
                written, grad_given = seen.written(t), seen.grad_changed(t)
                if written or grad_given:
                    origin = seen.origin and seen.origin()  # (``t.data``'s: t, to name)
                    found.append(
                        Changed(t if origin is None else origin, written, grad_given, seen)
                    )
        return found

    def read(self) -> ReadConstants | None:
        """The constants still alive that the traced code read and left as they were."""
        with _NO_TORCH_FUNCTION():
            kept = [s for s, t in self.alive() if not s.written(t)]
        return ReadConstants(kept) if kept else None


class ReadConstants:
    """The constants a program's trace read, each with the storage and array it had then:
    their values are baked into the program. ``hold()`` tells whether each still has them (a
    write between calls, in place or through ``.data``, replaces one); a constant no one
    holds any more can no longer change. A program that read no constant has none."""

    __slots__ = ("_read",)

    def __init__(self, seen: list[_SeenConstant]):
        self._read = tuple((s.ref, s.storage, s.array) for s in seen)

    def hold(self) -> bool:
        for ref, storage, array in self._read:
            t = ref()
            if t is not None and (storage_getter(t) is not storage or storage.array is not array):
                return False
        return True


class TraceWatch(TorchFunctionMode):
    """The watch over one trace (see the module docstring): enter it around the step, then
    read its findings. ``state``: the call's state (its parameters and optimizers are no
    constants); ``owner``: ``torchlax.jit(fn)``, for the errors it raises in the step."""

    def __init__(self, state: _StateSet, cpu_state: dict, owner: str):
        super().__init__()
        self._thread = threading.get_ident()
        self._owner = owner
        self._state_parameters = {
            id(p) for p in (*state.grads, *state.cpu_tensors.values(), *cpu_state.values())
        }
        self._state_optimizers = {id(opt) for opt in state.optimizers}
        # The plain CPU tensors seen, and the torchlax Tensors seen holding concrete arrays
        self.cpu, self.constants = _Noted(), _Noted()
        # Whether a CPU tensor of the trace requires grad: only then can a backward() reach one
        self._grad_on_host = False
        # A refused backward's (call, "backward" or "crossing" from the program, CPU tensors)
        self.refused: tuple[str, str, list[torch.Tensor]] | None = None
        # What autograd's backward of the traced code would run, in words, first met first
        self.backward_hooks: list[str] = []
        # The plain CPU tensors requiring grad the step read with grad on: constants of the
        # program, which a backward after the call (jax.vjp of it) would give no gradient
        self.host_tensors_requiring_grad: list[torch.Tensor] = []
        self._called_modules: set[int] = set()
        # (module, parameter, its .grad before) of each parameter requiring grad of a module
        # called that is no state
        self._untrained: dict[int, tuple] = {}
        self._handles: list = []

    def __enter__(self):
        self._handles = [
            register_module_forward_pre_hook(self._module_called),
            register_optimizer_step_pre_hook(self._optimizer_stepped),
        ]
        self.backward_hooks += _hooks(
            {
                "global full backward hook": _torch_module._global_backward_hooks,
                "global backward pre-hook": _torch_module._global_backward_pre_hooks,
            }
        )
        return super().__enter__()

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        return super().__exit__(*exc)

    def trace_made(self, t: torch.Tensor) -> bool:
        """Whether the trace made the CPU tensor ``t`` (a result of one of its calls)."""
        return id(t) in self.cpu and self.cpu[id(t)] is None

    def untrained_module(self, refused: set[int] | frozenset = frozenset()):
        """The first module called that is no state whose parameter the step gave a new
        ``.grad`` (read before the constants are put back), or a refused ``backward()`` would
        have (``refused``: ids), else None."""
        return next(
            (
                m
                for m, p, grad in self._untrained.values()
                if p.grad is not grad or id(p) in refused
            ),
            None,
        )

    # -- the hooks and the mode: modules, optimizers, hooks, plain CPU tensors ------------

    def _module_called(self, module: torch.nn.Module, _args) -> None:
        if threading.get_ident() != self._thread or id(module) in self._called_modules:
            return
        self._called_modules.add(id(module))
        for p in module.parameters():
            if p.requires_grad and id(p) not in self._state_parameters:
                self._untrained.setdefault(id(p), (module, p, p.grad))
        full = "full " if module._is_full_backward_hook else ""
        self.backward_hooks += _hooks(
            {
                f"{full}backward hook": module._backward_hooks,
                "backward pre-hook": module._backward_pre_hooks,
            },
            of=f" of the {type(module).__name__}",
        )

    def _optimizer_stepped(self, opt, _args, _kwargs) -> None:
        # Its state tensors would be created or written inside the program without being its
        # inputs or outputs: values of a finished trace kept in ``opt.state``.
        if id(opt) not in self._state_optimizers and threading.get_ident() == self._thread:
            raise unfound_state_error(self._owner, opt)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        traced = False  # whether a torchlax Tensor is among the arguments
        if threading.get_ident() == self._thread:
            traced = self._see(chain(args, kwargs.values()))
            if func is _REGISTER_HOOK or func is _REGISTER_POST_ACCUMULATE:  # (no hashing)
                hook = args[1] if len(args) > 1 else next(iter(kwargs.values()), None)
                self.backward_hooks.append(
                    f"the hook {_name(hook)} registered on a tensor of the step ({func.__name__})"
                )
            elif self._grad_on_host and func in _REFUSED_CALLS:
                self._refuse_backward_to_host(func, args, kwargs)
        result = func(*args, **kwargs)
        for r in _each(result):
            if traced and isinstance(r, Tensor):
                # The traced code's own, never a constant of the program (an op of constants
                # can give a concrete result: the eager op cache computes it). A factory's
                # result is not: a constant first read by an op, it is refused if changed.
                self.constants.setdefault(id(r), None)
            elif type(r) is torch.Tensor:  # (rare in a trace: most results are torchlax's)
                if r.requires_grad:  # (``torch.ones(3, requires_grad=True)``, ``w * 2``)
                    self._grad_on_host = True
                if getattr(func, "__self__", None) is not _DATA:
                    self.cpu.setdefault(id(r), None)  # the trace's own tensor
                elif (origin := self.cpu.get(id(args[0]))) is not None:
                    # ``t.data``: an alias of t's storage with a version counter of its own,
                    # so a write through it (``t.data.add_(1)``) is t's, and seen as such.
                    self.cpu[id(r)] = _SeenCpu(r, origin.ref)
        return result

    def _see(self, values) -> bool:
        """Note the constants and plain CPU tensors among a call's arguments (and their lists'
        items); whether a torchlax Tensor is among them."""
        traced = False
        for a in values:
            for t in _each(a):
                if isinstance(t, Tensor):
                    traced = True
                    if id(t) not in self.constants:
                        self._see_constant(t)
                elif is_plain_cpu(t) and id(t) not in self.cpu:
                    self.cpu[id(t)] = _SeenCpu(t)
                    if t.requires_grad:
                        self._grad_on_host = True
                        if torch.is_grad_enabled():  # (read under no_grad, it carries no gradient)
                            self.host_tensors_requiring_grad.append(t)
        return traced

    def _see_constant(self, t: Tensor) -> None:
        if isinstance(_storage_of(t).array, jax.core.Tracer):
            self.constants[id(t)] = None  # an input of the program, or a value it computed
        else:
            with _NO_TORCH_FUNCTION():
                self.constants[id(t)] = _SeenConstant(t)

    def _refuse_backward_to_host(self, func, args: tuple, kwargs: dict) -> None:
        """Raise ``RefusedBackward`` if this ``backward()`` would give a CPU leaf the trace did
        not make a ``.grad`` (it would be given once, on the host, while the step is traced),
        or if it or this ``torch.autograd.grad()`` would carry a gradient from a traced
        torchlax Tensor to a plain CPU tensor, made by the trace or not (it cannot leave the
        traced program: the backward of the device copy fails with an unnamed "Unable to
        cast"). A ``torch.autograd.grad()`` on the host alone (a CPU loss) is fine: its result
        is a value of the trace, as eagerly."""
        call, roots_name, inputs_name = _REFUSED_CALLS[func]
        bound = inspect.signature(func).bind(*args, **kwargs).arguments
        roots, inputs = _tensors(bound.get(roots_name, ())), bound.get(inputs_name)
        inputs = None if inputs is None else _tensors(inputs)
        leaves, _ = _reached(roots) if func is not _AUTOGRAD_GRAD else ({}, None)
        wanted = None if inputs is None else set(map(id, inputs))
        given = [t for k, t in leaves.items() if wanted is None or k in wanted]
        refused = [t for t in given if is_plain_cpu(t) and not self.trace_made(t)]
        kind = "backward" if refused else "crossing"
        if not refused:  # toward ``inputs`` where given (leaves or not), else every leaf reached
            traced = [
                r
                for r in roots
                if isinstance(r, Tensor) and isinstance(array_of(r), jax.core.Tracer)
            ]
            leaves, nodes = _reached(traced)
            toward = [t for t in inputs or () if id(t) in leaves or t.grad_fn in nodes]
            refused = [
                t for t in (leaves.values() if inputs is None else toward) if is_plain_cpu(t)
            ]
        if refused:
            self.refused = (call, kind, refused)
            raise RefusedBackward(
                f"torchlax.jit: a {call} of the traced step would give a .grad to, or carry a "
                "gradient from the traced program to, a plain CPU tensor; it is refused (the "
                "jit names the tensor)."
            )


def run_watched(jitted, cpu_state: dict, args, kwargs, state: _StateSet):
    """The step (``jitted``) on tracers under a ``TraceWatch``, refusing what cannot be one
    program (put back first). Returns the step's output, the constants it read (or None),
    what its backward after the call would do only eagerly (``_Info.eager_backward``: backward
    hooks, tensors requiring grad that are no state) and whether it read such a tensor."""
    owner = _owner(jitted)
    watch = TraceWatch(state, cpu_state, owner)
    constants = watch.constants

    def path(t) -> str | None:
        return path_to(t, jitted.target, args, kwargs)

    try:
        with watch:
            out = jitted._run(cpu_state, args, kwargs)
    except BaseException:
        restore([*constants.changed(), *watch.cpu.changed()])  # (before a refusal is raised)
        if watch.refused:  # a backward() that would give CPU leaves .grads
            raise _host_error(watch, [], path) from None
        raise
    cpu_changed = watch.cpu.changed()
    if watch.refused or cpu_changed:  # (a refusal the step caught first, or a change)
        restore([*constants.changed(), *cpu_changed])
        raise _host_error(watch, cpu_changed, path)
    untrained = watch.untrained_module()
    # A changed tensor the function reaches is the user's constant: put back, and named. Any
    # other the step made from host data (torch.tensor(...)): left alone where the program
    # returns it from (the output), else put back (an output's autograd graph may save it).
    changed = [c for c in constants.changed() if not _kept_as_state(c.tensor, state)]
    named = [(c, p) for c in changed if (p := path(c.tensor)) is not None]
    restore(
        changed
        if named or untrained is not None
        else [c for c in changed if not reaches(out, c.tensor)]
    )
    if untrained is not None:
        raise unfound_state_error(owner, untrained, path(untrained))
    if named:
        raise changed_tensor_error(owner, named[0][0].kind, [(c.tensor, p) for c, p in named])
    with _NO_TORCH_FUNCTION():  # (the program's vjp gives these no gradient)
        requiring = [t for _, t in constants.alive() if t.requires_grad]
    host_grad = [
        f"{described_tensor(t, cpu=t.device.type == 'cpu')} {where_held(path(t))}, which "
        "requires grad: a constant of the program, given its gradient by PyTorch's backward only"
        for t in (*watch.host_tensors_requiring_grad, *requiring)
    ]
    eager_backward = tuple(
        f"{hook}, which PyTorch runs in its backward" for hook in watch.backward_hooks
    ) + tuple(host_grad)
    return out, constants.read(), eager_backward, bool(host_grad)


def _host_error(watch: TraceWatch, changed: list[Changed], path: Callable) -> JitError:
    """The error for the plain CPU tensors the step changed, or its refused ``backward()``
    would have: naming the module, where such a leaf is the parameter of a module called that
    is no state, else the first tensor, by its path (or as the step's own)."""
    owner = watch._owner
    if watch.refused:
        call, kind, tensors = watch.refused
        untrained = None if kind == "crossing" else watch.untrained_module(set(map(id, tensors)))
        if untrained is not None:
            return unfound_state_error(owner, untrained, path(untrained))
        made = [watch.trace_made(t) for t in tensors]
        named = [(t, None if m else path(t)) for t, m in zip(tensors, made, strict=True)]
        return changed_tensor_error(owner, kind, named, call, made[0])
    return changed_tensor_error(
        owner, changed[0].kind, [(c.tensor, path(c.tensor)) for c in changed]
    )


def _kept_as_state(t: Tensor, state: _StateSet) -> bool:
    """Whether ``t`` (a changed constant) is a parameter's new ``.grad`` or an optimizer's new
    state entry: the step made it (a new step count), and the program returns it."""
    return any(p.grad is t for p in state.grads) or any(
        v is t
        for opt in state.optimizers
        for entries in opt.state.values()
        for v in entries.values()
    )


def _each(value) -> tuple | list:
    """A torch call's argument or result, or the items of a list or tuple one."""
    return value if type(value) is list or type(value) is tuple else (value,)


def _name(hook) -> str:
    return repr(getattr(hook, "__qualname__", type(hook).__name__))


def _hooks(dicts: dict[str, dict], of: str = "") -> list[str]:
    """The hooks of each dict (``{kind: hook dict}``), each in words."""
    return [f"the {kind} {_name(h)}{of}" for kind, hooks in dicts.items() for h in hooks.values()]


def _reached(roots: Sequence[torch.Tensor]) -> tuple[dict[int, torch.Tensor], set]:
    """The leaves (by id; a root leaf itself: ``w.backward()``) and the autograd nodes a
    backward of ``roots`` reaches, walked before it runs."""
    reached = {id(r): r for r in roots if r.grad_fn is None and r.requires_grad}
    nodes = set()
    for node in graph_nodes(r.grad_fn for r in roots):
        nodes.add(node)
        if (leaf := graph_leaf(node)) is not None:
            reached[id(leaf)] = leaf
    return reached, nodes


def _tensors(values) -> list[torch.Tensor]:
    """The tensors of a backward's roots or inputs: a tensor, a sequence, or (for
    ``torch.autograd.grad``'s inputs) a dict of them; a GradientEdge is not followed."""
    if isinstance(values, torch.Tensor):
        return [values]
    if isinstance(values, dict):
        values = values.values()
    return [t for t in values if isinstance(t, torch.Tensor)]


def is_plain_cpu(t) -> bool:
    """Whether ``t`` is a plain CPU ``torch.Tensor`` (not a torchlax Tensor)."""
    return isinstance(t, torch.Tensor) and not isinstance(t, Tensor) and t.device.type == "cpu"


def _version(t: torch.Tensor) -> int:
    try:
        return t._version
    except RuntimeError:  # an inference tensor: it cannot be written outside inference mode
        return -1


def _same_data(t: torch.Tensor, alias: torch.Tensor) -> bool:
    return bool(
        t.untyped_storage().data_ptr() == alias.untyped_storage().data_ptr()
        and t.shape == alias.shape
        and t.stride() == alias.stride()
        and t.storage_offset() == alias.storage_offset()
    )
