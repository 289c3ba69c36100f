"""``shard``: put torchlax Tensors and module weights on a mesh with ``NamedSharding``."""

from __future__ import annotations

from typing import Any

import jax
import jax.core
import torch
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from torchlax_core import Tensor
from torchlax_core.internal import IDENTITY, array_of, from_torch_data, view_kind, write

from ._rules import REPLICATED, Rules, SpecFn, spec_for


def _on_mesh(array: jax.Array, sharding: NamedSharding) -> jax.Array:
    if isinstance(array, jax.core.Tracer):
        return jax.lax.with_sharding_constraint(array, sharding)
    if getattr(array, "sharding", None) == sharding:
        return array
    return jax.device_put(array, sharding)


def _as_array(tensor: torch.Tensor) -> jax.Array:
    if isinstance(tensor, Tensor):
        return array_of(tensor)
    return from_torch_data(tensor)


def shard_tensor(tensor: torch.Tensor, mesh: Mesh, spec: PartitionSpec) -> torch.Tensor:
    """``tensor`` laid out as ``NamedSharding(mesh, spec)``.

    A torchlax Tensor is re-pointed in place (the same object is returned, so references held
    elsewhere, an optimizer's for instance, see the sharded data); its views follow. Any other
    tensor (CPU) is copied into a new torchlax Tensor.
    """
    sharding = NamedSharding(mesh, spec)
    if isinstance(tensor, Tensor):
        if view_kind(tensor) not in (None, IDENTITY):
            raise ValueError(
                "shard() re-points a tensor's storage in place, but this tensor is a view of "
                "part of another; shard its base tensor instead."
            )
        write(tensor, _on_mesh(array_of(tensor), sharding))
        return tensor
    if tensor.device.type == "meta":
        raise ValueError(
            "shard() got a tensor on the meta device, which holds no data. Build the module on "
            "meta and call torchlax_interop.distributed.materialize(module, mesh, rules) instead."
        )
    return Tensor(_on_mesh(_as_array(tensor), sharding), requires_grad=tensor.requires_grad)


def shard_module(
    module: torch.nn.Module,
    mesh: Mesh,
    rules: Rules | SpecFn | PartitionSpec,
) -> dict[str, PartitionSpec]:
    """Shard every parameter and buffer of ``module`` by ``rules``; returns the specs used.

    Parameters that are torchlax Tensors keep their identity (their data is replaced in place),
    so an optimizer built before still updates them; gradients present are sharded alike.
    Parameters still on the CPU are replaced, like ``module.to`` does.
    """
    specs: dict[str, PartitionSpec] = {}
    seen: dict[int, PartitionSpec] = {}
    for kind, named in (
        ("parameter", module.named_parameters()),
        ("buffer", module.named_buffers()),
    ):
        for name, tensor in named:
            if id(tensor) in seen:
                specs[name] = seen[id(tensor)]
                continue
            spec = spec_for(name, tuple(tensor.shape), mesh, rules)
            seen[id(tensor)] = specs[name] = spec
            if isinstance(tensor, Tensor):
                shard_tensor(tensor, mesh, spec)
                if kind == "parameter" and isinstance(tensor.grad, Tensor):
                    shard_tensor(tensor.grad, mesh, spec)
                continue
            owner, leaf = _owner(module, name)
            placed = shard_tensor(tensor.detach(), mesh, spec)
            if kind == "parameter":
                owner._parameters[leaf] = torch.nn.Parameter(
                    placed, requires_grad=tensor.requires_grad
                )
            else:
                owner._buffers[leaf] = placed
    return specs


def _owner(module: torch.nn.Module, name: str) -> tuple[torch.nn.Module, str]:
    path, _, leaf = name.rpartition(".")
    return (module.get_submodule(path) if path else module), leaf


def shard(obj: Any, mesh: Mesh, spec_or_rules: Any = REPLICATED) -> Any:
    """Lay out a tensor, module, or pytree of tensors on ``mesh``.

    - ``shard(tensor, mesh, PartitionSpec("data", None))``: the tensor as
      ``NamedSharding(mesh, spec)`` (a torchlax Tensor is updated in place and returned).
    - ``shard(module, mesh, rules)``: every parameter and buffer by a rule set (a list of
      ``(regex, spec)`` pairs, first match wins, unmatched replicated), a single rule function
      such as ``fsdp_rule("data")``, or one ``PartitionSpec`` applied where it fits. Returns the
      module.
    - a list, tuple or dict of tensors: each one with the same spec.
    """
    if isinstance(obj, torch.nn.Module):
        shard_module(obj, mesh, spec_or_rules)
        return obj
    if isinstance(obj, torch.Tensor):
        if not isinstance(spec_or_rules, PartitionSpec):
            spec_or_rules = spec_for("", tuple(obj.shape), mesh, spec_or_rules)
        return shard_tensor(obj, mesh, spec_or_rules)
    if isinstance(obj, list | tuple):
        return type(obj)(shard(x, mesh, spec_or_rules) for x in obj)
    if isinstance(obj, dict):
        return {k: shard(v, mesh, spec_or_rules) for k, v in obj.items()}
    raise TypeError(
        f"shard() takes a torch.Tensor, an nn.Module or a list/tuple/dict of tensors, got "
        f"{type(obj).__name__}."
    )


def sharding_of(tensor: torch.Tensor):
    """The ``jax.sharding.Sharding`` of a torchlax Tensor's array."""
    if not isinstance(tensor, Tensor):
        raise TypeError(f"sharding_of() takes a torchlax Tensor, got {type(tensor).__name__}.")
    return array_of(tensor).sharding
