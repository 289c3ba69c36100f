"""torchlax: run PyTorch programs on JAX/XLA, and mix the two freely.

This umbrella package re-exports the public API of every layer:
``torchlax-core`` (Tensor, environment, registry), ``torchlax-ops`` (lowerings, ``explain``),
``torchlax-interop`` (DLPack, ``call_jax``/``call_torch``, ``functional``, ``jit``),
``torchlax-dynamo`` (``torch.compile(backend="torchlax")``), ``torchlax-export`` and, loaded on
first use, ``torchlax.distributed`` (``torchlax_interop.distributed``; ``torchlax.shard``).
"""

from torchlax_core import Config as Config
from torchlax_core import DeviceMismatchError as DeviceMismatchError
from torchlax_core import DtypeNotImplementedError as DtypeNotImplementedError
from torchlax_core import Environment as Environment
from torchlax_core import JitArgumentError as JitArgumentError
from torchlax_core import JitError as JitError
from torchlax_core import OpNotLoweredError as OpNotLoweredError
from torchlax_core import PluginConflictError as PluginConflictError
from torchlax_core import PluginError as PluginError
from torchlax_core import ProgramFailedError as ProgramFailedError
from torchlax_core import ProgramOutOfMemoryError as ProgramOutOfMemoryError
from torchlax_core import Tensor as Tensor
from torchlax_core import TorchlaxError as TorchlaxError
from torchlax_core import UnsupportedDtypeError as UnsupportedDtypeError
from torchlax_core import clear_compilation_cache as clear_compilation_cache
from torchlax_core import compilation_cache_dir as compilation_cache_dir
from torchlax_core import current_env as current_env
from torchlax_core import default_env as default_env
from torchlax_core import disable_globally as disable_globally
from torchlax_core import enable as enable
from torchlax_core import enable_globally as enable_globally
from torchlax_core import hookimpl as hookimpl
from torchlax_core import unwrap as unwrap
from torchlax_core import wrap as wrap
from torchlax_interop import SharedMemoryWriteError as SharedMemoryWriteError
from torchlax_interop import call_jax as call_jax
from torchlax_interop import call_torch as call_torch
from torchlax_interop import check_shared_writes as check_shared_writes
from torchlax_interop import from_torch as from_torch
from torchlax_interop import functional as functional
from torchlax_interop import jax_view as jax_view
from torchlax_interop import jit as jit
from torchlax_interop import set_generate_buckets as set_generate_buckets
from torchlax_interop import to_torch as to_torch
from torchlax_interop import torch_view as torch_view
from torchlax_ops import explain as explain

__version__ = "0.1.0"

# ``torchlax.export`` (``torchlax.export.export(model, args)``, ``torchlax.export.load(path)``),
# ``torchlax.distributed`` (meshes, sharding rules, collectives) and ``torchlax.shard`` load on
# first use, so ``import torchlax`` imports neither the export nor the distributed code (nor
# torch.export and Dynamo, which they pull in).
_LAZY = {
    "export": ("torchlax_export", None),
    "distributed": ("torchlax.distributed", None),
    "shard": ("torchlax_interop.distributed", "shard"),
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'torchlax' has no attribute {name!r}")
    import importlib

    module_name, attribute = _LAZY[name]
    module = importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
