"""A traced ``loss.backward()`` whose loss was computed in an earlier graph, or whose gradient
crosses devices: a graph break.

With ``trace_autograd_ops`` (``_capture``) Dynamo traces ``loss.backward()`` as
``torch.autograd.grad`` of the leaves it knows in the frame it is capturing, plus their
accumulation into ``.grad``. When the step breaks the graph between the forward and
``loss.backward()`` (``print``, ``torch._dynamo.graph_break()``, a module's full backward hook,
whose ``BackwardHook`` Dynamo does not trace), the loss's autograd graph starts in an earlier
graph: the frame's inputs carry ``grad_fn``s that no traced ``autograd.grad`` can follow. Dynamo
(torch 2.14) graph-breaks for that inside ``autograd.grad``, but ``Tensor.backward`` asks for no
gradient at all when the frame holds no leaf (the parameters were used in the earlier graph),
and returns without one: every ``.grad`` stays unset, the optimizer skips every parameter, and
the step silently does not train. Eager PyTorch, and this backend with the option off, run that
backward in the autograd engine.

For graphs compiled for ``backend="torchlax"`` (the hook reads the graph's compiler and
otherwise returns to Dynamo's method at once), ``Tensor.backward`` first walks the loss's
autograd graph; if it reaches a ``grad_fn`` of one of the frame's inputs, it breaks the graph
there, as Dynamo does at ``backward()`` with the option off: the autograd engine runs that
backward through the earlier graphs' compiled backwards, and the step trains as eagerly (one
program more than a step without the break). The same for a loss whose graph reaches a leaf on
another device (``loss + (w_cpu * 2).sum().to("jax")``): Dynamo runs the traced
``autograd.grad`` on fake tensors, and the autograd engine's worker thread for the other device
then failed an assertion of fake-tensor mode that it could not raise: the process aborted
("terminate called without an active exception"). If torch no longer has the method,
``install`` raises: a step would otherwise silently not train.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch._dynamo.exc import unimplemented
from torch._dynamo.variables.base import Method
from torch._dynamo.variables.tensor import TensorVariable
from torchlax_core import JitError
from torchlax_core.internal import graph_leaf, graph_nodes

_original_backward: list[Callable[..., Any]] = []


def _fake(var: Any) -> Any:
    return var.as_proxy().node.meta.get("example_value")


def untraceable_backward(loss: Any, tx: Any) -> str | None:
    """Why the backward of ``loss`` (a ``TensorVariable``) cannot be traced, or None: its
    autograd graph reaches the ``grad_fn`` of one of the frame's inputs (an earlier graph's),
    or a leaf on another device than the loss (a CPU leaf moved to ``jax``)."""
    fake = _fake(loss)
    if not isinstance(fake, torch.Tensor) or fake.grad_fn is None:
        return None
    ends: dict[Any, str] = {}
    for var in tx.output.input_source_to_var.values():
        t = _fake(var) if isinstance(var, TensorVariable) else None
        if not isinstance(t, torch.Tensor):
            continue
        name = var.source.name if var.source is not None else "an input"
        for node in (t.grad_fn, t._base.grad_fn if t._base is not None else None):
            if node is not None:
                ends[node] = name
    for node in graph_nodes([fake.grad_fn]):
        if node in ends:
            return f"the loss's autograd graph reaches the grad_fn of {ends[node]}"
        leaf = graph_leaf(node)
        if leaf is not None and leaf.device.type != fake.device.type:
            return (
                f"the loss is on {fake.device.type} and a leaf of its autograd graph on "
                f"{leaf.device.type}"
            )
    return None


def install(is_this_backend: Callable[[Any], bool]) -> None:
    """Hook ``Tensor.backward``'s handler in Dynamo's ``TensorVariable`` (idempotent).

    ``is_this_backend(compiler_fn)`` says whether a graph is compiled for torchlax.
    """
    if _original_backward:
        return
    table = getattr(TensorVariable, "tp_methods", None)
    entry = table.get("backward") if isinstance(table, dict) else None
    original = getattr(entry, "handler", None)
    if table is None or original is None:
        raise JitError(
            "torchlax_dynamo: this torch's Dynamo has no TensorVariable.tp_methods['backward'], which "
            "torchlax hooks so that a traced loss.backward() whose loss an earlier graph "
            "computed breaks the graph instead of giving no gradients (docs/dynamo.md, "
            "'Training steps'); use torch 2.14 or update torchlax_dynamo._earlier_graphs."
        )

    def method_backward(self: Any, tx: Any, *args: Any, **kwargs: Any) -> Any:
        if is_this_backend(tx.output.compiler_fn):
            reason = untraceable_backward(self, tx)
            if reason is not None:
                unimplemented(
                    gb_type="Tensor.backward() that a traced autograd.grad cannot follow (torchlax)",
                    context=reason,
                    explanation=(
                        "The loss was computed (in part) in an earlier graph, or its gradient "
                        "crosses devices: the traced backward cannot follow its autograd graph "
                        "there, so the autograd engine runs this backward."
                    ),
                    hints=["Remove the graph break between the forward and loss.backward()."],
                )
        return original(self, tx, *args, **kwargs)

    table["backward"] = Method(functools.wraps(original)(method_backward))
    _original_backward.append(original)
