"""The state a ``torchlax.jit`` call reaches, as found, and its guard: re-checked cheaply on each
call.

Finding the state (``_discover``) walks the function's closures and globals, every module's
parameters and buffers and every optimizer's groups and state. What that walk read is kept
in a ``_Layout``: the objects holding state, in the order their storages become program
inputs, and a snapshot of every container the walk looked into. A later call checks the
snapshot by identity (``_Layout.holds``) and only re-reads what each step replaces
(``.grad``s, optimizer state values, learning rates: ``_Layout.assemble``, a ``_StateSet``).
Any difference (a parameter replaced, ``opt.add_param_group``, a new submodule, a module hook
registered or removed, another closed-over object) makes the next call walk again; a false
alarm only costs that walk.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from itertools import chain, repeat
from operator import getitem, is_

import numpy as np
import torch
from torch.nn.modules import module as _torch_module
from torch.utils import _pytree as pytree
from torch.utils.hooks import RemovableHandle
from torchlax_core import Tensor
from torchlax_core.internal import array_of, storage_getter, storage_of, view_kind

from ._walk import ABSENT as _ABSENT
from ._walk import cell_contents, enterable, same_values, slot_values

_Scheduler = torch.optim.lr_scheduler.LRScheduler


# The hook dicts ``Module.__call__`` consults (``_call_impl``, torch 2.14), per module and
# global. Each ``_with_kwargs`` or ``_always_called`` dict holds keys of its forward hook dict
# (registration fills both, ``handle.remove()`` empties both), and a module's or the global
# ``_is_full_backward_hook`` changes only with a registration in its backward hook dict: these
# four, and the four global ones, tell every change of the hooks a call runs.
_HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")


_GLOBAL_HOOK_DICTS = (  # mutated in place by torch's register_module_*_hook, never rebound
    _torch_module._global_forward_pre_hooks,
    _torch_module._global_forward_hooks,
    _torch_module._global_backward_pre_hooks,
    _torch_module._global_backward_hooks,
)


# PyTorch's check for a __torch_function__ override skipped (see _Layout._guard)
_NO_TORCH_FUNCTION = torch._C.DisableTorchFunctionSubclass


_STATEFUL = (torch.nn.Module, torch.optim.Optimizer, _Scheduler)


_TENSOR = object()  # an optimizer state entry's kind: a torchlax Tensor


@dataclasses.dataclass
class _StateSet:
    """The state one call reads and may change.

    ``storages`` are the distinct storages of every state tensor (tied weights and views share
    one); their arrays are program inputs and outputs. ``.grad`` slots and optimizer state
    entries are tracked as objects too, since a step replaces them (``zero_grad`` sets
    ``None``, ``backward`` creates new grads, the first ``opt.step`` creates its state).
    """

    storages: list
    owners: list  # one torchlax Tensor per storage (for autograd and write-back)
    grads: list  # parameters whose .grad the program may change
    modules: list  # every module reached (their train/eval flags select the program)
    optimizers: list
    schedulers: list
    lrs: list  # (param_group, value) for each learning rate that is an input
    lr_types: list  # the numpy type each learning rate is passed as (see _lr_type)
    cpu_tensors: dict  # name -> CPU parameter/buffer of a module target (forward only)
    static_structure: object  # what of the structure the layout's snapshot guarantees
    # Positions in ``grads`` of .grads the step discards unread (zero_grad(set_to_none=True)
    # first): not program inputs, and ``None`` while tracing.
    dead_grads: tuple[int, ...] = ()

    # structure(), once computed: valid while the state is (``_Layout.assemble`` reuses a
    # state only while no parameter has a .grad).
    _structure: tuple | None = dataclasses.field(default=None, repr=False, compare=False)

    def structure(self) -> tuple:
        """What of the state is part of the program's identity (not its values)."""
        structure = self._structure
        if structure is None:
            grads = tuple(p.grad is not None for p in self.grads)
            structure = self._structure = (grads, self.static_structure)
        return structure

    def without_grads(self, dead: tuple[int, ...]) -> _StateSet:
        """This state less the storages of the ``.grad``s at positions ``dead``."""
        drop = {id(storage_of(self.grads[i].grad)) for i in dead}
        kept = [
            (s, o) for s, o in zip(self.storages, self.owners, strict=True) if id(s) not in drop
        ]
        return dataclasses.replace(
            self,
            storages=[s for s, _ in kept],
            owners=[o for _, o in kept],
            dead_grads=dead,
        )


