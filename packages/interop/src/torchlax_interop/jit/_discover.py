"""What a step reaches: the one walk that finds a ``torchlax.jit`` call's state.

``find_state`` walks from what the function can name (a module target, a bound method's
object, closure cells, the globals its code reads, the call's arguments) through lists,
tuples, dicts and the plain objects ``_holders`` enters, to every module, optimizer and
scheduler and every torchlax Tensor it holds, within bounds (``MAX_STATE_DEPTH``,
``MAX_CONTAINER_ITEMS``, ``MAX_WALKED_ITEMS``), and records what it read in a ``_Layout``
(``_state``). State held in plain CPU tensors is refused with ``CpuStateError`` (the caller
lends it to the program instead: ``cpu_state_tensors``).
"""

from __future__ import annotations

import functools
import types
from itertools import chain

import jax.numpy as jnp
import torch
import torchlax_core
from torch.utils.hooks import RemovableHandle
from torchlax_core import Tensor
from torchlax_core.internal import storage_of

from ._holders import attributes, enterable, slot_values
from ._state import (
    _ABSENT,
    _GLOBAL_HOOK_DICTS,
    _HOOK_DICTS,
    _STATEFUL,
    _TENSOR,
    _cell_contents,
    _Hashed,
    _is_rate,
    _Layout,
    _lr_type,
    _optimizer_structure,
    _Scheduler,
    _snapshot,
    _snapshot_hooks,
)


def find_state(target, module, arg_leaves: list) -> _Layout:
    """Walk everything ``target`` and its arguments reach (the slow path, once per change)."""
    layout = _Layout()
    # Read before the hook dicts: a hook registered during the walk is then seen next call.
    layout._hook_id = RemovableHandle.next_id
    found = _reached(target, arg_leaves, layout)
    modules, optimizers, schedulers, tensors = _sorted(found, layout)
    recipe = _Recipe(layout)
    hooks = [_module_hooks(layout, recipe, m, m is module) for m in modules]
    # PyTorch's global module hooks run in every module's call: in the same snapshot, and in
    # the program's key.
    _snapshot_hooks(layout, _GLOBAL_HOOK_DICTS)
    global_hooks = tuple(tuple(d) for d in _GLOBAL_HOOK_DICTS)
    for opt in optimizers:
        _add_optimizer(layout, recipe, opt, found)
    for t in tensors:
        layout.tensor_storages.append((t, storage_of(t)))
        if t.requires_grad and t.is_leaf:  # (its .grad is state too: backward() gives it one)
            recipe.add_grad(t)
    layout.tensors = tensors
    layout.modules, layout.optimizer_list, layout.schedulers = modules, optimizers, schedulers
    # A parameter's requires_grad decides what the traced step computes (its grad or none).
    layout.requires_grads = [p.requires_grad for p in layout.grads]
    layout._nones = (None,) * len(layout.grads)
    layout.static_structure = _Hashed(
        (
            tuple(layout.requires_grads),
            tuple(_optimizer_structure(opt) for opt in optimizers),
            len(layout.lr_groups),
            tuple(layout.cpu_tensors),
            tuple(flag for _, flag in layout.trainings),
            # Which module classes: a submodule replaced by one of another class that holds
            # the same parameters (``model[1] = nn.Tanh()`` for a ReLU) runs other code.
            tuple(type(m) for m, _ in layout.trainings),
            # Which hooks: a hook runs while the step is traced, so its effect is part of the
            # program. Each by its dict key (its RemovableHandle's id, never reused in the
            # process): a hook registered anew is another program, one removed gives the
            # program back, and the key keeps no reference to the hook's function.
            tuple(chain.from_iterable(hooks)),
            global_hooks,
        )
    )
    layout._flatten_snapshot()
    _fix_storages(layout)
    return layout


