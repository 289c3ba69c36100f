"""What every compiled torchlax program shares: its PRNG key input and its tracing mode.

``torchlax.jit``, the ``torch.compile`` backend and export each turn PyTorch code into one
traced JAX function. Three questions come up in all of them and are answered here, once:

- Randomness. A traced program never bakes a key in: it takes one key as an input and every
  random op inside splits its key from it (``Environment.prng_key_scope``). Whether the program drew one is
  learned while tracing (``KeyScope.drawn``), so a deterministic program is called with a
  constant key (``unused_key()``) and costs no draw from torch's generator. A random op that
  runs while JAX stages a program *outside* any key scope raises (see
  ``Environment.next_prng_key``) instead of silently freezing its randomness.
- Tracing mode. ``tracing()`` is what the code traced into one program runs under: the
  environment, JAX's 64-bit mode, and PyTorch's "compiling" flag, which makes torch.optim,
  Hugging Face and torch.nn take the paths they take under ``torch.compile`` (tensor-valued
  step counts and learning rates, no host reads).
- Traced scalars. Where PyTorch wants a Python number (``add_(g, alpha=-lr)``) and the code
  passes a 0-d tensor, PyTorch reads it on the host, which a traced value cannot be: while
  tracing, the few functions optimizers call that way get the tensor multiplied in instead
  (``_SCALAR_REWRITES``), in the order PyTorch's kernels compute.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import jax
import jax.core
import numpy as np
import torch
from jax._src import core as _jax_core

from . import _tensor
from ._current import enable
from ._tensor import Tensor
from ._x64 import x64


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
    with x64():
        return jax.random.key(0)


@functools.cache
def unused_key_data() -> jax.Array:
    """``unused_key()``'s raw data, for a program whose key input is key data: made once."""
    with x64():
        return jax.random.key_data(unused_key())


def threefry_key_data(seed: int) -> np.ndarray:
    """``jax.random.key_data(jax.random.key(seed))`` for a seed in [0, 2**63) under JAX's
    default threefry2x32 implementation (64-bit mode: the high and low 32 bits), made on the
    host: a program takes it as an input like any array, where ``jax.random.key`` is an eager
    dispatch of its own (~0.2 ms on a loaded CPU, longer than most of a program's launch)."""
    return np.array([seed >> 32, seed & 0xFFFFFFFF], dtype=np.uint32)


# ``jax.random.key`` compiled once: eagerly each call is a dispatch of its own through JAX's
# Python (~130 us on a loaded CPU), compiled it is one C++ launch (~15 us), same key.
_threefry_key = jax.jit(jax.random.key)


def threefry_key(seed: int) -> jax.Array:
    """``jax.random.key(seed)`` under the default threefry2x32 implementation, in 64-bit mode."""
    return _threefry_key(seed)


def default_prng_is_threefry() -> bool:
    """Whether new keys use JAX's default threefry2x32 implementation (the config can change
    it; ``threefry_key_data`` holds only for that one)."""
    return jax.config.jax_default_prng_impl == "threefry2x32"  # pyright: ignore[reportAttributeAccessIssue]  (jax's config exposes its flags as attributes)


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
def tracing(env) -> Iterator[None]:
    """What code traced into one torchlax program runs under (see the module docstring)."""
    previous = torch.compiler._is_compiling_flag
    torch.compiler._is_compiling_flag = True
    function_hook = Tensor.__dict__["__torch_function__"]
    Tensor.__torch_function__ = classmethod(_torch_function_while_tracing)  # pyright: ignore[reportAttributeAccessIssue]  (torch's stubs declare __torch_function__ read-only)
    try:
        with enable(env), torch.autograd.set_multithreading_enabled(False):
            # The autograd engine runs a non-CPU device's backward on its own worker thread,
            # where JAX's (thread-local) trace is not active: keep backward on this thread.
            yield
    finally:
        Tensor.__torch_function__ = function_hook
        torch.compiler._is_compiling_flag = previous


def _torch_function_while_tracing(cls, func, types, args=(), kwargs=None):
    kwargs = kwargs or {}
    try:
        rewrite = _SCALAR_REWRITES.get(func)
    except TypeError:  # an unhashable callable
        rewrite = None
    if rewrite is not None:
        name, rule = rewrite
        value = kwargs.get(name)
        if isinstance(value, Tensor) and isinstance(value._value(), jax.core.Tracer):
            rest = {k: v for k, v in kwargs.items() if k != name}
            return rule(func, value, *args, **rest)
    return _tensor._torch_function(cls, func, types, args, kwargs)


def _scaled_other(func, scale, self, other, **kwargs):
    # add(self, other, alpha=a) is self + a * other: the product first, as ATen computes it.
    return func(self, other * scale, **kwargs)


def _scaled_first(func, scale, self, tensor1, tensor2, **kwargs):
    # addcdiv/addcmul(self, t1, t2, value=v) is self + v * t1 / t2 (or * t2), left to right.
    return func(self, tensor1 * scale, tensor2, **kwargs)


def _foreach_scaled_other(func, scale, self, other, **kwargs):
    return func(self, torch._foreach_mul(other, scale), **kwargs)


def _foreach_scaled_first(func, scale, self, tensor1, tensor2, **kwargs):
    return func(self, torch._foreach_mul(tensor1, scale), tensor2, **kwargs)


_SCALAR_REWRITES = {
    **{
        f: ("alpha", _scaled_other)
        for f in (
            torch.add,
            torch.sub,
            torch.Tensor.add,
            torch.Tensor.add_,
            torch.Tensor.sub,
            torch.Tensor.sub_,
        )
    },
    **{
        f: ("value", _scaled_first)
        for f in (
            torch.addcdiv,
            torch.addcmul,
            torch.Tensor.addcdiv,
            torch.Tensor.addcdiv_,
            torch.Tensor.addcmul,
            torch.Tensor.addcmul_,
        )
    },
    **{
        f: ("alpha", _foreach_scaled_other)
        for f in (torch._foreach_add, torch._foreach_add_, torch._foreach_sub, torch._foreach_sub_)
    },
    **{
        f: ("value", _foreach_scaled_first)
        for f in (
            torch._foreach_addcdiv,
            torch._foreach_addcdiv_,
            torch._foreach_addcmul,
            torch._foreach_addcmul_,
        )
    },
}
