"""The state a ``torchlax.jit`` call reaches: what the walk finds, laid out as program inputs.

``find_state`` walks (``_walk.walk``, by the rule ``_StateWalk``) from what the function can
name and the call's arguments to every module, optimizer, scheduler and torchlax Tensor it
holds, within bounds, and records in a ``_Layout`` (``_state``) what it found and, in its
``_Snapshot``, what it read on the way. State in plain CPU tensors raises ``CpuStateError``
(the caller lends it to the program: ``cpu_state_tensors``). What the walk enters, and why:
docs/architecture.md, "What the state walk enters".
"""

from __future__ import annotations

import functools
import types
from itertools import chain
from operator import getitem

import jax.numpy as jnp
import torch
import torchlax_core
from torch.utils.hooks import RemovableHandle
from torchlax_core import Tensor
from torchlax_core.internal import storage_getter

from ._state import (
    _GLOBAL_HOOK_DICTS,
    _HOOK_DICTS,
    _REQUIRES_GRAD,
    _STATEFUL,
    _Hashed,
    _Layout,
    _lr_type,
    _rate_in,
    _Scheduler,
    _Snapshot,
    _snapshot_hooks,
    mapping_get,
)
from ._walk import (
    ATTR,
    SLOT,
    Visit,
    attributes,
    enterable,
    fields,
    is_container,
    items,
    named_by,
    public_fields,
    read_directly,
    slot_value,
    walk,
)

# How deep the walk goes from the function (a closure cell, a global, a bound method's object
# and each container is one level), and the most items it reads from one list, tuple or dict:
# what lies beyond is not state (an optimizer stepped there is refused: ``_watch``).
MAX_STATE_DEPTH = 4
MAX_CONTAINER_ITEMS = 64
MAX_WALKED_ITEMS = 1024  # over all the containers of one walk

# The state walk's own steps: a bound method's function and object (as deep as its method), a
# partial's function and arguments, an argument
_FUNC, _SELF, _PARTIAL, _ARG = "function", "self", "partial", "argument"

_STATEFUL_OR_TENSOR = (*_STATEFUL, torch.Tensor)


def find_state(target, module, arg_leaves: list) -> _Layout:
    """Walk everything ``target`` and its arguments reach (the slow path, once per change)."""
    layout = _Layout()
    # Read before the hook dicts: a hook registered during the walk is then seen next call.
    layout._hook_id = RemovableHandle.next_id
    found = _reached(target, arg_leaves, layout)
    modules, optimizers, schedulers, tensors = _sorted(found, layout.snapshot.read)
    trainings: list = []  # (module, training) of each module and submodule
    hooks = [_add_module(layout, m, m is module, trainings) for m in modules]
    # PyTorch's global module hooks run in every module's call: in the same snapshot, and in
    # the program's key.
    _snapshot_hooks(layout, _GLOBAL_HOOK_DICTS)
    structures = tuple(_add_optimizer(layout, opt, found) for opt in optimizers)
    read = layout.snapshot.read
    for t in tensors:  # (one requiring grad: its .grad is state too, backward() gives it one)
        read(storage_getter, t)
        _add_grad(layout, t, t.requires_grad and t.is_leaf)
    layout.tensors = tensors
    layout.modules, layout.optimizer_list, layout.schedulers = modules, optimizers, schedulers
    layout.static_structure = _Hashed(
        (
            tuple(read(_REQUIRES_GRAD, p) for p in layout.grads),  # (its grad computed or not)
            structures,
            len(layout.lr_groups),
            tuple(layout.cpu_tensors),
            tuple(flag for _, flag in trainings),
            tuple(type(m) for m, _ in trainings),  # (``model[1] = nn.Tanh()`` for a ReLU)
            # Which hooks (traced into the program), each by its RemovableHandle's id (never
            # reused): one registered anew is another program, one removed gives it back.
            tuple(chain.from_iterable(hooks)),
            tuple(tuple(d) for d in _GLOBAL_HOOK_DICTS),
        )
    )
    layout.seal()
    return layout


