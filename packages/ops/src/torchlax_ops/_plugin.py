"""The ``ops`` plugin: registers this package's tables through the public hooks.

Loaded through the ``torchlax`` entry point (``ops = "torchlax_ops._plugin"``), the same way a
third-party plugin is; block it with ``TORCHLAX_BLOCK_PLUGINS=ops``. Lowerings of ops the
installed PyTorch lacks were left out of the tables (``_aten``): said once, at info level.
"""

from __future__ import annotations

import jax
import torch
from torch.utils import _pytree as pytree
from torchlax_core import Tensor, hookimpl, wrap
from torchlax_core.internal import array_of, get_logger

from . import _lowerings  # noqa: F401  (fills the tables)
from ._aten import MISSING
from ._dtype_support import guard
from ._table import DECOMPOSITIONS, FUNCTIONS, LOWERINGS, NAMED

_log = get_logger("plugins")
_told_missing = False


@hookimpl
def torchlax_register_lowerings(registry):
    global _told_missing
    if MISSING and not _told_missing:
        _told_missing = True
        _log.info(
            "ops: PyTorch %s lacks %s: %s skipped; every other op is lowered",
            torch.__version__,
            ", ".join(MISSING),
            "its lowering is" if len(MISSING) == 1 else "their lowerings are",
        )
    for op, fn in LOWERINGS:
        registry.register_lowering(op, guard(op, fn))  # PyTorch's unsupported dtypes raise
    for torch_fn, fn in FUNCTIONS:
        registry.register_function(torch_fn, fn)
    for op, fn in DECOMPOSITIONS:
        registry.register_decomposition(op, guard(op, fn))


@hookimpl
def torchlax_fallback(op, env):
    # Other libraries' ops (``NAMED``), found by name the first time one reaches an environment.
    if not isinstance(op, torch._ops.OpOverload):
        return None
    kind, fn = NAMED.get(op.name(), (None, None))
    if kind == "decomposition":
        return fn
    if kind == "lowering":
        return _torch_level(fn)
    return None


def _torch_level(fn):
    """A JAX lowering called with and returning torch-level values (``run_op`` runs it with
    64-bit mode on, as the tables' lowerings)."""

    def impl(*args, **kwargs):
        args, kwargs = pytree.tree_map_only(Tensor, array_of, (args, kwargs))
        out = fn(*args, **kwargs)
        return pytree.tree_map_only(jax.Array, wrap, out)

    return impl
