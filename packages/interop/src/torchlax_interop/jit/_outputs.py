"""What a call returns: the program's output arrays as tensors laid out as eagerly
(``_to_tensors``), in the structure the trace recorded (``_output_plan``, ``_returned``),
objects holding them rebuilt around them (``_objects``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.utils import _pytree as pytree
from torchlax_core import Tensor
from torchlax_core.internal import output_tensors, returned_in_memory_order

from .._call_jax import _give_back
from ._inputs import _SLOT, _traced_array
from ._objects import ObjectOutput
from ._objects import find as find_object_output
from ._refusals import _owner

if TYPE_CHECKING:
    from ._program import _Info


def _returned(info: _Info, outputs: list):
    """What the function returned, with the program's output tensors in their places; an
    object output leaf (``ObjectOutput``) is a fresh copy holding its tensors of this call."""
    if info.single_output:
        return outputs[0]
    if info.out_spec.is_leaf() and not info.rebuilds:
        return info.out_statics[0]
    tensors = iter(outputs)
    flat_out = [
        next(tensors)
        if s is _SLOT
        else s.rebuilt([next(tensors) for _ in range(s.n)])
        if isinstance(s, ObjectOutput)
        else s
        for s in info.out_statics
    ]
    return pytree.tree_unflatten(flat_out, info.out_spec)


def _output_plan(out, stateful: set, jitted) -> tuple:
    """The tree of the traced step's output ``out``; per leaf, ``_SLOT`` (a tensor), an
    ``ObjectOutput`` (an object holding tensors computed in the trace: they are outputs too) or
    the leaf (a constant); the output tensors' arrays, in the program's order; and the memory
    order each is returned in (``returned_in_memory_order``; ``()`` where none is)."""
    out_flat, out_spec = pytree.tree_flatten(out)
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
    returned = [
        returned_in_memory_order(x) if isinstance(x, Tensor) else (_traced_array(x), None)
        for x in tensors
    ]
    orders = tuple(order for _, order in returned)
    arrays = [array for array, _ in returned]
    return out_spec, tuple(statics), arrays, orders if any(o is not None for o in orders) else ()


def _leaf_name(out, i: int) -> str:
    """The ``i``-th output leaf's path, as ``output['past_key_values']`` (for errors)."""
    try:
        path = pytree.tree_flatten_with_path(out)[0][i][0]
    except Exception:  # a node type registered without key paths
        return f"output leaf {i}"
    return "output" + pytree.keystr(path)


def _to_tensors(arrays, on_jax: bool, inputs, orders: tuple = ()) -> list[torch.Tensor]:
    return output_tensors(
        arrays, on_jax, lambda arrays, _: _give_back(arrays, inputs), None, orders
    )
