"""PyTorch models sharded over JAX meshes: JAX's own SPMD, no home-made distributed engine.

- ``shard(tensor_or_module, mesh, spec_or_rules)``: lay weights and data out with
  ``NamedSharding``; ``megatron_rules`` (tensor parallel) and ``fsdp_rules`` (fully sharded)
  are ready-made rule sets. Sharded models run eagerly, under ``jax.jit`` and
  ``torchlax_interop.jit``: JAX propagates the shardings.
- ``mesh_placement(mesh, spec)``: new tensors and ``module.to("jax")`` land on the mesh.
- ``shard_map`` for PyTorch functions, where ``torch.distributed._functional_collectives``
  (``all_reduce``, ``all_gather_tensor``, ``reduce_scatter_tensor``, ``broadcast``,
  ``all_to_all_single``) lower to ``jax.lax`` collectives over the mesh axis named as their
  group or set with ``collectives_axis``.
- ``init_on_meta`` / ``materialize``: build a model on ``meta``, then create each weight
  directly as a sharded array.
- ``Checkpointer``: sharded checkpoints of a model and optimizer through orbax-checkpoint
  (each process writes its own shards, asynchronously), named as torch.distributed.checkpoint
  names them.

Multi-process (multi-host) runs use ``jax.distributed.initialize`` and a global mesh; see
docs/distributed.md.
"""

from ._checkpoint import Checkpointer as Checkpointer
from ._checkpoint import CheckpointError as CheckpointError
from ._collectives import collectives_axis as collectives_axis
from ._collectives import group_size as group_size
from ._collectives import process_groups_for as process_groups_for
from ._collectives import shard_map as shard_map
from ._jit import constrain as constrain
from ._jit import sharded_jit as sharded_jit
from ._materialize import init_on_meta as init_on_meta
from ._materialize import materialize as materialize
from ._materialize import shard_shapes as shard_shapes
from ._mesh import make_mesh as make_mesh
from ._placement import MeshPlacement as MeshPlacement
from ._placement import mesh_placement as mesh_placement
from ._placement import place_on_mesh as place_on_mesh
from ._rules import REPLICATED as REPLICATED
from ._rules import fsdp_rule as fsdp_rule
from ._rules import fsdp_rules as fsdp_rules
from ._rules import megatron_rules as megatron_rules
from ._rules import spec_for as spec_for
from ._shard import shard as shard
from ._shard import sharding_of as sharding_of
