"""Hot Tensor operators and methods served before PyTorch's dispatcher.

PyTorch's way into ``__torch_dispatch__`` (its C++ dispatcher calling back into Python, and a
wrapper made there) costs more than the JAX launch it leads to: a cached eager ``a + b`` on
1000 floats is ~2x a bare ``jnp.add`` for any ``__torch_dispatch__`` subclass, against
~1.0-1.2x when the subclass's own ``__add__`` launches the same executable and wraps the result
(``benchmarks/eager_overhead.py``'s ``floor:`` rows; torchlax's, with the checks below and the
cache key, ~2.2x against ~3.2x through the dispatcher, loaded 2-core machine). So the Tensor's hottest operators and
methods (``a + b``, ``a * 2``, ``a @ b``, ``x.tanh()``, ...: ``_SERVED``) are Python methods
of ``Tensor`` that serve a call themselves when that is exactly what the dispatcher would do:

- the method maps to one ATen overload for these arguments (PyTorch's binding of
  ``tensor + tensor_or_number`` reaches ``aten.add.Tensor`` with the same arguments; ``a @ b``
  of two 2-d Tensors reaches ``aten.mm``), called with no keyword (``alpha=``, ``out=``);
- nothing between the call and the Python dispatch key would act: no torch-level override
  of any environment (``set_function_overrides``: they take precedence), no torch function or
  dispatch mode, no functorch transform, no autocast, no forward-mode AD level, no profiler,
  no TorchScript tracer, and autograd would record nothing (grad mode off, or no argument
  requires grad);
- the environment's implementation of that overload is the eager op cache's
  (``_dispatch.cached_impl``) and this call is a hit: the same key, the same executable and
  the same wrap as the dispatch path's hit, counted in the same statistics. A plugin that
  overrides the op changes the environment's implementation (and clears the cache), so it is
  honoured.

Everything else, every miss included, calls PyTorch's own method (and so reaches
``__torch_dispatch__``, which fills the cache that later calls hit).

Why methods and not ``__torch_function__``: with a ``__torch_function__`` installed, every
torch call on a Tensor that is not served pays PyTorch's round trip into Python (``x.shape``
0.3 -> 1.9 us, ``x.view(...)`` 1.3 -> 2.9 us), and a model makes many more such calls than hot
ones: it made the eager GPT-2 forward ~8% slower although it served ``a + b`` faster. A
method costs nothing to the calls it does not serve. Module functions (``torch.add``,
``torch.addmm``) are not served: only ``__torch_function__`` sees them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.autograd import forward_ad

from . import _tensor
from ._current import current_env
from ._tensor import Tensor, _hide_from_dynamo
from ._x64 import x64, x64_flag

_aten = torch.ops.aten
_NUMBERS = frozenset({int, float, bool, complex})


def _roots(args) -> bool:
    """Whether every torchlax Tensor among ``args`` is a root (not a view). A pointwise op's
    hit is served only then: a view's result layout is its layout rule's to decide
    (``_dispatch.memory_order_impl``), and checking here first keeps the calls the cache
    would refuse from paying for the rest of the checks."""
    for a in args:
        if type(a) is Tensor and a._view is not None:
            return False
    return type(args[0]) is Tensor


def _pointwise(overload, arity: int) -> Callable:
    """``self op other`` (other a torchlax Tensor or a Python number: the op cache's key
    refuses anything else, and the call falls through), or ``op(self)``."""
    return lambda args: overload if len(args) == arity and _roots(args) else None


def _binary(overload) -> Callable:
    """A non-pointwise ``self op other``: the op cache's key takes views too (``hit_key``)."""
    return lambda args: overload if len(args) == 2 else None


def _pow(args):
    if len(args) != 2 or not _roots(args):
        return None
    if type(args[1]) is Tensor:
        return _aten.pow.Tensor_Tensor
    return _aten.pow.Tensor_Scalar if type(args[1]) in _NUMBERS else None


