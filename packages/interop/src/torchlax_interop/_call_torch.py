"""``call_torch``: run PyTorch code as a JAX function."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import jax
import torchlax_core

from ._views import jax_view, numpy_to_jax, torch_view


def call_torch(
    torch_fn: Callable, *args: Any, prng_key: jax.Array | None = None, **kwargs: Any
) -> Any:
    """Call ``torch_fn`` on JAX arrays, as a JAX function.

    Every ``jax.Array`` in ``args``/``kwargs`` (traced ones included) is wrapped as a torchlax
    Tensor, ``torch_fn`` runs under ``torchlax.enable()`` (so each torch op runs its JAX
    lowering), and the torchlax Tensors it returns are unwrapped back to arrays. Because only
    JAX operations touch the arrays, ``jax.jit``, ``jax.grad``, ``jax.value_and_grad`` and
    ``jax.vmap`` work over it, provided every op ``torch_fn`` uses is lowered. Under
    ``jax.vmap`` ``torch_fn`` sees one example's shapes, as with ``torch.vmap``.

    NumPy arrays among the arguments are treated as JAX arrays.

    Random ops draw their keys from ``prng_key`` when given, which is how to keep randomness an
    input under ``jax.jit``. Without it they draw seeds from torch's generator when the code
    runs; under ``jax.jit`` that happens once, at tracing, and the values repeat on each call.
    """
    env = torchlax_core.current_env()
    keys = env.prng_key_scope(prng_key) if prng_key is not None else contextlib.nullcontext()
    with torchlax_core.enable(env), keys:
        args, kwargs = numpy_to_jax((args, kwargs))
        tensor_args, tensor_kwargs = torch_view((args, kwargs))
        return jax_view(torch_fn(*tensor_args, **tensor_kwargs))
