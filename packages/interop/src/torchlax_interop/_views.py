"""Convert whole pytrees between torchlax Tensors and ``jax.Array``s, without copying."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torchlax_core import Tensor, wrap

from ._dlpack import from_torch


def _is_tensor(x) -> bool:
    return isinstance(x, torch.Tensor)


def _to_array(x):
    if isinstance(x, Tensor):
        return x.jax()
    if isinstance(x, torch.Tensor):
        return from_torch(x).jax()
    return x


def _to_tensor(x):
    if isinstance(x, jax.Array) and not isinstance(x, torch.Tensor):
        return wrap(x)
    return x


def jax_view(tree: Any) -> Any:
    """``tree`` with every torchlax Tensor replaced by the ``jax.Array`` it holds.

    Plain torch tensors are promoted with ``from_torch`` (shared, copy-on-write on the torch
    side). Other leaves, and containers (tuples, lists, dicts, namedtuples, None), are kept.
    Autograd history is not carried: the result is plain JAX data.
    """
    return jax.tree_util.tree_map(_to_array, tree, is_leaf=_is_tensor)


def torch_view(tree: Any) -> Any:
    """``tree`` with every ``jax.Array`` (traced ones included) wrapped as a torchlax Tensor.

    The arrays are shared, not copied. Other leaves and the containers are kept.
    """
    return jax.tree_util.tree_map(_to_tensor, tree, is_leaf=_is_tensor)


def numpy_to_jax(tree: Any) -> Any:
    """``tree`` with NumPy arrays made JAX arrays (JAX functions accept both)."""
    return jax.tree_util.tree_map(
        lambda x: jnp.asarray(x) if isinstance(x, np.ndarray) else x, tree, is_leaf=_is_tensor
    )
