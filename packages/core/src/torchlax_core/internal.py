"""What torchlax's own packages use of the core beyond its public API.

torchlax-ops, -interop, -dynamo, -export and the ``torchlax`` umbrella are built on more of the
core than a user needs: a tensor's storage and views, an environment's tables, the helpers of
compiled programs, compile statistics. This module names all of it, so that the core's private
modules can change freely behind it: a sibling package imports the core's names from
``torchlax_core`` (public) or from here, and from nowhere else
(``tests/core/test_internal_contract.py`` fails, naming the file and line, when one reaches
past it, by import or through a private attribute of a core object).

No stability promise to third parties: this is used by torchlax's own packages, which are
released together with the core, and it changes whenever they need it to. Third-party plugins
should use the public API (``torchlax_core``, ``torchlax_core.hookspecs``).
"""

from __future__ import annotations

import operator
from typing import Any

from . import _tensor
from ._autograd_graph import graph_leaf as graph_leaf
from ._autograd_graph import graph_nodes as graph_nodes
from ._builtins import cuda_device as cuda_device
from ._call_plan import CHECKED_RUNS as CHECKED_RUNS
from ._call_plan import MISS_SIGNATURE as MISS_SIGNATURE
from ._call_plan import MISS_STALE as MISS_STALE
from ._call_plan import MISS_STATICS as MISS_STATICS
from ._call_plan import CallPlan as CallPlan
from ._call_plan import HeldInterrupts as HeldInterrupts
from ._call_plan import LastPlan as LastPlan
from ._compilation_cache import directory as compilation_cache_directory
from ._compilation_cache import entries as compilation_cache_entries
from ._compile_log import graph_break as graph_break
from ._compiled import CompiledProgram as CompiledProgram
from ._compiled import Entry as Entry
from ._compiled import donatable as donatable
from ._compiled import is_exclusive as is_exclusive
from ._compiled import output_tensors as output_tensors
from ._compiled import peek_array as peek_array
from ._compiled import peek_arrays as peek_arrays
from ._compiled import result_specs as result_specs
from ._compiled import root_values as root_values
from ._compiled import set_exclusive as set_exclusive
from ._compiled import signature as signature
from ._compiled import wrap_results as wrap_results
from ._compiled import wrap_results_like as wrap_results_like
from ._compiled import write_back as write_back
from ._compiled import write_back_all as write_back_all
from ._dtypes import COMPUTE_DTYPES as COMPUTE_DTYPES
from ._dtypes import DTYPES as DTYPES
from ._dtypes import scalar_type_name as scalar_type_name
from ._iterator_layout import traced_strides as traced_strides
from ._launch_check import failure_of as failure_of
from ._launch_check import launch_error as launch_error
from ._launch_check import refuse_if_too_large as refuse_if_too_large
from ._layouts import _laid_out as laid_out  # pyright: ignore[reportPrivateUsage]  (the core's own name, re-exported here)
from ._layouts import memory_order as memory_order
from ._layouts import memory_ordered_array as memory_ordered_array
from ._layouts import returned_in_memory_order as returned_in_memory_order
from ._layouts import stored_in_order as stored_in_order
from ._layouts import traced_input as traced_input
from ._layouts import viewed_back as viewed_back
from ._logging import get_logger as get_logger
from ._opcache import compiling_nothing as op_cache_compiling_nothing
from ._precision import float32_matmul_precision as float32_matmul_precision
from ._program import tracing as tracing
from ._program import unused_key as unused_key
from ._registry import Tables as Tables
from ._registry import op_name as op_name
from ._result_wrappers import ResultWrappers as ResultWrappers
from ._state_lock import state_lock as state_lock
from ._stats import record_compile as record_compile
from ._tensor import IDENTITY as IDENTITY
from ._x64 import no_x64 as no_x64
from ._x64 import x64 as x64
from ._x64 import x64_flag as x64_flag