def _reached(target, arg_leaves: list, layout: _Layout) -> list:
    """The modules, optimizers, schedulers and torchlax Tensors the walk finds from ``target``,
    then from each argument (an argument holding state is noted: ``_arg_holder_ids``)."""
    found: list = []
    seen: set = set()
    _referenced(target, seen, found, layout)
    layout.arg_objects = tuple(_arg_holders(arg_leaves))
    holders = []
    for leaf in layout.arg_objects:
        before = len(found)
        _referenced(leaf, seen, found, layout)
        if len(found) > before and not isinstance(leaf, _STATEFUL):
            holders.append(id(leaf))
    layout._arg_holder_ids = frozenset(holders)
    return found


def _sorted(found: list, layout: _Layout) -> tuple[list, list, list, list]:
    """``found`` by kind: modules, optimizers (a scheduler's too), schedulers, tensors."""
    modules, optimizers, schedulers, tensors = [], [], [], []
    for obj in found:
        if isinstance(obj, torch.nn.Module):
            modules.append(obj)
        elif isinstance(obj, torch.optim.Optimizer):
            optimizers.append(obj)
        elif isinstance(obj, _Scheduler):
            schedulers.append(obj)
            layout.scheduler_optimizers.append((obj, obj.optimizer))
            if all(obj.optimizer is not o for o in optimizers):
                optimizers.append(obj.optimizer)
        elif isinstance(obj, Tensor):
            tensors.append(obj)
    return modules, optimizers, schedulers, tensors


class _Recipe:
    """Adds state tensors to a layout's recipe (in program input order) and its ``.grad``s."""

    def __init__(self, layout: _Layout):
        self.layout = layout

    def add(self, t) -> None:
        self.layout.recipe.append(t)
        self.layout.tensor_storages.append((t, storage_of(t)))

    def add_grad(self, p) -> None:
        grads = self.layout.grads
        if all(p is not g for g in grads):
            grads.append(p)


def _module_hooks(layout: _Layout, recipe: _Recipe, m: torch.nn.Module, target: bool) -> list:
    """Add a module's parameters and buffers (a CPU one of the target module is lent to the
    program: ``cpu_tensors``) and snapshot its submodules; returns (module position, hook
    kind, the hook dict's keys) of each hook dict in use."""
    hooks = []
    for sub in m.modules():
        hook_dicts = [getattr(sub, name) for name in _HOOK_DICTS]
        layout.module_dicts.extend(
            _snapshot(d) for d in (sub._parameters, sub._buffers, sub._modules)
        )
        _snapshot_hooks(layout, hook_dicts)
        hooks.extend(
            (len(layout.trainings), kind, tuple(d)) for kind, d in enumerate(hook_dicts) if d
        )
        layout.trainings.append((sub, sub.training))
    for name, p in m.named_parameters(remove_duplicate=True):
        if isinstance(p, Tensor):
            recipe.add(p)
            recipe.add_grad(p)
        elif target:
            layout.cpu_tensors[name] = p
    for name, b in m.named_buffers(remove_duplicate=True):
        if isinstance(b, Tensor):
            recipe.add(b)
        elif target:
            layout.cpu_tensors[name] = b
    return hooks


def _add_optimizer(layout: _Layout, recipe: _Recipe, opt, found: list) -> None:
    """Add an optimizer's groups (their learning rates and hyperparameters), parameters and
    state entries."""
    _move_cpu_state_to_jax(opt)
    layout.optimizers.append((opt, opt.param_groups, tuple(opt.param_groups), opt.state))
    for group in opt.param_groups:
        lr_input = _is_rate(group.get("lr"))
        if lr_input:
            layout.lr_groups.append(group)
            layout.lr_types.append(_lr_type(group["params"]))
        hyper = tuple((k, v) for k, v in group.items() if k != "lr")
        layout.groups.append((group, hyper, lr_input, group["params"], tuple(group["params"])))
        for p in group["params"]:
            if not isinstance(p, Tensor):
                raise _cpu_optimizer_error(opt, found)
            recipe.add(p)
            recipe.add_grad(p)
            entries = opt.state.get(p)
            kinds = (
                None
                if entries is None
                else tuple(
                    (name, _TENSOR if isinstance(v, Tensor) else v) for name, v in entries.items()
                )
            )
            layout.entries.append((opt.state, p, _ABSENT if entries is None else entries, kinds))
            if entries:
                layout.recipe.append(entries)


