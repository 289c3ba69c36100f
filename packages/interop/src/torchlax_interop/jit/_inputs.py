"""How an argument tensor enters the program: its array, and the memory order it is passed in.

An input laid out other than row-major (``x.t()``) is passed in memory order and laid out with
its strides inside the trace (``_Program._arguments``), so the program sees eager's strides.
"""

from __future__ import annotations

import torch
from torchlax_core import Tensor
from torchlax_core.internal import memory_order, memory_ordered_array, traced_strides

from .._call_jax import _borrow
from .._dlpack import from_torch

_SLOT = object()  # a tensor's place among the flattened arguments
_STATIC = object()  # a static_argnums/static_argnames argument's place


def _input_layouts(inputs: list) -> tuple | None:
    """Per input tensor, None (row-major) or ``(strides, order)``: the strides it is traced
    with (``traced_strides``) and, for a torchlax Tensor laid out densely, the memory order its
    storage array is passed in (no transpose), else None (its value is passed). None when
    every input is row-major (the common call: one ``is_contiguous`` per input)."""
    if all(t.is_contiguous() for t in inputs):
        return None
    layouts = tuple(None if t.is_contiguous() else _input_layout(t) for t in inputs)
    return layouts if any(s is not None for s in layouts) else None


# (sizes, strides, whether a torchlax Tensor) -> _input_layout's answer (memory_order is
# Python arithmetic: not paid on each call)
_input_layout_cache: dict = {}


def _input_layout(t: torch.Tensor):
    key = (t.shape, t.stride(), type(t) is Tensor)
    if key in _input_layout_cache:
        return _input_layout_cache[key]
    strides = traced_strides(tuple(t.shape), t.stride())
    layout = None
    if strides is not None:
        dense = memory_order(tuple(t.shape), t.stride()) if isinstance(t, Tensor) else None
        layout = (strides, dense)
    if len(_input_layout_cache) < 4096:
        _input_layout_cache[key] = layout
    return layout


def _input_arrays(inputs: list, layouts: tuple | None) -> list:
    """The program's input arrays: each tensor's value, or its elements in memory order where
    its layout says so (``_input_layouts``)."""
    if layouts is None:
        return [t.jax() if isinstance(t, Tensor) else _borrow(t) for t in inputs]
    arrays = []
    for t, layout in zip(inputs, layouts, strict=True):
        if layout is not None and layout[1] is not None:
            arrays.append(memory_ordered_array(t, layout[1])[0])  # pyright: ignore[reportOptionalSubscript]  (dense: never None)
        else:
            arrays.append(t.jax() if isinstance(t, Tensor) else _borrow(t))
    return arrays


def _traced_array(x: torch.Tensor):
    if isinstance(x, Tensor):
        return x.jax()
    return from_torch(x).jax()  # a constant the function made on the CPU


def _inexact(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()
