"""How an argument tensor enters the program: its array, and the memory order it is passed in.

An input laid out other than row-major (``x.t()``) is passed in memory order and laid out with
its strides inside the trace (``_Program._arguments``), so the program sees eager's strides.
"""

from __future__ import annotations

import functools

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
    layouts = tuple(
        None if t.is_contiguous() else _layout_of(tuple(t.shape), t.stride(), isinstance(t, Tensor))
        for t in inputs
    )
    return layouts if any(s is not None for s in layouts) else None


@functools.lru_cache(maxsize=4096)  # (memory_order is Python arithmetic: not paid on each call)
def _layout_of(shape: tuple, strides: tuple, dense: bool) -> tuple | None:
    traced = traced_strides(shape, strides)
    if traced is None:
        return None
    return traced, memory_order(shape, strides) if dense else None


def _input_arrays(inputs: list, layouts: tuple | None) -> list:
    """The program's input arrays: each tensor's value, or its elements in memory order where
    its layout says so (``_input_layouts``)."""
    return [
        memory_ordered_array(t, layout[1])[0]  # pyright: ignore[reportOptionalSubscript]  (dense: never None)
        if layout is not None and layout[1] is not None
        else t.jax()
        if isinstance(t, Tensor)
        else _borrow(t)
        for t, layout in zip(inputs, layouts or [None] * len(inputs), strict=True)
    ]


def _traced_array(x: torch.Tensor):
    if isinstance(x, Tensor):
        return x.jax()
    return from_torch(x).jax()  # a constant the function made on the CPU


def _inexact(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()