def _fix_storages(layout: _Layout) -> None:
    """The storages of the module and optimizer tensors, fixed while ``holds()`` is true (it
    checks each tensor's storage): assembled once, not on every call."""
    for item in layout.recipe:
        if type(item) is not dict:
            storage = storage_of(item)
            if id(storage) not in layout.fixed_ids:
                layout.fixed_ids.add(id(storage))
                layout.fixed_storages.append(storage)
                layout.fixed_owners.append(item)
    layout.entry_dicts = [item for item in layout.recipe if type(item) is dict]


# How deep the walk goes from the function (a closure cell, a global, a bound method's object
# and each container is one level), and the most items it reads from one list, tuple or dict:
# what lies beyond is not state. A step that runs an optimizer found nowhere raises when it is
# traced (``_program._refuse_unfound_optimizers``) instead of keeping its state inside the program.
MAX_STATE_DEPTH = 4


MAX_CONTAINER_ITEMS = 64


MAX_WALKED_ITEMS = 1024  # over all the containers of one walk


def _referenced(
    fn, seen: set, found: list, layout: _Layout, depth: int = 0, tensors: bool = True
) -> None:
    """Collect the modules, optimizers, schedulers and tensors ``fn`` can reach by name,
    directly or through the lists, tuples, dicts and objects that closures, globals,
    arguments and a bound method's object hold (``opts[1]``, ``self.models["g"]``,
    ``self.cfg.model``). ``tensors``: whether the tensors of the containers met are state
    (see ``_referenced_object``)."""
    if id(fn) in seen or depth > MAX_STATE_DEPTH:
        return
    seen.add(id(fn))
    if isinstance(fn, torch.nn.Module | torch.optim.Optimizer | _Scheduler | torch.Tensor):
        found.append(fn)
        return
    if _is_container(fn):
        _referenced_items(fn, seen, found, layout, depth, tensors)
        return
    if isinstance(fn, types.MethodType):
        _referenced(fn.__func__, seen, found, layout, depth + 1)
        _referenced_object(fn.__self__, seen, found, layout, depth, own=True)
        return
    if isinstance(fn, functools.partial):
        _referenced(fn.func, seen, found, layout, depth + 1)
        for value in (*fn.args, *fn.keywords.values()):
            _referenced(value, seen, found, layout, depth + 1)
        return
    if not isinstance(fn, types.FunctionType):
        if enterable(fn):
            _referenced_object(fn, seen, found, layout, depth, own=False)
        return
    for cell in fn.__closure__ or ():
        value = _cell_contents(cell)
        layout.cells.append((cell, value))
        if value is not _ABSENT:
            _referenced(value, seen, found, layout, depth + 1)
    for name in _global_names(fn.__code__):
        value = fn.__globals__.get(name, _ABSENT)
        layout.globals.append((fn.__globals__, name, value))
        if value is not _ABSENT:
            _referenced(value, seen, found, layout, depth + 1)
    # default arguments (``def step(model=model, opt=opt)``): what a call that omits them uses
    defaults, kwdefaults = fn.__defaults__, fn.__kwdefaults__
    if defaults or kwdefaults:
        layout.defaults.append((fn, defaults, kwdefaults))
        for value in (*(defaults or ()), *(kwdefaults or {}).values()):
            _referenced(value, seen, found, layout, depth + 1)


