"""The state a ``torchlax.jit`` call reaches as found (``_Layout``, by ``_discover``), its guard
(``_Layout.holds``: every read of the walk, its ``_Snapshot``, checked by identity) and one
call's state (``_StateSet``, ``_Layout.assemble``: what each step replaces read anew). Any
difference makes the next call walk again (docs/architecture.md, "The walk's guard").
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
# global: the ``_with_kwargs``/``_always_called`` dicts and ``_is_full_backward_hook`` change
# only with these, so they tell every change of the hooks a call runs.
_HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")


_GLOBAL_HOOK_DICTS = (  # mutated in place by torch's register_module_*_hook, never rebound
    _torch_module._global_forward_pre_hooks,
    _torch_module._global_forward_hooks,
    _torch_module._global_backward_pre_hooks,
    _torch_module._global_backward_hooks,
)


# PyTorch's check for a __torch_function__ override skipped (see _Layout.forward_guard)
_NO_TORCH_FUNCTION = torch._C.DisableTorchFunctionSubclass


_END = (object(),)  # the last object of both sides of a guard's pass (forward_guard)
_STATEFUL = (torch.nn.Module, torch.optim.Optimizer, _Scheduler)
_GRAD = operator.attrgetter("grad")
_REQUIRES_GRAD = operator.attrgetter("requires_grad")


@dataclasses.dataclass
class _StateSet:
    """The state one call reads and may change: the distinct storages of every state tensor
    (tied weights and views share one), program inputs and outputs, and the objects a step
    replaces (``.grad``s, optimizer state entries)."""

    storages: list
    owners: list  # one torchlax Tensor per storage (for autograd and write-back)
    grads: list  # parameters whose .grad the program may change
    optimizers: list
    schedulers: list
    lrs: list  # (param_group, value) for each learning rate that is an input
    lr_types: list  # the numpy type each learning rate is passed as (see _lr_type)
    cpu_tensors: dict  # name -> CPU parameter/buffer of a module target (forward only)
    # What of the state is part of the program's identity (not its values): which parameters
    # have a .grad, and what of the structure the layout's snapshot guarantees
    structure: tuple
    # Positions in ``grads`` of .grads the step discards unread (zero_grad(set_to_none=True)
    # first): not program inputs, and ``None`` while tracing.
    dead_grads: tuple[int, ...] = ()

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
    """A cache key's part that stays the same over many calls (the layout's structure, the
    state's signature), hashed once."""

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
    """What finding the state read, for a later call to check by identity: reads (``read``,
    grouped by reader for ``forward_guard``'s C-level passes), sequences read live
    (``items``) and mapping entries that need only hold some torchlax Tensor (``tensor_at``)."""

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
        """The arguments' static values as the program's key holds them: an argument through
        which the walk found state by its identity (the program traced it, not an equal one),
        others by their own hash and equality."""
        holders = self._arg_holder_ids
        if not holders:
            return statics
        return tuple(_ByIdentity(s) if id(s) in holders else s for s in statics)

    def holds(self, arg_leaves: list) -> bool:
        """Whether walking again would find the same objects, in the same structure."""
        args = [  # the arguments the walk enters, as _discover._reached picks them (inline: hot)
            leaf
            for leaf in arg_leaves
            if not isinstance(leaf, torch.Tensor)
            and (isinstance(leaf, _STATEFUL) or enterable(leaf))
        ]
        if len(args) != len(self.arg_objects) or not all(map(is_, args, self.arg_objects)):
            return False
        return self._holds()

    def forward_guard(
        self, state: _StateSet | None, live: Callable[[], tuple] | None = None, typed: bool = True
    ) -> Callable[[], bool]:
        """The snapshot's check (``holds()`` less the arguments') as one function over local
        names, in C-level passes by identity (each call runs it with cold caches, where every
        lookup costs several times its warm cost: benchmarks/README.md); with ``state`` (the
        repeated forward's), also ``reused(state)``. ``live()``: the caller's own objects to
        compare by identity in the same pass, ``(now, expected)`` (a step's ``.grad``s and
        optimizer state values); ``typed=False`` leaves out the snapshot's check that each
        optimizer state tensor is still one, for a caller whose ``live`` compares them."""
        layout, forward, snapshot = self, state is not None, self.snapshot
        # Each reader's rows as columns: (reader, *argument columns, values expected)
        reads = [(reader, *zip(*rows)) for (reader, _), rows in snapshot.reads.items()]
        if forward:
            reads.append((_GRAD, tuple(self.grads), self._nones))
        table = tuple(columns[:-1] for columns in reads)
        sequences = tuple(s for s, _ in snapshot.sequences)
        lengths = tuple(len(items) for _, items in snapshot.sequences)
        filled = tuple(s for s, items in snapshot.sequences if items)
        entries = snapshot.tensor_entries if typed else ()
        mappings, keys = tuple(zip(*entries)) or ((), ())
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
            now, then = live() if live is not None else ((), ())
            try:
                with _NO_TORCH_FUNCTION():
                    return all(
                        map(
                            is_,
                            chain(
                                chain.from_iterable(filled),
                                chain.from_iterable(starmap(map, table)),
                                map(isinstance, map(getitem, mappings, keys), repeat(Tensor)),
                                now,
                                _END,
                            ),
                            chain(expected, then, _END),  # (_END: as many compared)
                        )
                    )
            except (AttributeError, KeyError):  # (a tensor swapped for one no torchlax Tensor)
                return False

        return holds

    def _no_new_hooks(self) -> bool:
        """After a hook was registered somewhere (``RemovableHandle``'s counter moved, the only
        way into a hook dict): whether the layout's empty hook dicts are all still empty."""
        seen = RemovableHandle.next_id  # read first: a registration during the pass moves it
        if any(self.unused_hook_dicts):
            return False
        self._hook_id = seen
        return True

    def assemble(self) -> _StateSet:
        """This call's state: the layout's objects, with what each step replaces read anew
        (without optimizers and ``.grad``s, the last one: nothing could change it)."""
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
        return _StateSet(
            storages,
            owners,
            self.grads,
            self.optimizer_list,
            self.schedulers,
            [(group, group["lr"]) for group in self.lr_groups],
            self.lr_types,
            self.cpu_tensors,
            (tuple(p.grad is not None for p in self.grads), self.static_structure),
        )


