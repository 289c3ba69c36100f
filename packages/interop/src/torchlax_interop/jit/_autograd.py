"""Autograd across a call: a differentiable forward as one ``torch.autograd.Function``
whose backward is ``jax.vjp`` of the program (docs/interop.md, "Autograd across a jitted
call"), or run eagerly where that backward would miss what PyTorch's does (``eager_call``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torchlax_core
from torchlax_core import JitError, Tensor, raise_error
from torchlax_core.internal import x64

from .._call_jax import _borrow, _give_back
from ._inputs import _inexact
from ._outputs import _to_tensors
from ._program import _log
from ._refusals import _owner


def differentiable_call(plan: Any, run: Any, mask: tuple) -> list:
    """``run`` (a ``_Run`` that autograd needs) as one ``_JitFunction`` call of ``plan``
    (``_repeated._ForwardPlan``), differentiated by the tensors ``mask`` selects
    (``_Run.grad_mask``)."""
    return _JitFunction.apply(plan, run, mask, *_masked(run.tensors(), mask))


def _masked(values: list, mask: tuple) -> list:
    """``values`` where ``mask`` is true."""
    return [v for v, m in zip(values, mask, strict=True) if m]


def _differentiated(ctx: Any) -> list:
    """The call's entry under ``jax.vjp`` by the arrays its mask selects (the program's
    ``forward_vjp``): ``[outputs, new storages, extra results, check error, vjp]``."""
    run = ctx.run
    arrays = run.state_arrays + run.arrays  # (state arrays, then CPU module tensors and inputs)
    selection = (ctx.mask, run.entry)
    return run.program.forward_vjp(selection, ctx.precision, arrays, run.lr_arrays, ctx.key)


class _JitFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, plan, run, mask: tuple, *diff_tensors):
        """``mask``: per tensor of ``run.tensors()``, whether the call is differentiated by it.
        The call's key and float32 matmul precision are kept for a backward that recomputes
        the forward (``_differentiated``)."""
        key = run.entry.key()
        ctx.run, ctx.mask, ctx.key, ctx.vjp = run, mask, key, None
        ctx.precision = torch.get_float32_matmul_precision()  # (its entry's, traced under it)
        program = run.program

        def launch():
            if not program.saves_residuals:
                # The plain forward; backward() recomputes it (this call's key: same dropout).
                return plan.program.run(
                    run.entry, run.state_arrays, run.lr_arrays, run.arrays, key=key
                )
            *results, error, ctx.vjp = _differentiated(ctx)
            if error is not None:
                raise_error(error)  # before any output or state is written back
            return results

        ctx.out_arrays = outs = plan.launched(run.state, launch)[0]
        outputs = _to_tensors(outs, run.on_jax, run.state_arrays + run.arrays, run.info.out_orders)
        ctx.mark_non_differentiable(*[o for o in outputs if not _inexact(o)])
        ctx.set_materialize_grads(False)
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grads):
        run = ctx.run
        if torch.is_grad_enabled():  # create_graph=True: the gradients would be constants
            raise JitError(
                "torchlax.jit: double backward (create_graph=True, or torch.autograd.grad of a "
                "gradient) through a jitted call is not supported: its backward is a JAX "
                "program that autograd cannot differentiate. Call the function without "
                "torchlax.jit for higher-order gradients, or use jax.grad via torchlax.call_torch."
            )
        orders = run.info.out_orders or (None,) * len(grads)
        with x64():  # (as the forward ran: outside it a float64 cotangent narrows to float32)
            cotangents = [
                _cotangent(out, g, order)
                for out, g, order in zip(ctx.out_arrays, grads, orders, strict=True)
            ]
            vjp = ctx.vjp
            if vjp is None:  # the plain forward ran: its residuals now (its inputs and key)
                run.program.saves_residuals = True  # a backward follows this forward
                vjp = _differentiated(ctx)[-1]
            (grad_arrays,) = run.program.backward(vjp, cotangents)
        # Per tensor, the memory order its array was passed in (its gradient's), or None
        tensors, layouts = run.tensors(), run.in_layouts or ()
        orders = [None] * (len(tensors) - len(layouts)) + [x and x[1] for x in layouts]
        results = []
        diff = _masked(list(zip(tensors, orders, strict=True)), ctx.mask)
        for grad, (tensor, order) in zip(grad_arrays, diff, strict=True):
            if order is not None:
                grad = jnp.transpose(grad, [int(d) for d in np.argsort(order)])
            if isinstance(tensor, Tensor):
                results.append(torchlax_core.wrap(grad))
            else:
                results.append(_give_back([grad], [])[0].to(tensor.device))
        return (None, None, None, *results)


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


def eager_call(jitted: Any, run: Any) -> Any:
    """A differentiable call of a forward that met backward hooks or read a plain CPU tensor
    requiring grad (``_Info.eager_backward``), run eagerly: ``jax.vjp`` of the program would
    run no hook and give that tensor no ``.grad``."""
    reason = run.info.eager_backward[0]
    if jitted._cpu_outputs:
        raise JitError(
            f"{_owner(jitted)}: the forward meets {reason}; a backward after a compiled call of "
            "a step over CPU state would not do that. Move the model to the 'jax' device "
            "(model.to('jax') inside torchlax.enable()), or call backward() inside the jitted "
            "function."
        )
    if not run.program.logged_eager:
        run.program.logged_eager = True
        _log.info(
            "%s: runs eagerly while autograd records: the forward meets %s (calls without "
            "grad, or with backward() inside the jitted function, are compiled)",
            _owner(jitted),
            reason,
        )
    return jitted._eager(*run.call)
