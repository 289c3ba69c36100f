"""A loss returned after its traced ``backward()``: handed out detached, with a ``grad_fn`` that raises.

The canonical training step ends ``loss.backward(); opt.step(); return loss``. With
``loss.backward()`` traced into the graph (``_capture``), ``torch.optim``'s graph break inside
``opt.step()`` ends the graph while ``loss`` is alive, so ``loss`` becomes an output of the graph
that also ran its backward. Dynamo (torch 2.14) refuses such an output:
``OutputGraph._validate_outputs_safe_for_autograd_nodes`` finds that the output's ``grad_fn``
chain was consumed by the traced ``autograd.grad`` and restarts the capture with a graph break
at ``backward()`` (``AutogradGradRestartAnalysis``), which costs the step a third program, the
autograd engine and AOT autograd's backward wrappers. Dynamo refuses because AOT autograd would
give the output a compiled ``grad_fn`` whose backward succeeds, where eagerly the graph's saved
tensors are freed and a second backward raises.

What eager PyTorch hands back is a tensor that requires grad, has a ``grad_fn``, reads back its
value, and raises "Trying to backward through the graph a second time ..." when anything
backpropagates through it. For graphs compiled for ``backend="torchlax"`` only, this module
hands out exactly that instead of restarting:

- inside the graph, each such output is replaced by its ``detach()`` (a node Dynamo adds the
  way it adds any traced ``detach``), tagged in the node's ``meta`` (``FREED_GRAPH``); the
  graph is then the one the user gets by writing ``loss = loss.detach()`` before
  ``opt.step()``: forward with backward as one program;
- after each call, the backend gives the tagged outputs a ``grad_fn`` (``FreedGraphBackward``)
  whose backward raises PyTorch's own error (``RuntimeError``, the same message).

Dynamo's own check then runs on the rewritten outputs and finds nothing to refuse. Graphs for
other backends go through Dynamo's check untouched (the hook reads the graph's compiler and
returns to the original at once). If torch no longer has the method, ``install`` raises: the
canonical step would otherwise silently fall back to three programs.

Differences from eager PyTorch, each shared with every backend's compiled graphs: the returned
loss's ``grad_fn`` is ``FreedGraphBackward`` instead of, say, ``NllLossBackward0`` (other
backends hand out ``CompiledFunctionBackward``); and where the consumed chain saved no tensors
(``loss = w.sum()``), eagerly a second backward succeeds, while here it raises, as it does
through AOT autograd's ``CompiledFunctionBackward`` (whose saved state the first backward
freed) after Dynamo's restart with any backend (checked with inductor and ``aot_eager``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._dynamo import output_graph
from torchlax_core import JitError

# The node meta key the backend reads: this graph output is a loss whose backward already ran.
FREED_GRAPH = "torchlax_freed_graph"

# PyTorch's message, verbatim, when a backward reaches saved tensors an earlier backward freed.
SECOND_BACKWARD_MESSAGE = (
    "Trying to backward through the graph a second time (or directly access saved tensors "
    "after they have already been freed). Saved intermediate values of the graph are freed "
    "when you call .backward() or autograd.grad(). Specify retain_graph=True if you need to "
    "backward through the graph a second time or if you need to access saved tensors after "
    "calling backward."
)


class FreedGraph(torch.autograd.Function):
    """The ``grad_fn`` of a tensor whose graph a traced backward already consumed.

    ``FreedGraph.apply(anchor, (value,))`` gives ``value`` itself this ``grad_fn`` and returns
    it; its backward raises as eager PyTorch does on a second backward. ``value`` is handed in
    inside a tuple, where autograd does not look for tensors, so that it is a new output to
    autograd (which then sets its history in place) rather than an input returned as is (which
    autograd would hand out as a view made by a dispatched ``view_as``: ``_base`` set, and on a
    torchlax Tensor an eager op, about 4x the cost while XLA runs the step's programs beside
    it). The anchor is a leaf that requires grad, so that the output gets a ``grad_fn``
    although ``value`` (detached inside the graph) does not require grad.
    """

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, held: tuple[torch.Tensor]) -> torch.Tensor:
        del ctx, anchor
        return held[0]

    @staticmethod
    def backward(ctx: Any, *grad_outputs: Any) -> Any:
        del ctx, grad_outputs
        raise JitError(SECOND_BACKWARD_MESSAGE)


_anchor = torch.zeros((), device="cpu", dtype=torch.float32, requires_grad=True)


def _give_freed_graph_grad_fn(outputs: list[Any], index: int) -> None:
    value = outputs[index]
    if value.requires_grad:
        raise JitError(
            f"torchlax_dynamo: graph output {index}, detached inside the graph because its "
            "traced backward consumed it, came back requiring grad; Dynamo's or AOT autograd's "
            "output handling changed (see torchlax_dynamo._spent_outputs)."
        )
    if sum(other is value for other in outputs) > 1:  # handed out twice: the other stays detached
        value = value.detach()
    outputs[index] = FreedGraph.apply(_anchor, (value,))


def freed_graph_outputs(gm: torch.fx.GraphModule) -> tuple[int, ...]:
    """Indices of ``gm``'s outputs that this module detached (empty for nearly every graph)."""
    (outputs,) = gm.graph.output_node().args
    if not isinstance(outputs, (tuple, list)):
        return ()
    return tuple(
        i
        for i, node in enumerate(outputs)
        if isinstance(node, torch.fx.Node) and node.meta.get(FREED_GRAPH, False)
    )


