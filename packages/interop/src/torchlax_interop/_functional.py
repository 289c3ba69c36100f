"""``functional``: an ``nn.Module`` as a pure JAX function of its weights."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import jax
import torch
import torchlax_core

from . import _object_nodes
from ._dlpack import from_torch
from ._views import jax_view, numpy_to_jax, register_containers, torch_view


def module_state(module: torch.nn.Module) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
    """``(params, buffers)``: ``module``'s state by name, as JAX arrays on the ``jax`` device.

    Tensors already there (torchlax Tensors) and CPU tensors where the ``jax`` device is JAX's
    CPU are shared, not copied; a CPU module's tensors where the ``jax`` device is an
    accelerator (a TPU, a GPU) are put on it, one copy each: shared, they would be arrays on
    JAX's CPU device, and a ``jax.jit`` of a function of them would compile and run the whole
    computation on the host (a GPT-2 training step on a TPU VM filled its RAM).

    ``params`` holds the trainable parameters (``requires_grad``); ``buffers`` the rest of the
    state: every buffer and every frozen parameter. A tensor reachable under several names (tied
    weights) appears once, under its first name.
    """
    params: dict[str, jax.Array] = {}
    buffers: dict[str, jax.Array] = {}
    for name, tensor in module.named_parameters():
        (params if tensor.requires_grad else buffers)[name] = _array(tensor)
    for name, tensor in module.named_buffers():
        buffers[name] = _array(tensor)
    return params, buffers


def _array(tensor: torch.Tensor) -> jax.Array:
    if isinstance(tensor, torchlax_core.Tensor):
        return tensor.jax()
    shared = from_torch(tensor.detach()).jax()
    return torchlax_core.current_env().place(shared, "jax")  # the same array where it is there


def functional(
    module: torch.nn.Module,
) -> tuple[dict[str, jax.Array], dict[str, jax.Array], Callable]:
    """``(params, buffers, fn)``: ``module`` as a pure JAX function ``fn(params, *args, key=None,
    **kwargs)``.

    ``params`` maps each trainable parameter's name to a ``jax.Array`` holding its current value
    and ``buffers`` the rest of the state (buffers, frozen parameters), on the ``jax`` device:
    shared with the module, not copied, where its tensors are already there (or on the CPU,
    with JAX's CPU as the ``jax`` device); a CPU module on an accelerator is copied there once
    (``module_state``). Tied weights appear once. ``jax.grad`` of a loss of ``params`` therefore
    differentiates floating-point weights only (BERT's int64 ``position_ids`` are a buffer).

    ``fn`` runs the module's forward with the weights taken from its first argument (through
    ``torch.func.functional_call`` over torchlax Tensors wrapping the arrays), takes arrays and
    returns arrays (in the containers the module returns: tuples, dicts, Hugging Face's
    ``ModelOutput``, dataclasses), and is a JAX function: ``jax.grad``, ``jax.jit``, ``jax.vmap``
    and optax apply to it. Objects it returns that hold tensors (the ``DynamicCache`` a Hugging
    Face causal LM returns with ``use_cache`` at its default) become JAX pytrees whose leaves are
    those tensors' arrays, and the same object may be passed back in (``past_key_values=``): it
    arrives as the object with torchlax Tensors in it (``_object_nodes.py``). The first argument may hold any names of ``params`` and
    ``buffers``; names it omits keep the values they had when ``functional`` was called, so
    ``fn(params, x)`` uses the module's buffers and ``fn({**params, **buffers}, x)`` new ones.

    ``key``: the JAX PRNG key every random op inside (dropout) splits its key from. Pass it
    (a fresh one per step) whenever the module draws random numbers under ``jax.jit``: a key
    is then an input of the compiled program. Without ``key``, random ops draw seeds from
    torch's generator, which only works eagerly.

    In-place updates of buffers inside the forward (BatchNorm's running statistics in training
    mode) are not returned: evaluate in ``module.eval()`` mode, or use ``torchlax.jit``, which
    writes them back. The module itself is never modified.
    """
    params, buffers = module_state(module)
    defaults = {**params, **buffers}
    _object_nodes.register_known()  # transformers' caches, so one can be passed in first

    def fn(params: dict[str, Any], *args: Any, key: jax.Array | None = None, **kwargs: Any) -> Any:
        env = torchlax_core.current_env()
        keys = env.prng_key_scope(key) if key is not None else contextlib.nullcontext()
        with torchlax_core.enable(env), keys:
            weights = torch_view(numpy_to_jax({**defaults, **params}))
            tensor_args, tensor_kwargs = torch_view(numpy_to_jax((args, kwargs)))
            out = torch.func.functional_call(
                module, weights, tensor_args, tensor_kwargs, tie_weights=True, strict=False
            )
            _register_objects(out)
            return jax_view(out)

    return params, buffers, fn


def _register_objects(out: Any) -> None:
    """Make the objects in ``out`` that hold tensors (a ``DynamicCache``) JAX pytree nodes."""
    register_containers(out)  # first: the containers torch's pytrees know (ModelOutput)
    for leaf in jax.tree_util.tree_leaves(out, is_leaf=lambda x: isinstance(x, torch.Tensor)):
        if _object_nodes.holds_arrays(leaf):
            _object_nodes.register_class(type(leaf))
