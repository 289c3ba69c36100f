"""``mesh_placement``: a ``torchlax_device_placement`` plugin that puts new tensors on a mesh."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator

import torch
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from torchlax_core import Environment, current_env, hookimpl

from ._rules import REPLICATED

_names = itertools.count()


class MeshPlacement:
    """Answers ``device=None`` and ``device="jax"`` with ``NamedSharding(mesh, spec)``.

    ``module.to("jax")`` reaches the hook as ``jax:0`` (torch fills in the current device
    index), so ``jax:0`` counts as the default too; other indices (``"jax:1"``) and other
    device types are left to the next plugin.
    """

    def __init__(self, mesh: Mesh, spec: PartitionSpec = REPLICATED):
        self.mesh = mesh
        self.spec = spec
        self.sharding = NamedSharding(mesh, spec)

    @hookimpl(tryfirst=True)
    def torchlax_device_placement(self, device: torch.device | None, env: Environment):
        if device is None or (device.type == "jax" and not device.index):
            return self.sharding
        return None


def place_on_mesh(
    mesh: Mesh,
    spec: PartitionSpec = REPLICATED,
    env: Environment | None = None,
) -> str:
    """Register a ``MeshPlacement`` on ``env`` (default: the current one); returns its name.

    Undo with ``env.unregister_plugin(name)``. ``spec`` applies to every new tensor, so it must
    fit all of them: the default, replicated, puts each new tensor on every device of the mesh
    (ready for ``shard`` to re-lay it without a trip through the host); ``P("data")`` suits a
    block that only creates batches whose first dimension the ``data`` axis divides.
    """
    env = env or current_env()
    name = f"torchlax.mesh_placement.{next(_names)}"
    env.register_plugin(MeshPlacement(mesh, spec), name)
    return name


@contextlib.contextmanager
def mesh_placement(
    mesh: Mesh,
    spec: PartitionSpec = REPLICATED,
    env: Environment | None = None,
) -> Iterator[Mesh]:
    """Inside the block new torchlax tensors land on ``mesh`` as ``NamedSharding(mesh, spec)``.

    Covers factories (``torch.randn(..., device="jax")``), ``tensor.to("jax")`` and
    ``module.to("jax")`` inside ``torchlax.enable()``. The plugin is unregistered on exit (and
    the placement cache cleared with it).
    """
    env = env or current_env()
    name = place_on_mesh(mesh, spec, env)
    try:
        yield mesh
    finally:
        env.unregister_plugin(name)
