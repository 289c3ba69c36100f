"""The state a ``torchlax.jit`` call reaches, as found, and its guard: re-checked cheaply on each
call.

Finding the state (``_discover``) walks the function's closures and globals, every module's
parameters and buffers and every optimizer's groups and state. What it found is kept in a
``_Layout`` (the objects holding state, in the order their storages become program inputs),
and what it read on the way in the layout's ``_Snapshot``. A later call checks the snapshot by
identity (``_Layout.holds``) and only re-reads what each step replaces (``.grad``s, optimizer
state values, learning rates: ``_Layout.assemble``, a ``_StateSet``). Any difference (a
parameter replaced, ``opt.add_param_group``, a new submodule, a module hook registered or
removed, another closed-over object) makes the next call walk again; a false alarm only costs
that walk.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from itertools import chain, repeat, starmap
from operator import getitem, is_

import numpy as np
import torch
from torch.nn.modules import module as _torch_module
from torch.utils import _pytree as pytree
from torch.utils.hooks import RemovableHandle
from torchlax_core import Tensor
from torchlax_core.internal import array_of, storage_of, view_kind

from ._walk import enterable

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


# PyTorch's check for a __torch_function__ override skipped (see _Layout.forward_guard)
_NO_TORCH_FUNCTION = torch._C.DisableTorchFunctionSubclass


_STATEFUL = (torch.nn.Module, torch.optim.Optimizer, _Scheduler)


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


class _Snapshot:
    """What finding the state read, to check on a later call that reading it again gives the
    same objects, by identity: reads (``read``: a reader and its arguments, recorded with
    what it returned), sequences read live (``items``: a list's items, a dict's keys: the
    same objects in the same order) and mapping entries that need only hold some torchlax
    Tensor (``tensor_at``: an optimizer state value each step replaces). Reads are grouped by
    reader for ``_Layout.forward_guard``'s C-level passes: one ``map`` per reader
    (``getattr``, ``dict.get``, a storage getter, ...), not a Python loop per object."""

    def __init__(self):
        self.reads: dict[tuple, list] = {}  # (reader, its arity) -> [(*arguments, value)]
        self.sequences: list = []  # (the sequence, its items then)
        self.tensor_entries: list = []  # (mapping, key)

    def read(self, reader: Callable, *args):
        value = reader(*args)
        self.reads.setdefault((reader, len(args)), []).append((*args, value))
        return value

    def items(self, *sequences) -> None:
        self.sequences.extend((s, tuple(s)) for s in sequences)

    def dict(self, d: dict) -> None:
        """``d``'s keys, and its values read by key."""
        self.items(d)
        for key in d:
            self.read(getitem, d, key)

    def tensor_at(self, mapping, key) -> None:
        self.tensor_entries.append((mapping, key))