def _sorted(found: list, read=read_directly) -> tuple[list, list, list, list]:
    """``found`` by kind: modules, optimizers (a scheduler's too: each once, met first or
    not), schedulers, tensors."""
    modules, optimizers, schedulers, tensors = [], {}, [], []
    for obj in found:
        if isinstance(obj, torch.nn.Module):
            modules.append(obj)
        elif isinstance(obj, torch.optim.Optimizer):
            optimizers.setdefault(id(obj), obj)
        elif isinstance(obj, _Scheduler):
            schedulers.append(obj)
            opt = read(getattr, obj, "optimizer")
            optimizers.setdefault(id(opt), opt)
        elif isinstance(obj, Tensor):
            tensors.append(obj)
    return modules, list(optimizers.values()), schedulers, tensors


def _add(layout: _Layout, t: Tensor, grad: bool) -> None:
    """A state tensor, in program input order (its storage's first tensor owns it); with
    ``grad``, its ``.grad`` too."""
    storage = layout.snapshot.read(storage_getter, t)
    if id(storage) not in layout.fixed_ids:
        layout.fixed_ids.add(id(storage))
        layout.fixed_storages.append(storage)
        layout.fixed_owners.append(t)
    _add_grad(layout, t, grad)


def _add_grad(layout: _Layout, p, grad: bool = True) -> None:
    if grad and all(p is not g for g in layout.grads):
        layout.grads.append(p)


def _add_module(layout: _Layout, m: torch.nn.Module, target: bool, trainings: list) -> list:
    """Add a module's parameters and buffers (a CPU one of the target module: ``cpu_tensors``)
    and snapshot its submodules; returns (module position, hook kind, keys) per hook dict in
    use."""
    snapshot, hooks = layout.snapshot, []
    for sub in m.modules():
        for d in (sub._parameters, sub._buffers, sub._modules):
            snapshot.dict(d)
        hook_dicts = [getattr(sub, name) for name in _HOOK_DICTS]
        _snapshot_hooks(layout, hook_dicts)
        hooks.extend((len(trainings), kind, tuple(d)) for kind, d in enumerate(hook_dicts) if d)
        # ``training`` is read from the module's __dict__ (past ``nn.Module.__getattr__``),
        # unless its class defines it
        own = "training" in vars(sub) and not hasattr(type(sub), "training")
        reader, holder = (getitem, vars(sub)) if own else (getattr, sub)
        trainings.append((sub, snapshot.read(reader, holder, "training")))
    for named, grad in ((m.named_parameters(), True), (m.named_buffers(), False)):
        for name, t in named:
            if isinstance(t, Tensor):
                _add(layout, t, grad)
            elif target:
                layout.cpu_tensors[name] = t
                snapshot.read(isinstance, t, Tensor)
    return hooks


def _add_optimizer(layout: _Layout, opt, found: list) -> tuple:
    """Add an optimizer's groups (learning rates, hyperparameters), parameters and state
    entries; returns its structure: its type, each group's hyperparameters, each entry's
    names and values (a tensor as such)."""
    _move_cpu_state_to_jax(opt)
    snapshot, hypers, kinds = layout.snapshot, [], []
    snapshot.read(getattr, opt, "param_groups")
    snapshot.read(getattr, opt, "state")
    snapshot.items(opt.param_groups)
    state_get = dict.get if isinstance(opt.state, dict) else mapping_get
    for group in opt.param_groups:
        if snapshot.read(_rate_in, group):
            layout.lr_groups.append(group)
            layout.lr_types.append(_lr_type(group["params"]))
        snapshot.items(group, group["params"])
        for name in group:
            if name != "lr":
                snapshot.read(getitem, group, name)
        hypers.append(tuple((k, _hashable(v)) for k, v in group.items() if k not in _NO_HYPER))
        for p in group["params"]:
            if not isinstance(p, Tensor):
                raise CpuStateError(opt, found)
            _add(layout, p, grad=True)
            entries = snapshot.read(state_get, opt.state, p)
            if entries is None:
                kinds.append(())
                continue
            snapshot.items(entries)
            for name, value in entries.items():  # (a tensor need only stay a torchlax Tensor)
                if isinstance(value, Tensor):
                    snapshot.tensor_at(entries, name)
                else:
                    snapshot.read(getitem, entries, name)
            kinds.append(tuple((k, _hashable(v, "tensor")) for k, v in entries.items()))
            if entries:
                layout.entry_dicts.append(entries)
    return type(opt), tuple(hypers), tuple(kinds)