__all__ = [
    "CHECKED_RUNS",
    "CallPlan",
    "HeldInterrupts",
    "LastPlan",
    "MISS_SIGNATURE",
    "MISS_STALE",
    "MISS_STATICS",
    "CompiledProgram",
    "Entry",
    "ResultWrappers",
    "donatable",
    "float32_matmul_precision",
    "output_tensors",
    "peek_arrays",
    "result_specs",
    "root_values",
    "signature",
    "wrap_results",
    "wrap_results_like",
    "write_back",
    "write_back_all",
    "COMPUTE_DTYPES",
    "DTYPES",
    "IDENTITY",
    "Tables",
    "array_of",
    "cuda_device",
    "traced_strides",
    "failure_of",
    "launch_error",
    "refuse_if_too_large",
    "from_torch_data",
    "get_logger",
    "graph_leaf",
    "graph_nodes",
    "graph_break",
    "compilation_cache_directory",
    "compilation_cache_entries",
    "op_cache_compiling_nothing",
    "is_exclusive",
    "laid_out",
    "memory_order",
    "memory_ordered_array",
    "op_name",
    "peek_array",
    "record_compile",
    "scalar_type_name",
    "set_exclusive",
    "storage_of",
    "stored_in_order",
    "traced_input",
    "tables_of",
    "tracing",
    "unused_key",
    "rebind",
    "view_kind",
    "returned_in_memory_order",
    "viewed_back",
    "write",
    "no_x64",
    "x64",
    "x64_flag",
]

# -- a torchlax Tensor's data (see ``_tensor``: a root and its views share one storage) ------

array_of = _tensor.Tensor._value
"""``array_of(tensor)``: the ``jax.Array`` a torchlax Tensor holds (a view's is recomputed from
its storage when that changed); ``tensor.jax()`` without the method lookup."""

write = _tensor.Tensor._write
"""``write(tensor, array)``: replace a torchlax Tensor's data in place (same shape and dtype),
through any view, so that every tensor sharing its storage sees the new value."""

from_torch_data = _tensor._from_cpu  # pyright: ignore[reportPrivateUsage]  (the core's own name, re-exported here)
"""``from_torch_data(tensor, device=None)``: a new ``jax.Array`` holding a copy of a (CPU)
``torch.Tensor``'s data, same dtype (bfloat16 and float8 included)."""


def storage_of(tensor: _tensor.Tensor) -> object:
    """The storage a torchlax Tensor shares with its views: compare by identity to find tensors
    that alias one another (its ``array`` attribute is the root's current ``jax.Array``)."""
    return tensor._storage  # pyright: ignore[reportPrivateUsage]  (the core reading its own Tensor)


storage_getter = operator.attrgetter("_storage")
"""``storage_of`` as a C-level getter, for ``map()`` over many tensors on a hot path."""

view_getter = operator.attrgetter("_view")
"""A torchlax Tensor's view record, ``None`` for a root (any record is true): a C-level getter,
for ``map()`` over a call's arguments on a hot path (``view_kind`` reads it one at a time)."""


def is_root_of(tensor: Any, array: Any) -> bool:
    """Whether ``tensor`` is a root torchlax Tensor whose storage holds ``array`` itself (what
    ``wrap_results`` makes of an array)."""
    return (
        type(tensor) is _tensor.Tensor
        and tensor._view is None  # pyright: ignore[reportPrivateUsage]  (the core reading its own Tensor)
        and tensor._storage.array is array  # pyright: ignore[reportPrivateUsage]  (the core reading its own Tensor)
    )


def rebind(tensor: _tensor.Tensor, storage: Any, view: Any) -> None:
    """Give a torchlax Tensor the storage and view record it had before (``storage_of`` and
    ``view_getter`` read them): ``torchlax.jit`` putting back a tensor that a traced step
    rebound (``t.data = other``)."""
    tensor._storage, tensor._view = storage, view  # pyright: ignore[reportPrivateUsage]  (the core setting its own Tensor)


def view_kind(tensor: _tensor.Tensor) -> int | None:
    """``None`` for a tensor that is not a view; otherwise how it is computed from its storage:
    ``IDENTITY`` (the whole storage, as it is) or another kind (a reshape, part of it...)."""
    view = tensor._view  # pyright: ignore[reportPrivateUsage]  (the core reading its own Tensor)
    return None if view is None else view.kind


def tables_of(env: Any) -> Tables:
    """The lowering, decomposition and override tables ``env``'s plugins filled; a new object
    whenever a plugin is registered or unregistered (so ``is`` tells whether they changed)."""
    return env._tables