def _matmul(args):
    # ``at::matmul`` of two 2-d tensors is ``mm``; other ranks reshape or expand first.
    if len(args) != 2:
        return None
    a, b = args
    if type(a) is not Tensor or type(b) is not Tensor or a._view is not None or b._view is not None:
        return None
    if a._storage.array.ndim != 2 or b._storage.array.ndim != 2:
        return None
    return _aten.mm.default


def _addmm(args):
    return _aten.addmm.default if len(args) == 3 else None


# Tensor attribute -> rule(args) -> the ATen overload PyTorch's binding calls, or None. The
# operators and methods the benchmarks and the models' eager forwards use most; in-place
# variants are not served, nor the reflected operators (``2 * x``: a reflected method of a
# subclass would be called before the left operand's own, ``cpu_tensor * x`` included).
_SERVED: dict[str, Callable] = {
    "__add__": _pointwise(_aten.add.Tensor, 2),
    "add": _pointwise(_aten.add.Tensor, 2),
    "__sub__": _pointwise(_aten.sub.Tensor, 2),
    "sub": _pointwise(_aten.sub.Tensor, 2),
    "__mul__": _pointwise(_aten.mul.Tensor, 2),
    "mul": _pointwise(_aten.mul.Tensor, 2),
    "__truediv__": _pointwise(_aten.div.Tensor, 2),
    "div": _pointwise(_aten.div.Tensor, 2),
    "__pow__": _pow,
    "pow": _pow,
    "__neg__": _pointwise(_aten.neg.default, 1),
    "neg": _pointwise(_aten.neg.default, 1),
    "relu": _pointwise(_aten.relu.default, 1),
    "tanh": _pointwise(_aten.tanh.default, 1),
    "__matmul__": _matmul,
    "matmul": _matmul,
    "mm": _binary(_aten.mm.default),
    "addmm": _addmm,
}

# What would act between the call and the Python dispatch key.
_function_mode = torch._C._is_torch_function_mode_enabled
_dispatch_modes = torch._C._len_torch_dispatch_stack
_functorch = torch._C._are_functorch_transforms_active
_autocast = torch._C._is_any_autocast_enabled
_tracing_state = torch._C._get_tracing_state
_profiling = torch._C._autograd._profiler_enabled  # pyright: ignore[reportAttributeAccessIssue]  (torch._C's stubs omit _autograd)
_grad_enabled = torch.is_grad_enabled
_any_requires_grad = torch._C._any_requires_grad


def _served(name: str, rule: Callable, pytorch_method: Callable) -> Callable:
    def method(*args, **kwargs):
        # One frame for a hit: every line run between two launches slows the next launch
        # (docs/architecture.md), so the checks are inlined.
        if (
            not kwargs
            and not _tensor._overridden
            and (overload := rule(args)) is not None
            and not (
                _function_mode()
                or _dispatch_modes()
                or _functorch()
                or _autocast()
                or forward_ad._current_level >= 0
                or _profiling()
                or _tracing_state() is not None
                or (_grad_enabled() and _any_requires_grad(*args))  # autograd would record
            )
        ):
            # None where the op is not resolved yet or not served by the op cache.
            serve_hit = getattr(current_env()._resolved.get(overload), "serve_hit", None)
            if serve_hit is not None:
                if x64_flag.value:
                    out = serve_hit(args, {})
                else:
                    with x64():  # as run_op
                        out = serve_hit(args, {})
                if out is not None:
                    return out
        return pytorch_method(*args, **kwargs)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = pytorch_method.__doc__
    _hide_from_dynamo(method)  # run eagerly at a graph break, as __torch_dispatch__
    return method


def install() -> None:
    """Make ``_SERVED``'s methods ``Tensor``'s (idempotent: each wraps PyTorch's own)."""
    for name, rule in _SERVED.items():
        setattr(Tensor, name, _served(name, rule, getattr(torch.Tensor, name)))


def uninstall() -> None:
    """Give ``Tensor`` back PyTorch's methods (to measure or test the dispatch path)."""
    for name in _SERVED:
        if name in Tensor.__dict__:
            delattr(Tensor, name)
