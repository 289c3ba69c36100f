"""What every compiled torchlax program shares: its PRNG key input and its state write-back.

``torchlax.jit``, the ``torch.compile`` backend and export each turn PyTorch code into one
traced JAX function. Three questions come up in all of them and are answered here, once:

- Randomness. A traced program never bakes a key in: it takes one key as an input and every
  random op inside splits its key from it (``key_input``). Whether the program drew one is
  learned while tracing (``KeyScope.drawn``), so a deterministic program is called with a
  constant key (``unused_key()``) and costs no draw from torch's generator. A random op that
  runs while JAX stages a program *outside* any key scope raises (see
  ``Environment.next_prng_key``) instead of silently freezing its randomness.
- Tracing mode. ``tracing()`` is what the code traced into one program runs under: the
  environment, JAX's 64-bit mode, and PyTorch's "compiling" flag, which makes torch.optim,
  Hugging Face and torch.nn take the paths they take under ``torch.compile`` (tensor-valued
  step counts and learning rates, no host reads).
- State write-back. A program's new value for a tensor it changed is put back into that very
  tensor object (``write_back``): a torchlax Tensor takes the new array without a copy, a
  CPU/CUDA tensor is copied into.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import jax
import torch
from jax._src import core as _jax_core

from ._tensor import Tensor


class KeyScope:
    """The key random ops split from while a program is traced, and whether any did."""

    __slots__ = ("key", "drawn")

    def __init__(self, key: jax.Array):
        self.key = key
        self.drawn = False

    def split(self) -> jax.Array:
        self.key, sub = jax.random.split(self.key)
        self.drawn = True
        return sub


@functools.cache
def unused_key() -> jax.Array:
    """The key input of a program that draws none: made once (each new key is a dispatch)."""
    with jax.enable_x64(True):
        return jax.random.key(0)


def staging() -> bool:
    """Whether JAX is staging a program out right now (under ``jax.jit``, ``eval_shape``...).

    Eager ``jax.grad``/``jax.vmap`` of torch code run Python on every call, so a key drawn
    there is fresh each time; only a staged program would freeze it.
    """
    trace = _jax_core.trace_ctx.trace
    while trace is not None:
        if isinstance(trace, _jax_core.EvalTrace):
            return False
        if type(trace).__name__ == "DynamicJaxprTrace":
            return True
        trace = getattr(trace, "parent_trace", None)
    return False


@contextlib.contextmanager
def key_input(env, key: jax.Array) -> Iterator[KeyScope]:
    """Random ops of ``env`` inside the block split their keys from ``key`` (a traced input)."""
    with env.prng_key_scope(key) as scope:
        yield scope


@contextlib.contextmanager
def tracing(env) -> Iterator[None]:
    """What code traced into one torchlax program runs under (see the module docstring)."""
    from ._environment import enable

    previous = torch.compiler._is_compiling_flag
    torch.compiler._is_compiling_flag = True
    try:
        with enable(env), torch.autograd.set_multithreading_enabled(False):
            # The autograd engine runs a non-CPU device's backward on its own worker thread,
            # where JAX's (thread-local) trace is not active: keep backward on this thread.
            yield
    finally:
        torch.compiler._is_compiling_flag = previous


def write_back(dst: torch.Tensor, array: jax.Array) -> None:
    """Put a program's new value for ``dst`` into ``dst`` itself."""
    if isinstance(dst, Tensor):
        dst._write(array)
        return
    with torch.no_grad():
        dst.copy_(torch.from_dlpack(array))  # a view of the XLA buffer, copied into dst
