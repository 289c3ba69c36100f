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
from torchlax_core.internal import x64

from .._call_jax import _borrow, _give_back
from ._inputs import _inexact, _input_order
from ._outputs import _to_tensors
from ._program import _trace_lock
from ._write_back import _write_changed


@dataclasses.dataclass
class _Call:
    """One differentiable call: its ``_Run`` (``_call``) and what its backward needs."""

    run: Any  # _call._Run
    mask: tuple[bool, ...]  # per tensor: whether the call is differentiated by it
    arrays: list  # state arrays, then CPU module tensors and inputs
    key: Any
    tensors: list
    # per tensor: the memory order its array was passed in (its gradient comes in that order),
    # or None; empty when every array is a value
    orders: tuple = ()
    vjp: Any = None
    out_arrays: Any = None


def differentiable_call(run: Any) -> list:
    """``run`` (a ``_Run`` that autograd needs) as one ``_JitFunction`` call."""
    tensors = run.tensors()
    mask = tuple(t.requires_grad and _inexact(t) for t in tensors)
    orders = (
        ()
        if run.in_layouts is None
        else (None,) * (len(tensors) - len(run.inputs)) + tuple(map(_input_order, run.in_layouts))
    )
    call = _Call(run, mask, run.state_arrays + run.arrays, run.entry.key(), tensors, orders)
    return _JitFunction.apply(call, *_masked(tensors, mask)[0])


def _masked(values: list, mask: tuple) -> tuple[list, list]:
    """``values`` where ``mask`` is true, and the others."""
    return (
        [v for v, m in zip(values, mask, strict=True) if m],
        [v for v, m in zip(values, mask, strict=True) if not m],
    )


class _JitFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, call: _Call, *diff_tensors):
        run = call.run
        program, info = run.program, run.info
        n_state = len(run.state.storages)
        if program.saves_residuals:
            diff, other = _masked(call.arrays, call.mask)
            with _trace_lock:
                program._state = run.state
                outs, new_storages, extra, error, vjp = program.forward_vjp(
                    call.mask,
                    torch.get_float32_matmul_precision(),
                    diff,
                    other,
                    run.lr_arrays,
                    call.arrays[n_state:],
                    call.key,
                )
            if error is not None:
                raise_error(error)  # before any output or state is written back
            call.vjp = vjp
        else:
            # The plain forward; backward() recomputes it (this call's key: same dropout).
            outs, new_storages, extra = program.forward_core.run(
                run.entry,
                call.arrays[:n_state],
                run.lr_arrays,
                call.arrays[n_state:],
                key=call.key,
            )
        call.out_arrays = outs
        ctx.call = call
        outputs = _to_tensors(outs, run.on_jax, call.arrays, info.out_orders)
        if info.writes:
            program.jitted._last_state = None  # pyright: ignore[reportPrivateUsage]  (its own module)
            _write_changed(run.state, info, new_storages, extra)
        ctx.mark_non_differentiable(*[o for o in outputs if not _inexact(o)])
        ctx.set_materialize_grads(False)
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grads):
        call: _Call = ctx.call
        run = call.run
        if torch.is_grad_enabled():  # create_graph=True: the gradients would be constants
            raise JitError(
                "torchlax.jit: double backward (create_graph=True, or torch.autograd.grad of a "
                "gradient) through a jitted call is not supported: its backward is a JAX "
                "program that autograd cannot differentiate. Call the function without "
                "torchlax.jit for higher-order gradients, or use jax.grad via torchlax.call_torch."
            )
        orders = run.info.out_orders or (None,) * len(grads)
        # Inside JAX's 64-bit mode, as the forward ran: backward() runs after the call, outside
        # its x64() (on the CPU, on the caller's thread), where a float64 cotangent (its
        # astype, or the zeros of an output with no gradient) would narrow to float32.
        with x64():
            cotangents = [
                _cotangent(out, g, order)
                for out, g, order in zip(call.out_arrays, grads, orders, strict=True)
            ]
            if call.vjp is not None:
                (grad_arrays,) = run.program.backward(call.vjp, cotangents)
            else:
                run.program.saves_residuals = True  # a backward follows this forward
                backward = run.program.recomputing_backward(run.entry, call.mask)
                diff, other = _masked(call.arrays, call.mask)
                grad_arrays = backward(diff, other, run.lr_arrays, call.key, cotangents)
        diff = _masked(call.tensors, call.mask)[0]
        if call.orders:
            orders = _masked(list(call.orders), call.mask)[0]
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