def _referenced_object(obj, seen: set, found: list, layout: _Layout, depth: int, own: bool) -> None:
    """The walk through an object's attributes (its ``__dict__`` and ``__slots__``), one
    level deeper: a trainer's ``self.cfg.model``, a ``SimpleNamespace``, a dataclass.

    Inside objects only modules, optimizers and schedulers are state, and what leads to them
    (containers, other objects): a method may use none of its object's attributes, and a list
    of tensors there is more likely a history the loop appends to (as state, each call would
    walk again and compile a program for its new length). ``own``: ``obj`` is the jitted
    bound method's object, whose own tensor attributes are state too (``self.scale``), as a
    closure's tensors are; it is entered whatever its size.

    The snapshot keeps the object's attribute names and, by identity, the values that lead
    to state (or are None: an optional scheduler set later), so rebinding one between calls
    (``trainer.cfg.model = other``, ``trainer.parts = new_parts``) makes the next call walk
    again, while the attributes a loop updates each call (a step count, a loss history) are
    not read. An object that leads to no state leaves nothing in the snapshot, and its
    holder does not check it either (an object the step keeps its last outputs in, rebound
    each call, would otherwise make each call walk again).

    A module whose method is jitted is state, and its public attributes that are no
    parameters, buffers or submodules are entered too (a Lightning-style
    ``self.optimizer``); its plain tensor attributes stay constants, as in its forward, and
    it leaves nothing in the snapshot where they lead to no state (a module's own method,
    ``torchlax.jit(model.generate)``, checks nothing more per call)."""
    module = own and isinstance(obj, torch.nn.Module)
    if isinstance(obj, _STATEFUL):
        _referenced(obj, seen, found, layout, depth)
        if not module:
            return
        own = False
    attrs, slots = attributes(obj)
    items = [] if attrs is None else list(attrs.items())
    items += zip(slots, slot_values(obj, slots), strict=True)
    if module:
        items = [(n, v) for n, v in items if not n.startswith("_") and n != "training"]
    if not own:
        size = len(items)
        if size > MAX_CONTAINER_ITEMS or layout.walked_items + size > MAX_WALKED_ITEMS:
            return
        layout.walked_items += size
    seen.add(id(obj))
    marks = layout.snapshot_marks()
    before = len(found)
    names, values, slot_names, slot_snapshot = [], [], [], []
    for name, value in items:
        if _leads_to_state(value, seen, found, layout, depth + 1, own):
            if attrs is not None and name in attrs:
                names.append(name)
                values.append(value)
            else:
                slot_names.append(name)
                slot_snapshot.append(value)
    if not own and len(found) == before:
        layout.drop_snapshot_since(marks)
        return
    layout.objects.append(
        (
            attrs,
            () if attrs is None else tuple(attrs),
            tuple(names),
            tuple(values),
            obj,
            tuple(slot_names),
            tuple(slot_snapshot),
        )
    )


def _leads_to_state(value, seen: set, found: list, layout: _Layout, depth: int, own: bool) -> bool:
    """Walk an object's attribute ``value`` if it may lead to state; whether the object's
    snapshot must keep it (see ``_referenced_object``)."""
    if value is None:
        return True
    if isinstance(value, _STATEFUL) or (own and isinstance(value, torch.Tensor)):
        _referenced(value, seen, found, layout, depth)
        return True
    if not (_is_container(value) or enterable(value)):
        return False
    if id(value) in seen:  # met before: what it leads to is known elsewhere; kept, to be safe
        return True
    before = len(found)
    _referenced(value, seen, found, layout, depth, tensors=False)
    # an empty container may be filled with modules later (``self.models.append(m)``)
    return len(found) > before or (_is_container(value) and not value)


def _arg_holders(leaves) -> list:
    """The arguments' leaves the walk enters: modules, optimizers, schedulers and objects
    (``step(state, x, y)`` with ``state.model``); tensors come first, the common call."""
    return [
        leaf
        for leaf in leaves
        if not isinstance(leaf, torch.Tensor) and (isinstance(leaf, _STATEFUL) or enterable(leaf))
    ]


_STATEFUL_OR_TENSOR = (*_STATEFUL, torch.Tensor)


def _is_container(value) -> bool:
    # lists exactly (a subclass may compute its items); tuples with namedtuples; dicts with
    # OrderedDict and defaultdict
    return type(value) is list or isinstance(value, tuple | dict)