class _Hashed:
    """A cache key's part that stays the same over many calls, hashed once: the structure the
    state's layout fixes (a training step's optimizer structure is a large tuple), the state's
    signature (hashing numpy dtypes is not cheap). Each call's lookups would hash it again."""

    __slots__ = ("value", "_hash")

    def __init__(self, value: tuple):
        self.value = value
        self._hash = hash(value)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return self is other or (isinstance(other, _Hashed) and self.value == other.value)


class _ByIdentity:
    """An object in a cache key, equal only to itself."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other) -> bool:
        return isinstance(other, _ByIdentity) and other.obj is self.obj


@dataclasses.dataclass
class _Layout:
    """Where one function's state lives, and a snapshot of what finding it read."""

    modules: list = dataclasses.field(default_factory=list)
    optimizer_list: list = dataclasses.field(default_factory=list)
    schedulers: list = dataclasses.field(default_factory=list)
    tensors: list = dataclasses.field(default_factory=list)  # closed-over torchlax Tensors
    # In input order: state tensors, and optimizer state entries (a dict: its tensor values).
    recipe: list = dataclasses.field(default_factory=list)
    grads: list = dataclasses.field(default_factory=list)  # parameters
    lr_groups: list = dataclasses.field(default_factory=list)  # groups whose lr is an input
    lr_types: list = dataclasses.field(default_factory=list)  # per lr group: _lr_type
    cpu_tensors: dict = dataclasses.field(default_factory=dict)
    static_structure: object = ()
    # Assembled once (see find_state): the storages of the recipe's tensors, their ids and
    # owners, and the optimizer state dicts whose tensors each call reads anew.
    fixed_storages: list = dataclasses.field(default_factory=list)
    fixed_owners: list = dataclasses.field(default_factory=list)
    fixed_ids: set = dataclasses.field(default_factory=set)
    entry_dicts: list = dataclasses.field(default_factory=list)
    requires_grads: list = dataclasses.field(default_factory=list)  # per grads parameter
    # The snapshot: what the walk read, each checked by identity on later calls.
    arg_objects: tuple = ()
    # of the arg_objects that are no state themselves but lead to some (keyed_statics)
    _arg_holder_ids: frozenset = frozenset()
    cells: list = dataclasses.field(default_factory=list)  # (cell, contents)
    defaults: list = dataclasses.field(default_factory=list)  # (fn, __defaults__, __kwdefaults__)
    globals: list = dataclasses.field(default_factory=list)  # (namespace, name, value)
    # _snapshot of a dict the walk went through
    dicts: list = dataclasses.field(default_factory=list)
    lists: list = dataclasses.field(default_factory=list)  # (list, its items) the walk went through
    # (attribute dict, its keys, the names and values of the attributes that lead to state,
    # the object, its slots that do, their values) of each object the walk entered
    objects: list = dataclasses.field(default_factory=list)
    walked_items: int = 0  # the items of every container the walk went through
    module_dicts: list = dataclasses.field(default_factory=list)  # _snapshot each
    trainings: list = dataclasses.field(default_factory=list)  # (module, training)
    # The empty hook dicts of the modules and PyTorch's global ones (_snapshot_hooks), and
    # RemovableHandle.next_id when they were last seen empty
    unused_hook_dicts: list = dataclasses.field(default_factory=list)
    _hook_id: int = -1
    tensor_storages: list = dataclasses.field(default_factory=list)  # (tensor, storage)
    optimizers: list = dataclasses.field(default_factory=list)  # (opt, groups, tuple, state)
    groups: list = dataclasses.field(default_factory=list)  # (group, hyper, lr?, params, tuple)
    entries: list = dataclasses.field(default_factory=list)  # (opt.state, p, entries, kinds)
    scheduler_optimizers: list = dataclasses.field(default_factory=list)
    # assemble()'s last state, kept while it has no optimizers and no .grads
    _assembled: _StateSet | None = None
    _nones: tuple = ()  # one None per parameter in ``grads``
    # The module part of the snapshot flattened (``_flatten_snapshot``), for holds()
    _dicts: tuple = ()  # every module dict (_parameters, _buffers, _modules, hooks in use)
    _dict_keys: tuple = ()  # per dict, the tuple of its keys in order
    # each key of those dicts, the dict holding it, and its value: one flat sequence each
    _value_dicts: tuple = ()
    _value_keys: tuple = ()
    _flag_objects: tuple = ((), (), ())  # parameters in ``grads``, modules, state tensors
    # the dicts' values, then the flag objects' requires_grad, training and _storage, in that
    # order: what _hold_modules() reads now
    _flags: tuple = ()
    # map(*_training_reads): each module's training flag (see _flatten_snapshot)
    _training_reads: tuple = (getattr, (), ())
    # the module part of the snapshot checked (``_guard(None)``, made by _flatten_snapshot)
    _hold_modules: Callable[[], bool] = dataclasses.field(init=False, repr=False)
    _sections: tuple = ()  # the checks of the other parts of the snapshot that are not empty
    _flat_entries: _FlatEntries | None = None  # ``entries`` laid out flat, once checked

    def _flatten_snapshot(self) -> None:
        """Lay out the module part of the snapshot as a few flat tuples, so that ``holds()``
        checks it in a few C-level passes (a Python loop per module and parameter was most of
        a forward call's own cost): each dict's keys in order, as one tuple per dict compared
        with ``==`` (sizes, order and names at once); then each value, looked up by its key
        in its dict, by identity. The other parts of the snapshot are kept as the list of
        their checks, empty ones left out."""
        self._dicts = tuple(d for d, _, _ in self.module_dicts)
        self._dict_keys = tuple(keys for _, keys, _ in self.module_dicts)
        self._value_dicts = tuple(d for d, keys, _ in self.module_dicts for _ in keys)
        self._value_keys = tuple(k for _, keys, _ in self.module_dicts for k in keys)
        modules = tuple(m for m, _ in self.trainings)
        tensors = tuple(t for t, _ in self.tensor_storages)
        self._flag_objects = (tuple(self.grads), modules, tensors)
        # A module's training flag is an entry of its __dict__ (``Module.__setattr__`` puts it
        # there, ``train()``/``eval()`` too): read there, not through ``nn.Module``'s
        # attribute lookup (its ``__getattr__`` makes every read a slot call). A class that
        # defines ``training`` itself is read as an attribute.
        names = ("training",) * len(modules)
        if all("training" in vars(m) and not hasattr(type(m), "training") for m in modules):
            self._training_reads = (getitem, tuple(map(vars, modules)), names)
        else:
            self._training_reads = (getattr, modules, names)
        self._flags = (
            *(v for _, _, values in self.module_dicts for v in values),
            *self.requires_grads,
            *(flag for _, flag in self.trainings),
            *(storage for _, storage in self.tensor_storages),
        )
        sections = (
            (self._cells_hold, self.cells),
            (self._defaults_hold, self.defaults),
            (self._globals_hold, self.globals),
            (self._dicts_hold, self.dicts),
            (self._lists_hold, self.lists),
            (self._objects_hold, self.objects),
            (self._schedulers_hold, self.scheduler_optimizers),
            (self._optimizers_hold, self.optimizers),
            (self._groups_hold, self.groups),
            (self._entries_hold, self.entries),
            (self._cpu_tensors_hold, self.cpu_tensors),
        )
        self._sections = tuple(check for check, snapshot in sections if snapshot)
        self._hold_modules = self._guard(None)

    def keyed_statics(self, statics: tuple) -> tuple:
        """The arguments' static values as the program's key holds them: an object among
        the arguments through which the walk found state (``step(state, x, y)``) by its
        identity, as a module argument is (a dataclass or ``SimpleNamespace`` is not
        hashable; the program traced it, not another equal one). Other objects keep their
        own hash and equality (an equal frozen config shares the program)."""
        holders = self._arg_holder_ids
        if not holders:
            return statics
        return tuple(_ByIdentity(s) if id(s) in holders else s for s in statics)

    def holds(self, arg_leaves: list) -> bool:
        """Whether walking again would find the same objects, in the same structure."""
        args = [  # _arg_holders(arg_leaves), inlined: this runs on every call
            leaf
            for leaf in arg_leaves
            if not isinstance(leaf, torch.Tensor)
            and (isinstance(leaf, _STATEFUL) or enterable(leaf))
        ]
        if len(args) != len(self.arg_objects) or not all(map(operator.is_, args, self.arg_objects)):
            return False
        return self.holds_reached()

    def holds_reached(self) -> bool:
        """``holds()`` less its check of the arguments (for a call whose arguments are
        tensors only, while the layout has no module or optimizer among its arguments)."""
        return self._hold_modules() and self._sections_hold()

    def forward_guard(self, state: _StateSet) -> Callable[[], bool]:
        """``holds_reached() and reused(state)`` as one function made for this layout and
        ``state``, for a caller that asks it on every call (``torchlax.jit``'s repeated
        forward): the module reads, and no ``.grad`` on any parameter, in one frame over local
        names (``_guard``). (Whether each storage of ``state`` still holds the array a
        repeated forward recorded is its caller's check, made before the launch.)"""
        return self._guard(state)

    def _guard(self, state: _StateSet | None) -> Callable[[], bool]:
        """The module part of the snapshot as one function over local names: the modules'
        dicts (their keys in order, then their values), each parameter's ``requires_grad``,
        each module's ``training`` and each state tensor's storage, by identity (bools and
        None are singletons), in C-level passes. With ``state`` (``forward_guard``) also: the
        layout still assembles ``state``, no parameter has a ``.grad``, and the other
        sections of the snapshot; without (``_hold_modules``, made once per layout) the
        module part alone.

        Each call runs it with cold caches (XLA ran since the last one), where every frame
        and attribute lookup costs several times its warm cost: the same reads through a
        method's frame and the layout's attributes cost ~5 us more per call (MLP forward,
        loaded). The tensors' flags are read with ``__torch_function__`` off: each such read
        of a Tensor subclass otherwise first looks up that attribute on the tensor (PyTorch's
        check for an override; a torchlax Tensor has none while no environment installs
        one), which was a third of a repeated forward's checks."""
        layout = self
        dicts, keys = self._dicts, self._dict_keys
        value_dicts, value_keys = self._value_dicts, self._value_keys
        params, _, tensors = self._flag_objects
        read_training, training_of, training_names = self._training_reads
        forward = state is not None
        without_grads = params if forward else ()
        expected = (*self._flags, *self._nones) if forward else self._flags
        sections = forward and bool(self._sections)

        def holds() -> bool:
            if forward and layout._assembled is not state:
                return False
            if RemovableHandle.next_id != layout._hook_id and not layout._no_new_hooks():
                return False
            try:
                with _NO_TORCH_FUNCTION():
                    if tuple(map(tuple, dicts)) != keys or not all(
                        map(
                            is_,
                            chain(
                                map(getitem, value_dicts, value_keys),
                                map(_REQUIRES_GRAD, params),
                                map(read_training, training_of, training_names),
                                map(storage_getter, tensors),
                                map(_GRAD, without_grads),
                            ),
                            expected,
                        )
                    ):
                        return False
            except AttributeError:  # swapped for a tensor that is no torchlax Tensor
                return False
            return not sections or layout._sections_hold()

        return holds

    def _no_new_hooks(self) -> bool:
        """After a hook was registered somewhere (``RemovableHandle``'s counter moved): whether
        the layout's empty hook dicts are all still empty. Registration is the only way into a
        hook dict, and each takes a new handle id, so while the counter stands none can have
        changed: one read per call instead of one per module and hook kind. A registration
        elsewhere (a tensor hook, a trace's own hooks) costs one pass over them."""
        seen = RemovableHandle.next_id  # read first: a registration during the pass moves it
        if any(self.unused_hook_dicts):
            return False
        self._hook_id = seen
        return True

    def _sections_hold(self) -> bool:
        # Only the sections of the snapshot this layout has (a module's forward has none:
        # no closure cells, globals, optimizers, ...), each one method (_flatten_snapshot)
        for section in self._sections:
            if not section():
                return False
        return True

    def _cells_hold(self) -> bool:
        for cell, contents in self.cells:
            if cell_contents(cell) is not contents:
                return False
        return True

    def _cpu_tensors_hold(self) -> bool:
        # A CPU module's tensors moved to jax in place (``module.to("jax")`` swaps each
        # tensor object's class and data): the program lent them through DLPack.
        return not any(isinstance(t, Tensor) for t in self.cpu_tensors.values())

    def _defaults_hold(self) -> bool:
        for fn, defaults, kwdefaults in self.defaults:
            if fn.__defaults__ is not defaults or fn.__kwdefaults__ is not kwdefaults:
                return False
        return True

    def _globals_hold(self) -> bool:
        for namespace, name, value in self.globals:
            if namespace.get(name, _ABSENT) is not value:
                return False
        return True

    def _dicts_hold(self) -> bool:
        return all(_unchanged(*s) for s in self.dicts)

    def _lists_hold(self) -> bool:
        for items, snapshot in self.lists:
            if len(items) != len(snapshot) or not all(map(operator.is_, items, snapshot)):
                return False
        return True

    def _objects_hold(self) -> bool:
        is_ = operator.is_
        for attrs, keys, names, values, obj, slots, slot_snapshot in self.objects:
            if attrs is not None and (
                len(attrs) != len(keys)
                or not all(map(is_, attrs, keys))
                or not all(map(is_, map(attrs.get, names), values))
            ):
                return False
            if slots and not same_values(slot_values(obj, slots), slot_snapshot):
                return False
        return True

    def _schedulers_hold(self) -> bool:
        for scheduler, opt in self.scheduler_optimizers:
            if scheduler.optimizer is not opt:
                return False
        return True

    def _optimizers_hold(self) -> bool:
        for opt, groups, snapshot, state in self.optimizers:
            if (
                opt.param_groups is not groups
                or opt.state is not state
                or len(groups) != len(snapshot)
                or not all(map(operator.is_, groups, snapshot))
            ):
                return False
        return True

    def _groups_hold(self) -> bool:
        for group, hyper, lr_input, params, snapshot in self.groups:
            if len(group) != len(hyper) + ("lr" in group):
                return False
            for name, value in hyper:
                if group.get(name, _ABSENT) is not value:
                    return False
            if _is_rate(group.get("lr")) is not lr_input:
                return False
            if len(params) != len(snapshot) or not all(map(operator.is_, params, snapshot)):
                return False
        return True

    def _entries_hold(self) -> bool:
        # Each parameter's state dict, and the names and kinds of its values, checked in a
        # few C-level passes over flat sequences prepared once: a Python loop per parameter
        # and value was a cost per state array of every training step's call.
        flat = self._flat_entries
        if flat is None:
            flat = self._flat_entries = _FlatEntries(self.entries)
        return flat.hold()

    def assemble(self) -> _StateSet:
        """This call's state: the layout's objects, with what each step replaces read anew.

        Without optimizers (a forward) and without ``.grad``s, nothing can change what this
        returns while ``holds()`` is true: the last such state is reused (it holds nothing
        the module does not hold itself)."""
        memo = self._assembled
        no_grads = all(map(operator.is_, map(_GRAD, self.grads), self._nones))
        if memo is not None and no_grads:
            return memo
        state = self._assemble()
        self._assembled = state if no_grads and not self.optimizer_list else None
        return state

    def reused(self, state: _StateSet) -> bool:
        """Whether ``assemble()`` would now return ``state`` (the state it keeps)."""
        return self._assembled is state and all(
            map(operator.is_, map(_GRAD, self.grads), self._nones)
        )

    def _assemble(self) -> _StateSet:
        storages, owners = list(self.fixed_storages), list(self.fixed_owners)
        index = set(self.fixed_ids)

        def add(t):
            storage = storage_of(t)
            if id(storage) not in index:
                index.add(id(storage))
                storages.append(storage)
                owners.append(t)

        for entries in self.entry_dicts:
            for value in entries.values():
                if isinstance(value, Tensor):
                    add(value)
        for p in self.grads:
            grad = p.grad
            if isinstance(grad, Tensor):
                if view_kind(grad) is not None:
                    # A view (autograd keeps e.g. mm's transposed result): its own value as a
                    # tensor, so the program's input is the gradient's shape, as its output is.
                    p.grad = grad = Tensor(array_of(grad))
                add(grad)
        for t in self.tensors:
            add(t)
        lrs = [(group, group["lr"]) for group in self.lr_groups]
        return _StateSet(
            storages,
            owners,
            self.grads,
            self.modules,
            self.optimizer_list,
            self.schedulers,
            lrs,
            self.lr_types,
            self.cpu_tensors,
            self.static_structure,
        )


