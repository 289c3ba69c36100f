"""``torch.distributed`` functional collectives lowered to JAX collectives over a mesh axis.

``torch.distributed._functional_collectives.all_reduce(x, "sum", group)`` dispatches
``torch.ops._c10d_functional.all_reduce(x, "sum", group_name)``. Inside ``shard_map`` (this
module's, or ``jax.shard_map`` around ``call_torch``) the plugin lowers it to ``jax.lax.psum``
over the mesh axis the user names: the group name itself (``group="data"``), or the axis of
an enclosing ``collectives_axis("data")`` block, which takes precedence.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import torch
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from torch.utils import _pytree as pytree
from torchlax_core import Tensor, current_env, enable
from torchlax_core.internal import array_of, x64

c10d = torch.ops._c10d_functional
AxisName = str | tuple[str, ...]

_axis_stack: list[AxisName] = []


# -- which mesh axis a collective runs over ------------------------------------------------------


@contextlib.contextmanager
def collectives_axis(axis: AxisName) -> Iterator[AxisName]:
    """Run every functional collective in the block over mesh axis ``axis`` (or axes).

    Whatever group the collective names is then ignored. Yields ``axis``, handy as the
    ``group`` argument: ``all_reduce(x, "sum", group)``.
    """
    _axis_stack.append(axis)
    try:
        yield axis
    finally:
        _axis_stack.pop()


def _axis(group_name: Any, op: str) -> AxisName:
    if _axis_stack:
        axis = _axis_stack[-1]
    elif isinstance(group_name, str):
        axis = group_name
    else:
        axis = getattr(group_name, "group_name", group_name)
    try:
        jax.lax.axis_size(axis)
    except NameError:
        raise ValueError(
            f"torch.distributed collective {op} was asked for group {group_name!r}, which is no "
            "mesh axis bound here. Call it inside torchlax_interop.distributed.shard_map (or "
            "jax.shard_map) and pass a mesh axis name as the group (group='data'), or wrap the "
            "call in `with collectives_axis('data'):`."
        ) from None
    return axis


def _size(axis: AxisName, group_size: int | None, op: str) -> int:
    size = jax.lax.axis_size(axis)
    if group_size is not None and group_size != size:
        raise ValueError(
            f"torch.distributed collective {op} was called with group_size={group_size}, but "
            f"mesh axis {axis!r} has {size} devices."
        )
    return size


# -- reductions -----------------------------------------------------------------------------------


def _reduce_stacked(stacked: jax.Array, reduce_op: str, op: str) -> jax.Array:
    """Reduce an all-gathered ``(group, ...)`` array over its first dimension."""
    if reduce_op == "sum":
        return stacked.sum(0, dtype=stacked.dtype)
    if reduce_op == "avg":
        return _mean(stacked.sum(0, dtype=stacked.dtype), stacked.shape[0])
    if reduce_op == "product":
        return stacked.prod(0, dtype=stacked.dtype)
    if reduce_op == "max":
        return stacked.max(0)
    if reduce_op == "min":
        return stacked.min(0)
    raise _unsupported(reduce_op, op)


def _mean(total: jax.Array, count: int) -> jax.Array:
    if jnp.issubdtype(total.dtype, jnp.integer):
        return total // count
    return (total / count).astype(total.dtype)


def _unsupported(reduce_op: str, op: str) -> ValueError:
    return ValueError(
        f"torch.distributed collective {op}: reduce op {reduce_op!r} is not supported by torchlax; "
        "use one of 'sum', 'avg', 'product', 'max', 'min'."
    )


def all_reduce(input, reduce_op, group_name):
    axis = _axis(group_name, "all_reduce")
    if reduce_op == "sum":
        return jax.lax.psum(input, axis)
    if reduce_op == "avg":
        return _mean(jax.lax.psum(input, axis), jax.lax.axis_size(axis))
    if reduce_op == "max":
        return jax.lax.pmax(input, axis)
    if reduce_op == "min":
        return jax.lax.pmin(input, axis)
    if reduce_op == "product":
        return _reduce_stacked(jax.lax.all_gather(input, axis), reduce_op, "all_reduce")
    raise _unsupported(reduce_op, "all_reduce")


def all_gather_into_tensor(input, group_size, group_name):
    axis = _axis(group_name, "all_gather_into_tensor")
    _size(axis, group_size, "all_gather_into_tensor")
    return jax.lax.all_gather(input, axis, axis=0, tiled=True)


def reduce_scatter_tensor(input, reduce_op, group_size, group_name):
    axis = _axis(group_name, "reduce_scatter_tensor")
    size = _size(axis, group_size, "reduce_scatter_tensor")
    if input.shape[0] % size:
        raise ValueError(
            f"torch.distributed collective reduce_scatter_tensor: dimension 0 of the input "
            f"({input.shape[0]}) must be a multiple of the group size ({size})."
        )
    if reduce_op in ("sum", "avg"):
        total = jax.lax.psum_scatter(input, axis, scatter_dimension=0, tiled=True)
        return total if reduce_op == "sum" else _mean(total, size)
    reduced = _reduce_stacked(jax.lax.all_gather(input, axis), reduce_op, "reduce_scatter_tensor")
    chunk = input.shape[0] // size
    return jax.lax.dynamic_slice_in_dim(reduced, jax.lax.axis_index(axis) * chunk, chunk, 0)


def broadcast(input, src, group_name):
    axis = _axis(group_name, "broadcast")
    if input.dtype == jnp.bool_:
        return jax.lax.all_gather(input, axis)[src]
    mine = jax.lax.axis_index(axis) == src
    return jax.lax.psum(jnp.where(mine, input, jnp.zeros_like(input)), axis)


def all_to_all_single(input, output_split_sizes, input_split_sizes, group_name):
    axis = _axis(group_name, "all_to_all_single")
    size = jax.lax.axis_size(axis)
    even = input.shape[0] // size
    for name, splits in (
        ("input_split_sizes", input_split_sizes),
        ("output_split_sizes", output_split_sizes),
    ):
        if list(splits) != [even] * size or input.shape[0] % size:
            raise ValueError(
                f"torch.distributed collective all_to_all_single: torchlax supports even splits "
                f"only ({size} chunks of dimension 0), got {name}={list(splits)} for an input of "
                f"{input.shape[0]} rows."
            )
    return jax.lax.all_to_all(input, axis, split_axis=0, concat_axis=0, tiled=True)


def _identity(tensor):
    return tensor


def _coalesced(fn: Callable) -> Callable:
    def run(inputs, *rest):
        return [fn(x, *rest) for x in inputs]

    return run


def register_lowerings(registry) -> None:
    """Register the functional-collective lowerings (called by this package's plugin)."""
    if not torch.distributed.is_available():
        return
    # Defines the Python-side ops (_wrap_tensor_autograd) next to the C++ ones.
    importlib.import_module("torch.distributed._functional_collectives")

    registry.register_lowering(c10d.all_reduce.default, all_reduce)
    registry.register_lowering(c10d.all_gather_into_tensor.default, all_gather_into_tensor)
    registry.register_lowering(c10d.reduce_scatter_tensor.default, reduce_scatter_tensor)
    registry.register_lowering(c10d.broadcast.default, broadcast)
    registry.register_lowering(c10d.all_to_all_single.default, all_to_all_single)
    registry.register_lowering(c10d.all_reduce_coalesced.default, _coalesced(all_reduce))
    registry.register_lowering(
        c10d.all_gather_into_tensor_coalesced.default, _coalesced(all_gather_into_tensor)
    )
    registry.register_lowering(
        c10d.reduce_scatter_tensor_coalesced.default, _coalesced(reduce_scatter_tensor)
    )
    # JAX collectives return values, not pending work: waiting is the identity, and so is the
    # wrapper that would make the result an AsyncCollectiveTensor.
    registry.register_lowering(c10d.wait_tensor.default, _identity)
    registry.register_lowering(c10d._wrap_tensor_autograd.default, _identity)


# -- stand-in process groups: torch looks group sizes up by name ---------------------------------


@contextlib.contextmanager
def process_groups_for(mesh: Mesh) -> Iterator[None]:
    """Register a stand-in ``ProcessGroup`` named after each mesh axis, of that axis's size.

    ``all_gather_single``, ``reduce_scatter_single`` and ``all_to_all_single`` ask
    ``torch.distributed`` for the size of the named group before dispatching; the stand-ins
    answer. No communication goes through them: the lowerings run JAX collectives.
    """
    from torch._C import _distributed_c10d as cc

    added = []
    for axis, size in mesh.shape.items():
        try:
            existing = cc._resolve_process_group(axis)
        except (RuntimeError, ValueError):
            existing = None
        if existing is not None:
            continue
        group = cc.ProcessGroup(cc.FakeStore(), 0, size)
        cc._register_process_group(axis, group)
        added.append((axis, group))  # the registry holds groups weakly: keep them alive
    try:
        yield
    finally:
        for axis, _ in added:
            cc._unregister_process_group(axis)


# -- shard_map over PyTorch code -------------------------------------------------------------------


def _to_array(x):
    if isinstance(x, Tensor):
        return array_of(x)
    if isinstance(x, torch.Tensor):
        raise TypeError(
            "torchlax_interop.distributed.shard_map takes torchlax Tensors (or jax.Arrays); got a "
            f"tensor on device {x.device}. Move it with .to('jax') inside torchlax.enable() first."
        )
    return x


def _unwrap_output(x):
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    if isinstance(x, AsyncCollectiveTensor):
        x = x.wait()
    return array_of(x) if isinstance(x, Tensor) else x


def shard_map(
    fn: Callable, mesh: Mesh, in_specs: Any, out_specs: Any, *, check_vma: bool = False
) -> Callable:
    """``jax.shard_map`` for a PyTorch function: ``fn`` sees each device's block as a Tensor.

    ``fn`` takes and returns (pytrees of) torch tensors; the returned function takes and
    returns torchlax Tensors (``jax.Array`` arguments are accepted too). Inside ``fn`` the
    functional collectives of ``torch.distributed._functional_collectives`` run over the mesh
    axis named as their group (``all_reduce(x, "sum", "data")``) or set by
    ``collectives_axis``. Works eagerly and under ``jax.jit``.
    """
    env = current_env()

    def body(*arrays):
        with enable(env), process_groups_for(mesh):
            tensors = pytree.tree_map(
                lambda a: Tensor(a) if isinstance(a, jax.Array) else a, arrays
            )
            out = fn(*tensors)
        return pytree.tree_map(_unwrap_output, out)

    mapped = jax.shard_map(
        body, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=check_vma
    )

    def run(*args):
        arrays = pytree.tree_map(_to_array, args)
        with x64():
            out = mapped(*_onto_mesh(arrays, mesh, in_specs))
        return pytree.tree_map(lambda a: Tensor(a) if isinstance(a, jax.Array) else a, out)

    return run


def _onto_mesh(arrays: tuple, mesh: Mesh, in_specs: Any) -> tuple:
    """Concrete arrays not yet on ``mesh`` moved there, laid out as their ``in_specs`` say."""
    specs = (in_specs,) * len(arrays) if isinstance(in_specs, PartitionSpec) else tuple(in_specs)

    def move(spec, array):
        if not isinstance(array, jax.Array) or isinstance(array, jax.core.Tracer):
            return array
        if array.sharding.device_set == set(mesh.devices.flat):
            return array
        return jax.device_put(array, NamedSharding(mesh, spec))

    return tuple(
        jax.tree_util.tree_map(move, spec, array, is_leaf=lambda x: isinstance(x, PartitionSpec))
        for spec, array in zip(specs, arrays, strict=True)
    )


def group_size(axis: AxisName | Sequence[str]) -> int:
    """The number of devices along mesh ``axis`` (inside ``shard_map``)."""
    return jax.lax.axis_size(axis)
