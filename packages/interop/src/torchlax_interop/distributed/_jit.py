"""``sharded_jit``: ``torchlax_interop.jit`` with the outputs' shardings asked for."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import torch
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from torchlax_core import Tensor
from torchlax_core.internal import array_of

from ._shard import _on_mesh, shard_tensor


def constrain(out: Any, mesh: Mesh, out_specs: Any) -> Any:
    """Lay each tensor of ``out`` out as its spec in ``out_specs`` says (a sharding constraint
    under tracing). ``out_specs``: one ``PartitionSpec`` for every tensor, or a pytree prefix
    of ``out`` with ``PartitionSpec`` (or ``None``: leave as is) leaves."""

    def apply(spec, value):
        if spec is None or not isinstance(value, torch.Tensor):
            return value
        if isinstance(value, Tensor):  # a new tensor: an output may be a view of another
            return Tensor(_on_mesh(array_of(value), NamedSharding(mesh, spec)))
        return shard_tensor(value, mesh, spec)

    if isinstance(out_specs, PartitionSpec):
        return jax.tree_util.tree_map(lambda v: apply(out_specs, v), out)
    return jax.tree_util.tree_map(
        lambda spec, sub: jax.tree_util.tree_map(lambda v: apply(spec, v), sub),
        out_specs,
        out,
        is_leaf=lambda x: x is None or isinstance(x, PartitionSpec),
    )


class _Constrained(torch.nn.Module):
    # A module wrapper keeps the inner module's weights program inputs under torchlax.jit.
    def __init__(self, inner: torch.nn.Module, mesh: Mesh, out_specs: Any):
        super().__init__()
        self.inner = inner
        self.mesh = mesh
        self.out_specs = out_specs

    def forward(self, *args, **kwargs):
        return constrain(self.inner(*args, **kwargs), self.mesh, self.out_specs)


def sharded_jit(
    fn_or_module: Callable | torch.nn.Module, mesh: Mesh, out_specs: Any, **jit_kwargs: Any
) -> Callable:
    """``torchlax_interop.jit(fn_or_module)`` whose outputs come back as ``out_specs`` say.

    Inputs keep the shardings they have (sharded weights and batches stay where they are);
    each output is constrained to ``NamedSharding(mesh, spec)`` inside the program, so XLA
    computes it in that layout (``out_shardings`` of ``jax.jit``). ``jit_kwargs`` go to
    ``torchlax_interop.jit``.
    """
    from ..jit import jit

    if isinstance(fn_or_module, torch.nn.Module):
        return jit(_Constrained(fn_or_module, mesh, out_specs), **jit_kwargs)

    def constrained(*args, **kwargs):
        return constrain(fn_or_module(*args, **kwargs), mesh, out_specs)

    return jit(constrained, **jit_kwargs)