def with_freed_graph_grad_fns(
    compiled: Callable[..., Any], indices: Sequence[int]
) -> Callable[..., Any]:
    """``compiled``, whose outputs at ``indices`` get ``FreedGraphBackward`` as ``grad_fn``."""

    def call(*args: Any) -> list[Any]:
        outputs = list(compiled(*args))
        if torch.is_grad_enabled():
            for i in indices:
                _give_freed_graph_grad_fn(outputs, i)
            return outputs
        # The graph may be called with grad mode off (its body sets the mode it traced with);
        # the loss it hands out required grad when it was traced, so it does here too.
        with torch.enable_grad():
            for i in indices:
                _give_freed_graph_grad_fn(outputs, i)
        return outputs

    return call


def _consumed_outputs(graph: Any, rv: list[Any]) -> list[int]:
    # The test of Dynamo's check: the output requires grad and its grad_fn chain reaches a node
    # the traced backward consumed.
    from torch._dynamo.variables.tensor import TensorVariable

    consumed = graph.autograd_grad_consumed_grad_fns
    indices = []
    for i, var in enumerate(rv):
        if not isinstance(var, TensorVariable) or not var.requires_grad:
            continue
        fake = var.as_proxy().node.meta.get("example_value")
        if fake is None or fake.grad_fn is None:
            continue
        if output_graph.collect_reachable_grad_fns([(fake, None)]) & consumed:
            indices.append(i)
    return indices


_original_validate: list[Callable[..., Any]] = []


def install(is_this_backend: Callable[[Any], bool]) -> None:
    """Hook ``OutputGraph._validate_outputs_safe_for_autograd_nodes`` (idempotent).

    ``is_this_backend(compiler_fn)`` says whether a graph is compiled for torchlax.
    """
    if _original_validate:
        return
    original = getattr(output_graph.OutputGraph, "_validate_outputs_safe_for_autograd_nodes", None)
    if original is None or not hasattr(output_graph, "collect_reachable_grad_fns"):
        raise JitError(
            "torchlax_dynamo: this torch's Dynamo has no "
            "OutputGraph._validate_outputs_safe_for_autograd_nodes or "
            "collect_reachable_grad_fns, which torchlax hooks to hand out a loss returned after "
            "its traced backward (docs/dynamo.md, 'Training steps'); use torch 2.14 or update "
            "torchlax_dynamo._spent_outputs."
        )

    def validate_or_detach(self: Any, rv: list[Any], tx: Any) -> None:
        if self.autograd_grad_consumed_grad_fns and is_this_backend(self.compiler_fn):
            detached: dict[int, Any] = {}
            for i in _consumed_outputs(self, rv):
                var = rv[i]
                if id(var) not in detached:
                    replacement = var.call_method(tx, "detach", [], {})
                    replacement.as_proxy().node.meta[FREED_GRAPH] = True
                    detached[id(var)] = replacement
                rv[i] = detached[id(var)]
        original(self, rv, tx)

    output_graph.OutputGraph._validate_outputs_safe_for_autograd_nodes = validate_or_detach  # pyright: ignore[reportAttributeAccessIssue]
    _original_validate.append(original)