def arg_leaves(args, kwargs) -> tuple[list, bool]:
    """The arguments' leaves, and whether they are positional tensors only (the common call)."""
    if not kwargs and all(isinstance(a, torch.Tensor) for a in args):
        return list(args), True
    return pytree.tree_leaves((args, kwargs)), False


def _snapshot_hooks(layout: _Layout, hook_dicts) -> None:
    """A hook dict in use joins the snapshot (checked key by key); an empty one is checked only
    after a registration anywhere (``_Layout._no_new_hooks``)."""
    for d in hook_dicts:
        if d:
            layout.snapshot.dict(d)
        else:
            layout.unused_hook_dicts.append(d)


def set_capturable(optimizers) -> list:
    """Set each group's ``capturable`` flag (its code path keeps step counts and learning rates
    as tensors, no host reads, as for CUDA graphs); the ``(group, flag before)`` pairs."""
    groups = [(g, g["capturable"]) for o in optimizers for g in o.param_groups if "capturable" in g]
    for group, _ in groups:
        group["capturable"] = True
    return groups


def mapping_get(mapping, key):
    """``mapping.get(key)`` for an optimizer keeping its state in a mapping other than a dict
    (a dict's own C-level ``dict.get`` is used where every one is a dict)."""
    return mapping.get(key)


def _lr_type(params) -> type:
    """The type a group's learning rate is passed as: float64 if a parameter is 64-bit, else
    float32 (the dtype PyTorch computes a Python-float rate with a tensor in)."""
    wide = (torch.float64, torch.complex128)
    return np.float64 if any(p.dtype in wide for p in params) else np.float32


def _rate_in(group: dict) -> bool:
    """Whether a group's learning rate is an input of the program: a Python number, or a 0-d
    floating tensor (which a scheduler changes in place with ``fill_``: baked in, it would
    keep its first value)."""

    value = group.get("lr")
    if isinstance(value, float | int):
        return not isinstance(value, bool)
    return isinstance(value, torch.Tensor) and value.ndim == 0 and value.is_floating_point()
