"""Half-precision computations that JAX's autodiff recomputes rather than saves.

PyTorch computes a bfloat16/float16 GELU, LayerNorm or softmax in float32 and keeps only
half-precision tensors for its backward. Differentiated by JAX (``torchlax.functional`` +
``jax.grad``, ``torchlax.jit``'s residual-saving forward), the same lowering would keep its
float32 intermediates as residuals: twice the bytes of the activation, or more. ``recomputed``
runs such a computation under ``jax.checkpoint``, so that what the backward keeps is the
computation's own (half-precision) array arguments, and the float32 part is recomputed from
them in the backward pass. The values are the same computation, forward and backward.

The other direction: a backward lowering that recomputes what its forward computed (flash
attention's scores, from the saved query, key and logsumexp) reads its inputs through
``fenced``, so that XLA does not merge the two computations into one and keep the forward's
array alive until the backward (PyTorch's backward ops in one ``torchlax.jit`` program).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.core
from jax._src.interpreters.partial_eval import DynamicJaxprTracer

__all__ = ["fenced", "recomputed"]


def recomputed(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, differentiated by recomputing it from its array arguments.

    Only the arguments that are themselves JAX arrays (not nested in lists) are the
    checkpoint's inputs; everything else (dims, flags, Python scalars) is a constant of it.
    Where no argument is a tracer of a transformation (concrete arrays, or a plain ``jax.jit``
    trace such as ``torchlax.jit``'s, whose program computes its backward with PyTorch's own
    backward ops) it is ``fn`` as it is: a checkpoint would double the tracing time there and
    save nothing. ``fn`` must return arrays (or tuples/lists of them, or None).
    """
    where = [i for i, a in enumerate(args) if isinstance(a, jax.Array)]
    names = [n for n, a in kwargs.items() if isinstance(a, jax.Array)]
    arrays = [args[i] for i in where] + [kwargs[n] for n in names]
    if not any(_differentiable(a) for a in arrays):
        return fn(*args, **kwargs)

    def run(*values: Any) -> Any:
        call_args = list(args)
        for i, v in zip(where, values, strict=False):
            call_args[i] = v
        call_kwargs = {**kwargs, **dict(zip(names, values[len(where) :], strict=True))}
        return fn(*call_args, **call_kwargs)

    return jax.checkpoint(run)(*arrays)


def fenced(*arrays: Any) -> tuple:
    """``arrays`` as they are, behind an optimization barrier where any is a tracer: XLA then
    cannot merge what is computed from them with the same computation elsewhere in the program
    (as ``jax.checkpoint`` fences its recomputation). Pass the gradient too: nothing computed
    from the fenced arrays can then run before the backward pass reaches it. (Concrete arrays,
    eager: no barrier, no extra dispatch.)"""
    if not any(isinstance(a, jax.core.Tracer) for a in arrays):
        return arrays
    return jax.lax.optimization_barrier(arrays)


def _differentiable(x: jax.Array) -> bool:
    """A tracer that autodiff (or another transformation around it) may differentiate: any
    tracer but a plain staging trace's. (``jax.grad`` of a ``jax.jit``-ed function stages the
    function first and differentiates its program afterwards: that path keeps what the
    program's own operations keep.)"""
    return isinstance(x, jax.core.Tracer) and not isinstance(x, DynamicJaxprTracer)
