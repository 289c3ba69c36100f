"""``jit``: compile a PyTorch function or module with ``jax.jit``.

One call runs one XLA program. The program's inputs are the tensors among the arguments, the
module's parameters and buffers, and a PRNG key; every other argument leaf is static (part of
the cache key, like the module's train/eval flags). ``jax.jit`` caches per input shapes and
dtypes. When autograd needs it, the forward also returns ``jax.vjp``'s residuals and the
backward is a second jitted program, wired into torch autograd by a ``torch.autograd.Function``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torchlax_core
from torch.utils import _pytree as pytree
from torchlax_core import Tensor

from ._call_jax import _borrow, _give_back
from ._dlpack import check_shared_writes, from_torch

_SLOT = object()  # a tensor's place among the flattened arguments
_STATIC = object()  # a static_argnums/static_argnames argument's place


def jit(fn_or_module: Callable | torch.nn.Module, *, static_argnums: int | Sequence[int] = (),
        static_argnames: str | Sequence[str] = ()) -> Callable:
    """Compile ``fn_or_module`` with ``jax.jit``; the result is called like the original.

    It takes and returns torchlax Tensors (and also plain CPU tensors: then the results are CPU
    tensors, shared with XLA through DLPack). Tensors anywhere in the arguments are program
    inputs; other argument leaves (ints, floats, strings, ...) are static: a new value
    compiles a new program, as do new shapes or dtypes. ``static_argnums``/``static_argnames``
    name further arguments passed unchanged as static values (they must be hashable).

    For a module, its parameters and buffers are program inputs, not constants: updating the
    weights does not recompile. Buffers the forward writes in place (BatchNorm's running
    statistics) are written back to the module after each call. Switching ``train()``/
    ``eval()`` selects another program. Tensors a plain function closes over are constants.

    Random ops get their keys from a key drawn for each call from torch's generator, so dropout
    differs per call and ``torch.manual_seed`` reproduces it.

    Autograd works: if grad mode is on and a parameter or tensor argument requires grad, the
    call is one ``torch.autograd.Function`` whose backward is ``jax.vjp`` of the program, so
    ``loss.backward()`` fills ``.grad`` as usual. JAX runs with 64-bit types enabled, so int64
    stays int64.
    """
    if isinstance(static_argnums, int):
        static_argnums = (static_argnums,)
    if isinstance(static_argnames, str):
        static_argnames = (static_argnames,)
    return _Jitted(fn_or_module, tuple(static_argnums), tuple(static_argnames))


@dataclasses.dataclass
class _Info:
    """What tracing learned about one program at one input signature."""

    out_spec: Any
    out_statics: tuple
    changed_buffers: tuple[str, ...]
    uses_random: bool


class _Program:
    """One static configuration of a jitted callable: its traced function and jitted forms."""

    def __init__(self, jitted: _Jitted, in_spec, statics, static_values, state_names,
                 buffer_names):
        self.jitted = jitted
        self.in_spec = in_spec
        self.statics = statics
        self.static_values = static_values
        self.state_names = state_names
        self.buffer_names = buffer_names
        self.infos: dict[Any, _Info] = {}
        self._tracing_info: _Info | None = None
        self.forward = jax.jit(self._traced)
        self.forward_vjp = jax.jit(self._traced_vjp, static_argnums=0)
        self.backward = jax.jit(lambda vjp, cotangents: vjp(cotangents))

    def _traced(self, arrays: list, key):
        env = torchlax_core.current_env()
        n_state = len(self.state_names)
        with torchlax_core.enable(env), env.prng_key_scope(key):
            tensors = [Tensor(a) for a in arrays]
            state = dict(zip(self.state_names, tensors[:n_state], strict=True))
            inputs = iter(tensors[n_state:])
            statics = iter(self.static_values)
            flat = [next(inputs) if s is _SLOT else next(statics) if s is _STATIC else s
                    for s in self.statics]
            args, kwargs = pytree.tree_unflatten(flat, self.in_spec)
            out = self.jitted._run(state, args, kwargs)
            uses_random = _key_drawn(env, key)
        out_flat, out_spec = pytree.tree_flatten(out)
        out_arrays = [_traced_array(x) for x in out_flat if isinstance(x, torch.Tensor)]
        out_statics = tuple(_SLOT if isinstance(x, torch.Tensor) else x for x in out_flat)
        changed = tuple(
            name for name, original in zip(self.state_names, arrays, strict=False)
            if name in self.buffer_names and state[name].jax() is not original
        )
        self._tracing_info = _Info(out_spec, out_statics, changed, uses_random)
        return out_arrays, [state[name].jax() for name in changed]

    def _traced_vjp(self, mask: tuple[bool, ...], diff: list, other: list, key):
        def differentiable(diff):
            outs, buffers = self._traced(_merge(mask, diff, other), key)
            return outs, buffers

        outs, vjp, buffers = jax.vjp(differentiable, diff, has_aux=True)
        return outs, buffers, vjp

    def info(self, signature, arrays, key) -> _Info:
        info = self.infos.get(signature)
        if info is None:
            # Trace once without running, to learn the output structure and whether the
            # program draws random keys; the real call reuses this trace.
            jax.eval_shape(self.forward, arrays, key)
            info = self.infos[signature] = self._tracing_info
        return info


def _merge(mask, diff, other) -> list:
    diff, other = iter(diff), iter(other)
    return [next(diff) if m else next(other) for m in mask]


def _key_drawn(env, key) -> bool:
    stack = getattr(env, "_key_stack", None)
    return stack is None or not stack or stack[-1] is not key


def _traced_array(x: torch.Tensor):
    if isinstance(x, Tensor):
        return x.jax()
    return from_torch(x).jax()  # a constant the function made on the CPU


def _signature(arrays: list) -> tuple:
    return tuple((a.shape, a.dtype, getattr(a, "weak_type", False)) for a in arrays)


class _Jitted:
    def __init__(self, target, static_argnums, static_argnames):
        self.target = target
        self.module = target if isinstance(target, torch.nn.Module) else None
        self.static_argnums = static_argnums
        self.static_argnames = static_argnames
        self.programs: dict[Any, _Program] = {}
        self.__wrapped__ = target

    def _run(self, state, args, kwargs):
        if self.module is None:
            return self.target(*args, **kwargs)
        return torch.func.functional_call(
            self.module, state, args, kwargs, tie_weights=True, strict=False
        )

    def __call__(self, *args, **kwargs):
        check_shared_writes()
        with jax.enable_x64(True):
            return self._call(args, kwargs)

    def _call(self, args, kwargs):
        args, kwargs, static_values = self._split_static(args, kwargs)
        flat, in_spec = pytree.tree_flatten((args, kwargs))
        inputs = [x for x in flat if isinstance(x, torch.Tensor)]
        statics = tuple(_SLOT if isinstance(x, torch.Tensor) else x for x in flat)
        params, buffers = self._state()
        state_tensors = list(params.values()) + list(buffers.values())
        state_names = tuple(params) + tuple(buffers)
        training = tuple(m.training for m in self.module.modules()) if self.module else ()
        program_key = (str(in_spec), statics, static_values, state_names, training)
        try:
            program = self.programs.get(program_key)
        except TypeError:
            raise TypeError(
                "torchlax.jit treats non-tensor arguments as static values, which must be "
                "hashable; got an unhashable one. Pass arrays as tensors and other values as "
                "hashable Python objects (tuples, not lists)."
            ) from None
        if program is None:
            program = self.programs[program_key] = _Program(
                self, in_spec, statics, static_values, state_names, frozenset(buffers)
            )
        tensors = state_tensors + inputs
        on_jax = any(isinstance(t, Tensor) for t in tensors)
        arrays = [t.jax() if isinstance(t, Tensor) else _borrow(t) for t in tensors]
        env = torchlax_core.current_env()
        signature = _signature(arrays)
        info = program.info(signature, arrays, _unused_key())
        key = env.next_prng_key() if info.uses_random else _unused_key()

        mask = tuple(t.requires_grad and _inexact(t) for t in tensors)
        if torch.is_grad_enabled() and any(mask):
            diff = [t for t, m in zip(tensors, mask, strict=True) if m]
            outputs = _JitFunction.apply(
                _Call(program, info, mask, arrays, key, on_jax, tensors), *diff
            )
        else:
            out_arrays, new_buffers = program.forward(arrays, key)
            outputs = _to_tensors(out_arrays, on_jax, arrays)
            _write_back(buffers, info.changed_buffers, new_buffers)
        it = iter(outputs)
        flat_out = [next(it) if s is _SLOT else s for s in info.out_statics]
        return pytree.tree_unflatten(flat_out, info.out_spec)

    def _split_static(self, args, kwargs):
        static_values = []
        if self.static_argnums:
            args = list(args)
            for i in self.static_argnums:
                if i < len(args):
                    static_values.append(args[i])
                    args[i] = _STATIC
            args = tuple(args)
        if self.static_argnames:
            kwargs = dict(kwargs)
            for name in self.static_argnames:
                if name in kwargs:
                    static_values.append(kwargs[name])
                    kwargs[name] = _STATIC
        return args, kwargs, tuple(static_values)

    def _state(self):
        if self.module is None:
            return {}, {}
        return dict(self.module.named_parameters()), dict(self.module.named_buffers())


@functools.cache
def _unused_key():
    # The key input of a program that draws none. Made once: each jax.random.key call is an
    # XLA dispatch, which cost half of a small model's per-call overhead.
    return jax.random.key(0)


def _inexact(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()


def _to_tensors(arrays, on_jax: bool, inputs) -> list[torch.Tensor]:
    if on_jax:
        return [torchlax_core.wrap(a) for a in arrays]
    return _give_back(list(arrays), inputs)


def _write_back(buffers: dict, names, values) -> None:
    with torch.no_grad():
        for name, value in zip(names, values, strict=True):
            buffer = buffers[name]
            if isinstance(buffer, Tensor):
                buffer.copy_(torchlax_core.wrap(value))
            else:
                buffer.copy_(torch.from_dlpack(jnp.array(value, copy=True)))


@dataclasses.dataclass
class _Call:
    """One differentiable call: what its backward needs."""

    program: _Program
    info: _Info
    mask: tuple[bool, ...]
    arrays: list
    key: Any
    on_jax: bool
    tensors: list
    vjp: Any = None
    out_arrays: Any = None


class _JitFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, call: _Call, *diff_tensors):
        diff = [a for a, m in zip(call.arrays, call.mask, strict=True) if m]
        other = [a for a, m in zip(call.arrays, call.mask, strict=True) if not m]
        outs, new_buffers, vjp = call.program.forward_vjp(call.mask, diff, other, call.key)
        call.vjp, call.out_arrays = vjp, outs
        ctx.call = call
        outputs = _to_tensors(outs, call.on_jax, call.arrays)
        program = call.program
        _write_back(
            {n: t for n, t in zip(program.state_names, call.tensors, strict=False)},
            call.info.changed_buffers, new_buffers,
        )
        ctx.mark_non_differentiable(*[o for o in outputs if not _inexact(o)])
        ctx.set_materialize_grads(False)
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grads):
        call: _Call = ctx.call
        cotangents = [_cotangent(out, g) for out, g in zip(call.out_arrays, grads, strict=True)]
        with jax.enable_x64(True):
            (grad_arrays,) = call.program.backward(call.vjp, cotangents)
        diff = [t for t, m in zip(call.tensors, call.mask, strict=True) if m]
        results = []
        for grad, tensor in zip(grad_arrays, diff, strict=True):
            if isinstance(tensor, Tensor):
                results.append(torchlax_core.wrap(grad))
            else:
                results.append(_give_back([grad], [])[0].to(tensor.device))
        return (None, *results)


def _cotangent(out, grad):
    if not jnp.issubdtype(out.dtype, jnp.inexact):
        return np.zeros(out.shape, dtype=jax.dtypes.float0)
    if grad is None:
        return jnp.zeros(out.shape, out.dtype)
    array = grad.jax() if isinstance(grad, Tensor) else _borrow(grad)
    return array.astype(out.dtype)
