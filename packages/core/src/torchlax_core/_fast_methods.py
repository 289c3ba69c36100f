"""Hot Tensor operators and methods served before PyTorch's dispatcher.

PyTorch's way into ``__torch_dispatch__`` (its C++ dispatcher calling back into Python, and a
wrapper made there) costs more than the JAX launch it leads to: a cached eager ``a + b`` on
1000 floats is ~2x a bare ``jnp.add`` for any ``__torch_dispatch__`` subclass, against
~1.0-1.2x when the subclass's own ``__add__`` launches the same executable and wraps the result
(``benchmarks/eager_overhead.py``'s ``floor:`` rows; torchlax's, with the checks below and the
cache key, ~1.6x loaded and ~1.8x in a quiet moment against ~3.2x through the dispatcher,
2-core machine, session 16: the hit itself, ``serve_pair``, now costs ~1 us above that
floor; above it are this module's checks, ~2.2-2.6 us of wall time inside the call, grad
mode and the two ``requires_grad`` reads ~1 us, finding the environment's ``serve_pair``
~0.5 us). So the
Tensor's hottest operators and methods (``a + b``, ``a * 2``, ``a @ b``, ``x.tanh()``, ...: ``_SERVED``) are Python methods
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
  (``_cached_op.cached_impl``) and this call is a hit: the same key, the same executable and
  the same wrap as the dispatch path's hit, counted in the same statistics. A plugin that
  overrides the op changes the environment's implementation (and clears the cache), so it is
  honoured.

A pointwise method (``a + b``, ``a * 2``, ``-a``, ...) serves root Tensors and Python numbers
only, through its overload's ``serve_pair``/``serve_single``: the hit with the cache key built
for exactly that shape of call (no generic argument loop); so does ``a @ b`` of two 2-d root
Tensors, through ``mm``'s (``a @ b`` 256x256: 8-26 us of thread CPU less than through the
generic key, loaded). Which function that is in the
current environment is remembered per environment table (``_Serving``), and ``requires_grad``
is read from the Tensors themselves (``torch._C._any_requires_grad`` parses its arguments:
~3x the cost). What is left per call is the checks above: each a C call into PyTorch, each
slowed, run between two launches, to several times its own cost (docs/architecture.md).

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

# What would act between the call and the Python dispatch key.
_function_mode = torch._C._is_torch_function_mode_enabled
_dispatch_modes = torch._C._len_torch_dispatch_stack
_functorch = torch._C._are_functorch_transforms_active
_autocast = torch._C._is_any_autocast_enabled
_tracing_state = torch._C._get_tracing_state
_profiling = torch._C._autograd._profiler_enabled  # pyright: ignore[reportAttributeAccessIssue]  (torch._C's stubs omit _autograd)
_grad_enabled = torch.is_grad_enabled
_any_requires_grad = torch._C._any_requires_grad


def _pytorch_would_intervene() -> bool:
    """Whether anything between a Tensor method and the Python dispatch key would act on the
    call (a torch function or dispatch mode, functorch, autocast, forward AD, the profiler, the
    TorchScript tracer): then the method leaves it to PyTorch. Autograd is each method's own
    check (it depends on the arguments). One function for every served method: a frame more
    per hit measured within noise (``a + b``, thread CPU, interleaved with ``jnp.add``)."""
    return bool(
        _function_mode()
        or _dispatch_modes()
        or _functorch()
        or _autocast()
        or forward_ad._current_level >= 0
        or _profiling()
        or _tracing_state() is not None
    )


class _Serving:
    """The hit function (``serve_pair``, ``serve_single`` or ``serve_hit`` of
    ``_cached_op.cached_impl``) of one overload in the current environment, remembered with the
    environment's ``_resolved`` table it came from (looking an ``OpOverload`` up costs a
    Python ``__hash__``). A plugin registered or removed replaces that table, and so the next
    call looks again: an override is honoured. Nothing is remembered while the op is not
    resolved yet (its first dispatch resolves it in the same table).

    ``memo`` is one tuple, replaced whole: a thread reading it while another thread of another
    environment refreshes it sees either pair, never one table's function with another's.
    Between environments used in turn it is looked up again (correct, slower); the last
    table stays referenced until then.
    """

    __slots__ = ("attribute", "memo", "overload")

    def __init__(self, overload, attribute: str):
        self.overload = overload
        self.attribute = attribute
        self.memo: tuple = (None, None)

    def refresh(self, resolved: dict):
        impl = resolved.get(self.overload)
        serve = getattr(impl, self.attribute, None)
        if impl is not None:
            self.memo = (resolved, serve)
        return serve


def _served_binary(tensor_overload, number_overload=None) -> Callable[[Callable], Callable]:
    """``self op other`` of a pointwise op, ``other`` a root Tensor (``tensor_overload``) or a
    Python number (``number_overload``, by default the same): served by the overload's
    ``serve_pair``, which builds the cache key for exactly these two shapes of call."""
    by_tensor = _Serving(tensor_overload, "serve_pair")
    by_number = by_tensor if number_overload is None else _Serving(number_overload, "serve_pair")

    def served(pytorch_method: Callable) -> Callable:
        def method(*args, **kwargs):
            # Every line run between two launches slows the next launch (docs/architecture.md):
            # the cheapest refusals first, PyTorch's state (C calls) only for a call served.
            if len(args) == 2 and not kwargs and not _tensor._overridden:
                a, b = args
                b_is_tensor = type(b) is Tensor
                if (
                    type(a) is Tensor
                    and a._view is None  # a view's layout is its layout rule's to decide
                    and (b._view is None if b_is_tensor else type(b) in _NUMBERS)
                    and not (
                        _pytorch_would_intervene()
                        or (  # autograd would record
                            _grad_enabled()
                            and (a.requires_grad or (b_is_tensor and b.requires_grad))
                        )
                    )
                ):
                    by_b = by_tensor if b_is_tensor else by_number
                    resolved = current_env()._resolved
                    memo = by_b.memo
                    serve = memo[1] if memo[0] is resolved else by_b.refresh(resolved)
                    if serve is not None:
                        if x64_flag.value:
                            out = serve(a, b)
                        else:
                            with x64():  # as run_op
                                out = serve(a, b)
                        if out is not None:
                            return out
            return pytorch_method(*args, **kwargs)

        return method

    return served


def _served_unary(overload) -> Callable[[Callable], Callable]:
    """``op(self)`` of a pointwise op on a root Tensor: served by its ``serve_single``."""
    serving = _Serving(overload, "serve_single")

    def served(pytorch_method: Callable) -> Callable:
        def method(*args, **kwargs):
            if len(args) == 1 and not kwargs and not _tensor._overridden:
                a = args[0]
                if (
                    type(a) is Tensor
                    and a._view is None
                    and not (_pytorch_would_intervene() or (_grad_enabled() and a.requires_grad))
                ):
                    resolved = current_env()._resolved
                    memo = serving.memo
                    serve = memo[1] if memo[0] is resolved else serving.refresh(resolved)
                    if serve is not None:
                        if x64_flag.value:
                            out = serve(a)
                        else:
                            with x64():
                                out = serve(a)
                        if out is not None:
                            return out
            return pytorch_method(*args, **kwargs)

        return method

    return served


def _served_two_d(overload, rule: Callable) -> Callable[[Callable], Callable]:
    """``a @ b``, ``a.matmul(b)``, ``a.mm(b)`` of two 2-d root Tensors (``at::matmul`` of two
    2-d tensors is ``mm``): served by ``mm``'s ``serve_pair`` (its key built for two root
    Tensors, without ``serve_hit``'s generic loop). Other calls take the method's ``rule``
    (``_served_by_rule``: views, or PyTorch's own method)."""
    serving = _Serving(overload, "serve_pair")

    def served(pytorch_method: Callable) -> Callable:
        general = _served_by_rule(rule)(pytorch_method)

        def method(*args, **kwargs):
            if len(args) == 2 and not kwargs and not _tensor._overridden:
                a, b = args
                if (
                    type(a) is Tensor
                    and type(b) is Tensor
                    and a._view is None
                    and b._view is None
                    and a.ndim == 2
                    and b.ndim == 2
                    and not (
                        _pytorch_would_intervene()
                        or (_grad_enabled() and (a.requires_grad or b.requires_grad))
                    )
                ):
                    resolved = current_env()._resolved
                    memo = serving.memo
                    serve = memo[1] if memo[0] is resolved else serving.refresh(resolved)
                    if serve is not None:
                        if x64_flag.value:
                            out = serve(a, b)
                        else:
                            with x64():
                                out = serve(a, b)
                        if out is not None:
                            return out
            return general(*args, **kwargs)

        return method

    return served


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


def _mm(args):
    return _aten.mm.default if len(args) == 2 else None


def _addmm(args):
    return _aten.addmm.default if len(args) == 3 else None


def _served_by_rule(rule: Callable) -> Callable[[Callable], Callable]:
    """A method whose ``rule(args)`` names the ATen overload PyTorch's binding calls (or None:
    not served), served by that overload's general ``serve_hit`` (its key takes views too)."""
    servings = {}

    def served(pytorch_method: Callable) -> Callable:
        def method(*args, **kwargs):
            if (
                not kwargs
                and not _tensor._overridden
                and (overload := rule(args)) is not None
                and not (
                    _pytorch_would_intervene()
                    or (_grad_enabled() and _any_requires_grad(*args))  # autograd would record
                )
            ):
                serving = servings.get(overload)
                if serving is None:
                    serving = servings.setdefault(overload, _Serving(overload, "serve_hit"))
                resolved = current_env()._resolved
                memo = serving.memo
                serve = memo[1] if memo[0] is resolved else serving.refresh(resolved)
                if serve is not None:
                    if x64_flag.value:
                        out = serve(args, {})
                    else:
                        with x64():
                            out = serve(args, {})
                    if out is not None:
                        return out
            return pytorch_method(*args, **kwargs)

        return method

    return served


# Tensor attribute -> the method serving it, made from PyTorch's own method. The operators and
# methods the benchmarks and the models' eager forwards use most; in-place variants are not
# served, nor the reflected operators (``2 * x``: a reflected method of a subclass would be
# called before the left operand's own, ``cpu_tensor * x`` included).
_SERVED: dict[str, Callable[[Callable], Callable]] = {
    "__add__": _served_binary(_aten.add.Tensor),
    "add": _served_binary(_aten.add.Tensor),
    "__sub__": _served_binary(_aten.sub.Tensor),
    "sub": _served_binary(_aten.sub.Tensor),
    "__mul__": _served_binary(_aten.mul.Tensor),
    "mul": _served_binary(_aten.mul.Tensor),
    "__truediv__": _served_binary(_aten.div.Tensor),
    "div": _served_binary(_aten.div.Tensor),
    "__pow__": _served_binary(_aten.pow.Tensor_Tensor, _aten.pow.Tensor_Scalar),
    "pow": _served_binary(_aten.pow.Tensor_Tensor, _aten.pow.Tensor_Scalar),
    "__neg__": _served_unary(_aten.neg.default),
    "neg": _served_unary(_aten.neg.default),
    "relu": _served_unary(_aten.relu.default),
    "tanh": _served_unary(_aten.tanh.default),
    "__matmul__": _served_two_d(_aten.mm.default, _matmul),
    "matmul": _served_two_d(_aten.mm.default, _matmul),
    "mm": _served_two_d(_aten.mm.default, _mm),
    "addmm": _served_by_rule(_addmm),
}


def install() -> None:
    """Make ``_SERVED``'s methods ``Tensor``'s (idempotent: each wraps PyTorch's own)."""
    for name, served in _SERVED.items():
        pytorch_method = getattr(torch.Tensor, name)
        method = served(pytorch_method)
        method.__name__ = method.__qualname__ = name
        method.__doc__ = pytorch_method.__doc__
        _hide_from_dynamo(method)  # run eagerly at a graph break, as __torch_dispatch__
        setattr(Tensor, name, method)


def uninstall() -> None:
    """Give ``Tensor`` back PyTorch's methods (to measure or test the dispatch path)."""
    for name in _SERVED:
        if name in Tensor.__dict__:
            delattr(Tensor, name)