_GRAD = operator.attrgetter("grad")


_REQUIRES_GRAD = operator.attrgetter("requires_grad")


def arg_leaves(args, kwargs) -> tuple[list, bool]:
    """The arguments' leaves, and whether they are positional tensors only (the common call)."""
    if not kwargs and all(isinstance(a, torch.Tensor) for a in args):
        return list(args), True
    return pytree.tree_leaves((args, kwargs)), False


def _snapshot_hooks(layout: _Layout, hook_dicts) -> None:
    """A hook dict in use joins the module dicts (checked key by key on each call, so that a
    removal is seen); an empty one is checked only after a registration anywhere in the
    process (``_Layout._no_new_hooks``): it can change in no other way."""
    for d in hook_dicts:
        if d:
            layout.module_dicts.append(_snapshot(d))
        else:
            layout.unused_hook_dicts.append(d)


def _snapshot(d: dict) -> tuple:
    return d, tuple(d), tuple(d.values())


def _unchanged(d: dict, keys: tuple, values: tuple) -> bool:
    if not keys:
        return not d
    return (
        len(d) == len(keys)
        and all(map(operator.is_, d, keys))
        and all(map(operator.is_, d.values(), values))
    )


class _FlatEntries:
    """``_Layout.entries`` as flat sequences, so that ``hold()`` checks per entry (each
    parameter's state dict is the one of the snapshot; each dict has the same names in the
    same order; a value that was a torchlax Tensor still is one, any other is the very same
    object) in one C-level pass per kind of check."""

    __slots__ = (
        "_states",
        "_params",
        "_dicts_now",
        "_dicts",
        "_sizes",
        "_names",
        "_tensors_at",
        "_others_at",
        "_others",
        "_get",
        "_values",
    )

    def __init__(self, entries: list):
        self._states = tuple(state for state, _, _, _ in entries)
        self._params = tuple(p for _, p, _, _ in entries)
        # what dict.get answers: an absent entry is None (a state dict is never None)
        self._dicts_now = tuple(None if e is _ABSENT else e for _, _, e, _ in entries)
        checked = [(e, kinds) for _, _, e, kinds in entries if kinds is not None]
        self._dicts = tuple(e for e, _ in checked)
        self._sizes = tuple(len(kinds) for _, kinds in checked)
        flat = [kind for _, kinds in checked for kind in kinds]
        self._names = tuple(name for name, _ in flat)
        self._tensors_at = tuple(i for i, (_, kind) in enumerate(flat) if kind is _TENSOR)
        self._others_at = tuple(i for i, (_, kind) in enumerate(flat) if kind is not _TENSOR)
        self._others = tuple(kind for _, kind in flat if kind is not _TENSOR)
        # dict's own methods are C-level; an optimizer keeping its state in another mapping
        # type is read through that type's methods
        self._get = dict.get if all(isinstance(s, dict) for s in self._states) else mapping_get
        self._values = dict.values if all(isinstance(d, dict) for d in self._dicts) else _values

    def hold(self) -> bool:
        is_ = operator.is_
        if not all(map(is_, map(self._get, self._states, self._params), self._dicts_now)):
            return False
        dicts = self._dicts
        if tuple(map(len, dicts)) != self._sizes or not all(
            map(operator.eq, chain.from_iterable(dicts), self._names)
        ):
            return False
        values = tuple(chain.from_iterable(map(self._values, dicts)))
        at = values.__getitem__
        return all(map(isinstance, map(at, self._tensors_at), repeat(Tensor))) and all(
            map(is_, map(at, self._others_at), self._others)
        )


