"""``torchlax.distributed``: PyTorch models sharded over JAX meshes.

The API of ``torchlax_interop.distributed`` (``make_mesh``, ``shard``, ``megatron_rules``,
``fsdp_rules``, ``mesh_placement``, ``sharded_jit``, ``shard_map``, ``init_on_meta``,
``materialize``, ``Checkpointer``, ...); see docs/distributed.md. ``torchlax`` imports it on first use.
"""

from torchlax_interop.distributed import *  # noqa: F403 - the same public names, kept in sync
