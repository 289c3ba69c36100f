"""Where one call's new state goes: storages, ``.grad``s, optimizer state entries, buffers.

``_write_plan`` is computed once per program from its ``_Info``; ``_write_state`` puts each
call's new arrays into the objects they belong to (a plan's ``write_back``, which the core's
``CallPlan.run`` makes all or nothing).
"""

from __future__ import annotations

from operator import is_

import jax.numpy as jnp
import torch
from torchlax_core import Tensor
from torchlax_core.internal import set_exclusive

from ._program import _KEPT, _NEW, _NONE, _Info
from ._state import _StateSet, mapping_get


def _write_state(
    state: _StateSet, info: _Info, new_storages, extra, plan: list, fresh: bool = False
) -> list:
    """Put one call's new state into the objects it belongs to (``plan``: ``_write_plan``).
    Returns the ``.grad`` it leaves on each parameter of ``state.grads`` (reading them back
    costs a property read per parameter). ``fresh``: the arrays are a donating program's own
    results, which no one else holds: their storages are marked exclusive (the next step
    donates them as they are: the core's ``donatable``)."""
    for storage, array in zip(state.storages, new_storages, strict=True):
        storage.array = array  # changed, or donated: the program's output is the live array
        if fresh:
            storage.exclusive = True
    owners = state.owners
    grads = []
    for p, kind, index in plan[0]:
        if kind == _NEW:
            grad = Tensor(extra[index])
            if fresh:
                set_exclusive(grad)
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
        if fresh and value is not None:
            set_exclusive(value)
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
        dict.get if all(isinstance(d, dict) for d in dicts) else mapping_get,
    )
    return [grads, others, flat_kept]


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