@dataclasses.dataclass
class _Layout:
    """Where one function's state lives, and a snapshot of what finding it read."""

    modules: list = dataclasses.field(default_factory=list)
    optimizer_list: list = dataclasses.field(default_factory=list)
    schedulers: list = dataclasses.field(default_factory=list)
    tensors: list = dataclasses.field(default_factory=list)  # closed-over torchlax Tensors
    grads: list = dataclasses.field(default_factory=list)  # parameters
    lr_groups: list = dataclasses.field(default_factory=list)  # groups whose lr is an input
    lr_types: list = dataclasses.field(default_factory=list)  # per lr group: _lr_type
    cpu_tensors: dict = dataclasses.field(default_factory=dict)
    static_structure: object = ()
    # The distinct storages of the modules' and optimizers' tensors in program input order
    # (fixed while ``holds()`` is true), their ids and owners, and the optimizer state dicts
    # whose tensors each call reads anew.
    fixed_storages: list = dataclasses.field(default_factory=list)
    fixed_owners: list = dataclasses.field(default_factory=list)
    fixed_ids: set = dataclasses.field(default_factory=set)
    entry_dicts: list = dataclasses.field(default_factory=list)
    arg_objects: tuple = ()  # the arguments the walk entered
    # of the arg_objects that are no state themselves but lead to some (keyed_statics)
    _arg_holder_ids: frozenset = frozenset()
    snapshot: _Snapshot = dataclasses.field(default_factory=_Snapshot)
    # The empty hook dicts of the modules and PyTorch's global ones (_snapshot_hooks), and
    # RemovableHandle.next_id when they were last seen empty
    unused_hook_dicts: list = dataclasses.field(default_factory=list)
    _hook_id: int = -1
    # assemble()'s last state, kept while it has no optimizers and no .grads
    _assembled: _StateSet | None = None
    _nones: tuple = ()  # one None per parameter in ``grads``
    _holds: Callable[[], bool] = dataclasses.field(init=False, repr=False)  # forward_guard

    def seal(self) -> None:
        """Make the checks of the layout as found (after the walk)."""
        self._nones = (None,) * len(self.grads)
        self._holds = self.forward_guard(None)

    @property
    def globals(self) -> list:
        """(namespace, name, value) of each global the walk read (``_discover._StateWalk``)."""
        reads = self.snapshot.reads.get((dict.get, 3), ())
        return [(namespace, name, value) for namespace, name, _, value in reads]

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
        args = [  # _discover._arg_holders(arg_leaves), inlined: this runs on every call
            leaf
            for leaf in arg_leaves
            if not isinstance(leaf, torch.Tensor)
            and (isinstance(leaf, _STATEFUL) or enterable(leaf))
        ]
        if len(args) != len(self.arg_objects) or not all(map(is_, args, self.arg_objects)):
            return False
        return self._holds()

    def forward_guard(self, state: _StateSet | None) -> Callable[[], bool]:
        """The snapshot's check (``holds()`` less its check of the arguments) as one function
        over local names, in C-level passes (bools and None are singletons, so every read is
        compared by identity). With ``state``, for ``torchlax.jit``'s repeated forward, which
        asks it on every call: also ``reused(state)`` (whether each storage of ``state``
        still holds the array it recorded is its own check, made before the launch).

        One frame over local names: each call runs it with cold caches (XLA ran since the last
        one), where every frame and attribute lookup costs several times its warm cost
        (benchmarks/README.md). The tensors' flags are read with ``__torch_function__`` off:
        each such read of a Tensor subclass otherwise first looks the attribute up on the
        tensor (PyTorch's check for an override)."""
        layout, forward, snapshot = self, state is not None, self.snapshot
        # Each reader's rows as columns: (reader, *argument columns, values expected)
        reads = [(reader, *zip(*rows)) for (reader, _), rows in snapshot.reads.items()]
        if forward:
            reads.append((_GRAD, tuple(self.grads), self._nones))
        table = tuple(columns[:-1] for columns in reads)
        sequences = tuple(s for s, _ in snapshot.sequences)
        lengths = tuple(len(items) for _, items in snapshot.sequences)
        filled = tuple(s for s, items in snapshot.sequences if items)
        mappings, keys = tuple(zip(*snapshot.tensor_entries)) or ((), ())
        expected = (  # in the order holds() reads them
            *chain.from_iterable(items for s, items in snapshot.sequences if items),
            *chain.from_iterable(columns[-1] for columns in reads),
            *repeat(True, len(mappings)),
        )

        def holds() -> bool:
            if forward and layout._assembled is not state:
                return False
            if RemovableHandle.next_id != layout._hook_id and not layout._no_new_hooks():
                return False
            if tuple(map(len, sequences)) != lengths:
                return False
            try:
                with _NO_TORCH_FUNCTION():
                    return all(
                        map(
                            is_,
                            chain(
                                chain.from_iterable(filled),
                                chain.from_iterable(starmap(map, table)),
                                map(isinstance, map(getitem, mappings, keys), repeat(Tensor)),
                            ),
                            expected,
                        )
                    )
            except (AttributeError, KeyError):  # (a tensor swapped for one no torchlax Tensor)
                return False

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

    def assemble(self) -> _StateSet:
        """This call's state: the layout's objects, with what each step replaces read anew.

        Without optimizers (a forward) and without ``.grad``s, nothing can change what this
        returns while ``holds()`` is true: the last such state is reused (it holds nothing
        the module does not hold itself)."""
        memo = self._assembled
        no_grads = self._no_grads()
        if memo is not None and no_grads:
            return memo
        state = self._assemble()
        self._assembled = state if no_grads and not self.optimizer_list else None
        return state

    def reused(self, state: _StateSet) -> bool:
        """Whether ``assemble()`` would now return ``state`` (the state it keeps)."""
        return self._assembled is state and self._no_grads()

    def _no_grads(self) -> bool:
        return all(map(operator.is_, map(_GRAD, self.grads), self._nones))

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
    """A hook dict in use joins the snapshot (checked key by key on each call, so that a
    removal is seen); an empty one is checked only after a registration anywhere in the
    process (``_Layout._no_new_hooks``): it can change in no other way."""
    for d in hook_dicts:
        if d:
            layout.snapshot.dict(d)
        else:
            layout.unused_hook_dicts.append(d)


def mapping_get(mapping, key):
    """``mapping.get(key)`` for an optimizer keeping its state in a mapping other than a dict
    (a dict's own C-level ``dict.get`` is used where every one is a dict)."""
    return mapping.get(key)


def _lr_type(params) -> type:
    """The type a group's learning rate is passed as: float64 if a parameter is 64-bit, else
    float32. PyTorch combines a Python-float rate with a float32 tensor in float32 (as a
    scalar of the tensor's dtype), so this keeps the optimizer's scalar arithmetic (``lr /
    bias_correction``) in the dtype PyTorch computes it in, and float64 models exact."""
    wide = (torch.float64, torch.complex128)
    return np.float64 if any(p.dtype in wide for p in params) else np.float32


def _rate_in(group: dict) -> bool:
    """Whether a group's learning rate is an input of the program: a Python number, or a 0-d
    floating tensor (``SGD(params, lr=torch.tensor(0.1))``, which a scheduler changes in place
    with ``fill_``: baked in, a CPU one would silently keep its first value, a jax one compile
    the step again on each change). Either is passed as its value, in the group's precision."""
    value = group.get("lr")
    if isinstance(value, float | int):
        return not isinstance(value, bool)
    return isinstance(value, torch.Tensor) and value.ndim == 0 and value.is_floating_point()