_NO_HYPER = ("params", "lr")


def _hashable(value, tensor=None):
    """``value`` in a key (``tensor``: what stands for a tensor, else its shape and dtype)."""
    if isinstance(value, list | tuple):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, torch.Tensor):
        return tensor or ("tensor", tuple(value.shape), value.dtype)
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


def _reached(target, arg_leaves: list, layout: _Layout) -> list:
    """The modules, optimizers, schedulers and tensors the walk finds from ``target``, then
    from each argument, in the order met; noted in the layout: the arguments through which it
    finds state (``_arg_holder_ids``), the snapshot of what leads to it (``_StateWalk.keep``)."""
    layout.arg_objects = tuple(  # (``step(state, x, y)`` with ``state.model``)
        leaf
        for leaf in arg_leaves
        if not isinstance(leaf, torch.Tensor) and (isinstance(leaf, _STATEFUL) or enterable(leaf))
    )
    roots = [((), target), *((((_ARG, i),), a) for i, a in enumerate(layout.arg_objects))]
    rule = _StateWalk(layout.snapshot)
    found: list = []
    holder_args: set[int] = set()
    for visit in walk(roots, rule.children, max_depth=1 << 10, max_nodes=1 << 30):
        path = visit.path
        if visit.again:
            if visit.holders:
                rule.again.add((id(visit.holders[-1]), path[-1]))
        elif isinstance(visit.value, _STATEFUL_OR_TENSOR) and not (
            # (``torchlax.jit(t.add)``: a method's tensor is its argument, no state)
            path and path[-1][0] == _SELF and isinstance(visit.value, torch.Tensor)
        ):
            found.append(visit.value)
            rule.leading.update(map(id, visit.holders))
            if len(path) > 1 and path[0][0] == _ARG:
                holder_args.add(path[0][1])
    layout._arg_holder_ids = frozenset(id(layout.arg_objects[i]) for i in holder_args)
    rule.keep()
    return found