def mapping_get(mapping, key):
    """``mapping.get(key)`` for an optimizer keeping its state in a mapping other than a dict
    (a dict's own C-level ``dict.get`` is used where every one is a dict)."""
    return mapping.get(key)


def _values(mapping):
    return mapping.values()


def _lr_type(params) -> type:
    """The type a group's learning rate is passed as: float64 if a parameter is 64-bit, else
    float32. PyTorch combines a Python-float rate with a float32 tensor in float32 (as a
    scalar of the tensor's dtype), so this keeps the optimizer's scalar arithmetic (``lr /
    bias_correction``) in the dtype PyTorch computes it in, and float64 models exact."""
    wide = (torch.float64, torch.complex128)
    return np.float64 if any(p.dtype in wide for p in params) else np.float32


def _is_rate(value) -> bool:
    """Whether a group's learning rate is an input of the program: a Python number, or a 0-d
    floating tensor (``SGD(params, lr=torch.tensor(0.1))``, which a scheduler changes in place
    with ``fill_``: baked in, a CPU one would silently keep its first value, a jax one compile
    the step again on each change). Either is passed as its value, in the group's precision."""
    if _is_number(value):
        return True
    return isinstance(value, torch.Tensor) and value.ndim == 0 and value.is_floating_point()


def _is_number(value) -> bool:
    return isinstance(value, float | int) and not isinstance(value, bool)


def _optimizer_structure(opt) -> tuple:
    groups = []
    for group in opt.param_groups:
        hyper = []
        for name, value in group.items():
            if name in ("params", "lr"):
                continue
            hyper.append((name, _hashable(value)))
        groups.append(tuple(hyper))
    state = []
    for group in opt.param_groups:
        for p in group["params"]:
            entries = opt.state.get(p)
            state.append(
                tuple(
                    (name, "tensor" if isinstance(v, torch.Tensor) else _hashable(v))
                    for name, v in (entries or {}).items()
                )
            )
    return type(opt), tuple(groups), tuple(state)


def _hashable(value):
    if isinstance(value, list | tuple):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype)
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value
