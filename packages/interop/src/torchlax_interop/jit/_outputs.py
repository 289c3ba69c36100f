"""What a call returns: the program's output arrays as tensors laid out as eagerly
(``_to_tensors``), in the structure the trace recorded (``_output_plan``, ``_returned``),
objects holding them rebuilt around them (``_objects``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.utils import _pytree as pytree
from torchlax_core.internal import output_tensors

from .._call_jax import _give_back
from ._inputs import _SLOT
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


def _to_tensors(arrays, on_jax: bool, inputs, orders: tuple = ()) -> list[torch.Tensor]:
    return output_tensors(
        arrays, on_jax, lambda arrays, _: _give_back(arrays, inputs), None, orders
    )