class _StateWalk:
    """The state walk's rule (``children``): where it goes from each object, within
    ``MAX_*``; and what it read on its way, kept in the snapshot where that leads to state
    (``keep``). docs/architecture.md, "What the state walk enters"."""

    def __init__(self, snapshot: _Snapshot):
        self.snapshot = snapshot
        self.entered: list = []  # (visit, own, its items or fields) per container and object
        self.walked = 0  # the items of every container the walk went through
        self.leading: set[int] = set()  # ids of the objects on the paths to what was found
        self.again: set[tuple[int, tuple]] = set()  # (holder's id, step) of each met again

    def children(self, visit: Visit) -> list:
        depth = sum(kind not in (_SELF, _ARG) for kind, _ in visit.path)
        return [
            (step, value)
            for step, value in self._children(visit)
            if depth + (step[0] != _SELF) <= MAX_STATE_DEPTH
        ]

    def _children(self, visit: Visit) -> list:
        value, path = visit.value, visit.path
        if isinstance(value, types.MethodType):
            return [((_FUNC, None), value.__func__), ((_SELF, None), value.__self__)]
        if isinstance(value, functools.partial):
            args = (*value.args, *value.keywords.values())
            return [((_FUNC, None), value.func), *(((_PARTIAL, i), a) for i, a in enumerate(args))]
        if isinstance(value, types.FunctionType):
            return named_by(value, self.snapshot.read)
        own = bool(path) and path[-1][0] == _SELF
        if own and isinstance(value, torch.nn.Module):  # (a bound method's: its public attributes)
            return self._enter(visit, False, public_fields(value))
        if isinstance(value, _STATEFUL_OR_TENSOR):
            return []
        if is_container(value):
            # a container under an attribute: its tensors are no state (see the docstring)
            return self._enter(visit, not any(k in (ATTR, SLOT) for k, _ in path), items(value))
        if own or enterable(value):
            return self._enter(visit, own, fields(value))
        return []

    def _enter(self, visit: Visit, own: bool, children: list) -> list:
        """Where the walk goes from a container's items or an object's attributes (``own``:
        their tensors are state): what leads to state, within the budget (no bound on the
        jitted bound method's object's own)."""
        size = len(children)
        if not own or is_container(visit.value):
            if size > MAX_CONTAINER_ITEMS or self.walked + size > MAX_WALKED_ITEMS:
                return []
            self.walked += size
        self.entered.append((visit, own, children))
        return [(s, v) for s, v in children if _leads_to_state(v, own)]

    def keep(self) -> None:
        """Snapshot what the walk entered, but what under attributes leads to no state and
        all it holds. An object's part: its attribute names, and the attributes and slots
        that lead to state, are None, or were met before."""
        dropped = set()
        for visit, own, children in self.entered:  # (a holder before what it holds)
            value = visit.value
            if any(id(h) in dropped for h in visit.holders) or not (own or self._leads(value)):
                dropped.add(id(value))
            elif isinstance(value, dict):
                self.snapshot.dict(value)
            elif type(value) is list:
                self.snapshot.items(value)
            elif not is_container(value):
                self._keep_object(value, own, children)

    def _leads(self, value) -> bool:
        """Whether ``value``, entered, is on a path to state, or an empty container (one
        filled later: ``self.models.append(m)``)."""
        return id(value) in self.leading or (is_container(value) and not value)

    def _keep_object(self, obj, own: bool, named: list) -> None:
        attrs, _ = attributes(obj)
        if attrs is not None:
            self.snapshot.items(attrs)
        for step, v in named:
            if (
                v is None
                or isinstance(v, _STATEFUL)
                or (own and isinstance(v, torch.Tensor))
                or (_leads_on(v) and ((id(obj), step) in self.again or self._leads(v)))
            ):
                reader, holder = (dict.get, attrs) if step[0] == ATTR else (slot_value, obj)
                self.snapshot.read(reader, holder, step[1])


def _leads_to_state(value, own: bool) -> bool:
    """Whether the walk goes on to ``value`` (``own``: a tensor is state there)."""
    return (
        isinstance(value, _STATEFUL)
        or (own and isinstance(value, torch.Tensor))
        or _leads_on(value)
    )


def _leads_on(value) -> bool:
    return is_container(value) or enterable(value)


def _move_cpu_state_to_jax(opt) -> None:
    """CPU step counts (kept there by PyTorch for eager speed) become jax state tensors."""
    for p, entries in opt.state.items():
        if not isinstance(p, Tensor):
            continue
        for name, value in list(entries.items()):
            if isinstance(value, torch.Tensor) and not isinstance(value, Tensor):
                array = jnp.asarray(value.detach().cpu().numpy())
                entries[name] = Tensor(torchlax_core.current_env().place(array, p.device))


class CpuStateError(RuntimeError):
    """An optimizer of the step holds CPU parameters (the step is then run on promoted state);
    ``found`` is what the walk reached, so the CPU path does not walk again."""

    def __init__(self, opt, found: list):
        super().__init__(
            f"torchlax.jit: the optimizer {type(opt).__name__} holds parameters that are not "
            "on the 'jax' device; the call lends them to the program (caught by _Jitted._call)."
        )
        self.found = found


def cpu_state_tensors(found: list) -> tuple[list, list]:
    """The CPU tensors of a step over CPU state (parameters, buffers, optimizer state), and
    its optimizers, among the objects ``find_state`` reached (``CpuStateError.found``)."""
    modules, optimizers, _, _ = _sorted(found)
    held = [t for m in modules for t in chain(m.parameters(), m.buffers())]
    for opt in optimizers:
        for group in opt.param_groups:
            for p in group["params"]:
                held += [p, *opt.state.get(p, {}).values()]
    cpu = {id(t): t for t in held if isinstance(t, torch.Tensor) and not isinstance(t, Tensor)}
    return list(cpu.values()), optimizers
