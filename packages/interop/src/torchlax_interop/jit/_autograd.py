"""Autograd across a call: a differentiable forward as one ``torch.autograd.Function``.

A call of a function that changes no state, with grad on and a parameter or argument that
requires grad, is ``_JitFunction``: its forward is the forward program, its backward
``jax.vjp`` of it (recomputed, or from saved residuals once a backward has run).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torchlax_core
from torchlax_core import JitError, Tensor, raise_error
from torchlax_core.internal import (
    Entry,
    x64,
)

from .._call_jax import _borrow, _give_back
from ._inputs import _inexact
from ._outputs import _to_tensors
from ._program import _Info, _Program, _trace_lock
from ._state import (
    _StateSet,
)
from ._write_back import _write_changed


@dataclasses.dataclass
class _Call:
    """One differentiable call: what its backward needs."""

    program: _Program
    info: _Info
    state: _StateSet
    mask: tuple[bool, ...]
    arrays: list  # state arrays, then CPU module tensors and inputs
    lr_arrays: list
    entry: Entry  # of the forward program
    key: Any
    on_jax: bool
    tensors: list
    # per tensor: the memory order its array was passed in (its gradient comes in that order),
    # or None; empty when every array is a value
    orders: tuple = ()
    vjp: Any = None
    out_arrays: Any = None


class _JitFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, call: _Call, *diff_tensors):
        program = call.program
        n_state = len(call.state.storages)
        if program.saves_residuals:
            diff = [a for a, m in zip(call.arrays, call.mask, strict=True) if m]
            other = [a for a, m in zip(call.arrays, call.mask, strict=True) if not m]
            with _trace_lock:
                program._state = call.state
                outs, new_storages, extra, error, vjp = program.forward_vjp(
                    call.mask,
                    torch.get_float32_matmul_precision(),
                    diff,
                    other,
                    call.lr_arrays,
                    call.arrays[n_state:],
                    call.key,
                )
            if error is not None:
                raise_error(error)  # before any output or state is written back
            call.vjp = vjp
        else:
            # The plain forward; backward() recomputes it (this call's key: same dropout).
            outs, new_storages, extra = program.forward_core.run(
                call.entry,
                call.arrays[:n_state],
                call.lr_arrays,
                call.arrays[n_state:],
                key=call.key,
            )
        call.out_arrays = outs
        ctx.call = call
        outputs = _to_tensors(outs, call.on_jax, call.arrays, call.info.out_orders)
        if call.info.writes:
            program.jitted._last_state = None  # pyright: ignore[reportPrivateUsage]  (its own module)
            _write_changed(call.state, call.info, new_storages, extra)
        ctx.mark_non_differentiable(*[o for o in outputs if not _inexact(o)])
        ctx.set_materialize_grads(False)
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grads):
        call: _Call = ctx.call
        if torch.is_grad_enabled():  # create_graph=True: the gradients would be constants
            raise JitError(
                "torchlax.jit: double backward (create_graph=True, or torch.autograd.grad of a "
                "gradient) through a jitted call is not supported: its backward is a JAX "
                "program that autograd cannot differentiate. Call the function without "
                "torchlax.jit for higher-order gradients, or use jax.grad via torchlax.call_torch."
            )
        orders = call.info.out_orders or (None,) * len(grads)
        # Inside JAX's 64-bit mode, as the forward ran: backward() runs after the call, outside
        # its x64() (on the CPU, on the caller's thread), where a float64 cotangent (its
        # astype, or the zeros of an output with no gradient) would narrow to float32.
        with x64():
            cotangents = [
                _cotangent(out, g, order)
                for out, g, order in zip(call.out_arrays, grads, orders, strict=True)
            ]
            if call.vjp is not None:
                (grad_arrays,) = call.program.backward(call.vjp, cotangents)
            else:
                call.program.saves_residuals = True  # a backward follows this forward
                backward = call.program.recomputing_backward(call.entry, call.mask)
                diff = [a for a, m in zip(call.arrays, call.mask, strict=True) if m]
                other = [a for a, m in zip(call.arrays, call.mask, strict=True) if not m]
                grad_arrays = backward(diff, other, call.lr_arrays, call.key, cotangents)
        diff = [t for t, m in zip(call.tensors, call.mask, strict=True) if m]
        if call.orders:
            orders = [o for o, m in zip(call.orders, call.mask, strict=True) if m]
            grad_arrays = [
                g if o is None else jnp.transpose(g, [int(d) for d in np.argsort(o)])
                for g, o in zip(grad_arrays, orders, strict=True)
            ]
        results = []
        for grad, tensor in zip(grad_arrays, diff, strict=True):
            if isinstance(tensor, Tensor):
                results.append(torchlax_core.wrap(grad))
            else:
                results.append(_give_back([grad], [])[0].to(tensor.device))
        return (None, *results)


def _cotangent(out, grad, order=None):
    """The cotangent of the program's output ``out`` (returned in memory ``order``, if any)."""
    if not jnp.issubdtype(out.dtype, jnp.inexact):
        return np.zeros(out.shape, dtype=jax.dtypes.float0)
    if grad is None:
        return jnp.zeros(out.shape, out.dtype)
    array = grad.jax() if isinstance(grad, Tensor) else _borrow(grad)
    if order is not None:
        array = jnp.transpose(array, order)
    return array.astype(out.dtype)
