"""Dynamo traces ``loss.backward()`` into the graph, for functions compiled with this backend only.

By default Dynamo breaks the graph at ``loss.backward()`` and lets the autograd engine run it:
a training step then reaches the backend as three graphs (forward, AOT autograd's backward,
optimizer update), and the backward pays the autograd engine, AOT autograd's backward wrappers
and a third launch. With Dynamo's ``trace_autograd_ops`` option it traces the call instead (as
``torch.autograd.grad`` plus gradient accumulation), so forward and backward are one graph, one
XLA program (docs/dynamo.md, "Training steps").

The option is read while Dynamo captures a frame, before any backend sees a graph, so the
backend cannot decide per graph. What it can do is run each call of a function compiled with it
inside a context: Dynamo enters ``backend.backend_ctx_ctor()`` around every call of the
optimized function (``_TorchDynamoContext``'s enter/exit hooks), and every frame Dynamo
captures during that call - the step itself, its resume frames after graph breaks, the
optimizer's ``step`` - is captured inside it. ``TracedBackward`` is that context: it turns the
option on, and back to what it was on exit, exceptions included.

Scope:

- Functions compiled with another backend are captured with the option as the user left it
  (off by default): the context is this backend's only. One exception follows from Dynamo
  itself: a function compiled with another backend and *called from inside* a torchlax-compiled
  function is run under the outer context, so it is captured with the option on as well.
- Threads: Dynamo's configuration values are per thread in torch 2.14 (a user override is a
  ``ContextVar``), so the option set here is seen by captures on this thread only; another
  thread compiling with inductor at the same moment sees its own value (a test checks it).
- A user who set the option keeps it: it is on during the call and their setting after it.

``torch.compile`` hands Dynamo a wrapper of the backend (``_TorchCompileWrapper``) that does
not carry ``backend_ctx_ctor`` over, although ``torch._dynamo.optimize(backend)`` honours it.
``install`` therefore wraps ``eval_frame.get_compiler_fn``, the one function both paths turn a
backend into Dynamo's callable with, and gives the result the context when the backend inside
is torchlax's; other backends' callables are returned untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch._dynamo.config as dynamo_config
from torch._dynamo import eval_frame

# Dynamo's own low-overhead patcher (what it uses on every call for ``dynamic_shapes``): sets
# this thread's override and returns a function restoring the override it replaced.
_trace_autograd_ops_on = dynamo_config._make_closure_patcher(trace_autograd_ops=True)


class TracedBackward:
    """Turns ``torch._dynamo.config.trace_autograd_ops`` on for one call of a compiled function.

    One instance per call (Dynamo calls ``backend_ctx_ctor()`` each time), so nested calls
    restore in order; on exit the option's override is what it was (unset, or a user's own
    setting). Cost: 2.5 us a call warm (reading and writing the option through the config
    module's attributes cost 5.6 us; ``config.patch`` 23 us).
    """

    __slots__ = ("_restore",)

    def __enter__(self) -> None:
        self._restore = _trace_autograd_ops_on()

    def __exit__(self, *exc_info: object) -> None:
        self._restore()


def _innermost_backend(compiler_fn: Any) -> Any:
    # WrapBackendDebug -> _TorchCompileWrapper -> the registered function.
    compiler_fn = getattr(compiler_fn, "_torchdynamo_orig_backend", compiler_fn)
    return getattr(compiler_fn, "compiler_fn", compiler_fn)


# The backends given the context, by identity (a registry override may install a second one);
# eval_frame.get_compiler_fn is wrapped once, for all of them.
_backends: list[Callable[..., Any]] = []


def compiles_for_torchlax(compiler_fn: Any) -> bool:
    """Whether Dynamo's callable ``compiler_fn`` compiles with a backend given to ``install``."""
    innermost = _innermost_backend(compiler_fn)
    return any(innermost is b for b in _backends)


def install(backend: Callable[..., Any]) -> None:
    """Give Dynamo's callable for ``backend`` the ``TracedBackward`` context (idempotent)."""
    backend.backend_ctx_ctor = TracedBackward  # pyright: ignore[reportFunctionMemberAccess]  (the attribute Dynamo reads)
    if any(b is backend for b in _backends):
        return
    _backends.append(backend)
    if len(_backends) > 1:
        return
    get_compiler_fn = eval_frame.get_compiler_fn

    def get_compiler_fn_with_context(compiler_fn):
        wrapped = get_compiler_fn(compiler_fn)
        if compiles_for_torchlax(wrapped):
            wrapped.backend_ctx_ctor = TracedBackward  # pyright: ignore[reportAttributeAccessIssue]  (read by eval_frame._optimize)
        return wrapped

    eval_frame.get_compiler_fn = get_compiler_fn_with_context
