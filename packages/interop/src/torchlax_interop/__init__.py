"""torchlax-interop: move data and functions between PyTorch and JAX.

- ``from_torch`` / ``to_torch``: zero-copy DLPack exchange with copy-on-write protection.
- ``jax_view`` / ``torch_view``: the same for whole pytrees.
- ``call_jax``: call a JAX function from PyTorch (autograd and ``torch.compile`` included).
- ``call_torch``: call PyTorch code from JAX (``jax.jit``, ``jax.grad``, ``jax.vmap``).
- ``functional``: an ``nn.Module`` as a pure JAX function of its weights.
- ``jit``: compile a PyTorch function or module with ``jax.jit``.
- ``set_generate_buckets``: how Hugging Face ``generate()`` sizes the KV cache of a model on
  the ``jax`` device (a static cache in length buckets, so decoding stops compiling per token).
"""

from . import _hf_generate
from ._arguments import InteropArgumentError as InteropArgumentError
from ._call_jax import call_jax as call_jax
from ._call_torch import call_torch as call_torch
from ._dlpack import SharedMemoryWriteError as SharedMemoryWriteError
from ._dlpack import check_shared_writes as check_shared_writes
from ._dlpack import from_torch as from_torch
from ._dlpack import to_torch as to_torch
from ._functional import functional as functional
from ._hf_generate import set_generate_buckets as set_generate_buckets
from ._views import jax_view as jax_view
from ._views import torch_view as torch_view
from .jit import jit as jit

__version__ = "0.1.0"

_hf_generate.activate()  # transformers' generate(): now if imported, else on its import
