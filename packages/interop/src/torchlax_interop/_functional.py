"""``functional``: an ``nn.Module`` as a pure JAX function of its weights."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import torch
import torchlax_core

from ._dlpack import from_torch
from ._views import jax_view, numpy_to_jax, torch_view


def module_state(module: torch.nn.Module) -> dict[str, jax.Array]:
    """``module``'s parameters and buffers by name, as JAX arrays (shared, not copied).

    A tensor reachable under several names (tied weights) appears once, under its first name.
    """
    state: dict[str, jax.Array] = {}
    for name, tensor in module.named_parameters():
        state[name] = _array(tensor)
    for name, tensor in module.named_buffers():
        state[name] = _array(tensor)
    return state


def _array(tensor: torch.Tensor) -> jax.Array:
    if isinstance(tensor, torchlax_core.Tensor):
        return tensor.jax()
    return from_torch(tensor.detach()).jax()


def functional(module: torch.nn.Module) -> tuple[dict[str, jax.Array], Callable]:
    """``(params, fn)``: ``module`` as a pure JAX function ``fn(params, *args, **kwargs)``.

    ``params`` maps each parameter and buffer name to a ``jax.Array`` holding its current value
    (shared with the module, not copied; tied weights appear once). ``fn`` runs the module's
    forward with the weights taken from ``params`` (``torch.func.functional_call`` over
    torchlax Tensors wrapping the arrays), takes arrays and returns arrays, and is a JAX
    function: ``jax.grad``, ``jax.jit``, ``jax.vmap`` and optax apply to it. ``params`` may
    omit names: those keep the values they had when ``functional`` was called. In-place
    updates of buffers inside the forward (BatchNorm's running statistics in training mode)
    are not returned: evaluate in ``module.eval()`` mode, or use ``torchlax.jit``, which writes
    them back. The module itself is never modified. Random ops draw keys from torch's
    generator; to make them an input, call ``fn`` inside
    ``torchlax.current_env().prng_key_scope(key)``.
    """
    params = module_state(module)
    defaults = dict(params)

    def fn(params: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        with torchlax_core.enable():
            weights = torch_view(numpy_to_jax({**defaults, **params}))
            tensor_args, tensor_kwargs = torch_view(numpy_to_jax((args, kwargs)))
            out = torch.func.functional_call(
                module, weights, tensor_args, tensor_kwargs, tie_weights=True, strict=False
            )
            return jax_view(out)

    return params, fn