def _referenced_items(
    container, seen: set, found: list, layout: _Layout, depth: int, tensors: bool
) -> None:
    """The walk through a list, tuple or dict (an OrderedDict, a namedtuple too): its items
    are one level deeper. The snapshot keeps the list's items or the dict's keys and values,
    so that an item rebound or added between calls (``opts[1] = other``,
    ``opts.append(...)``) makes the next call walk again; a tuple cannot change. A container
    larger than ``MAX_CONTAINER_ITEMS`` is not entered (a data set held in a list is no
    state). Without ``tensors``, tensors are skipped, and only a container that is empty or
    leads to a module, optimizer or scheduler is kept in the snapshot (a list of losses the
    loop appends to is not re-checked)."""
    size = len(container)
    if size > MAX_CONTAINER_ITEMS or layout.walked_items + size > MAX_WALKED_ITEMS:
        return
    layout.walked_items += size
    values = container.values() if isinstance(container, dict) else container
    if not tensors and container and not any(map(_holds_state, values)):
        return
    marks = layout.snapshot_marks()
    before = len(found)
    if isinstance(container, dict):
        layout.dicts.append(_snapshot(container))
    elif type(container) is list:
        layout.lists.append((container, tuple(container)))
    wanted = _STATEFUL_OR_TENSOR if tensors else _STATEFUL
    for value in values:
        if isinstance(value, wanted) or _is_container(value) or enterable(value):
            _referenced(value, seen, found, layout, depth + 1, tensors)
    if not tensors and container and len(found) == before:
        layout.drop_snapshot_since(marks)  # (a history of tuples or of small objects)


def _holds_state(value) -> bool:
    return isinstance(value, _STATEFUL) or _is_container(value) or enterable(value)


@functools.cache
def _global_names(code: types.CodeType) -> tuple[str, ...]:
    names = list(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):  # nested functions and lambdas
            names.extend(_global_names(const))
    return tuple(dict.fromkeys(names))


def _move_cpu_state_to_jax(opt) -> None:
    """CPU step counts (kept there by PyTorch for eager speed) become jax state tensors."""
    for p, entries in opt.state.items():
        if not isinstance(p, Tensor):
            continue
        for name, value in list(entries.items()):
            if isinstance(value, torch.Tensor) and not isinstance(value, Tensor):
                entries[name] = Tensor(
                    torchlax_core.current_env().place(
                        jnp.asarray(value.detach().cpu().numpy()), p.device
                    )
                )


class CpuStateError(RuntimeError):
    """An optimizer of the step holds CPU parameters (the step is then run on promoted state).

    ``found`` is what the walk reached, so the CPU path does not walk again.
    """

    found: list


def cpu_state_tensors(found: list) -> tuple[list, list]:
    """The CPU tensors of a step over CPU state (parameters, buffers, optimizer state), and
    its optimizers, among the objects ``find_state`` reached (``CpuStateError.found``)."""
    optimizers = [o for o in found if isinstance(o, torch.optim.Optimizer)]
    optimizers += [s.optimizer for s in found if isinstance(s, _Scheduler)]
    tensors: dict = {}

    def add(t):
        if isinstance(t, torch.Tensor) and not isinstance(t, Tensor):
            tensors.setdefault(id(t), t)

    for m in found:
        if isinstance(m, torch.nn.Module):
            for t in (*m.parameters(), *m.buffers()):
                add(t)
    for opt in optimizers:
        for group in opt.param_groups:
            for p in group["params"]:
                add(p)
                for value in opt.state.get(p, {}).values():
                    add(value)
    return list(tensors.values()), optimizers


def _cpu_optimizer_error(opt, found: list) -> RuntimeError:
    error = CpuStateError(
        f"torchlax.jit: the optimizer {type(opt).__name__} holds parameters that are not on "
        "the 'jax' device; the call lends them to the program (caught by _Jitted.__call__)."
    )
    error.found = found
    return error
