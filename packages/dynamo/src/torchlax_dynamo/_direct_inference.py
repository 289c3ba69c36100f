"""An inference graph whose AOT autograd runtime wrapper has nothing to do is called directly.

AOT autograd hands Dynamo a chain of wrappers around the compiled ATen graph: ``disable``,
``aot_module_simplified``'s ``forward`` (which prepends lifted parameters), the runtime
wrapper (captures inputs for mutation write-back and output aliasing, switches grad mode off,
normalises the outputs to a list, checks their count) and the boxed calling convention. For an
inference graph (no backward can follow) that mutates no input, returns no alias of an input
or of an intermediate, and carries no effect tokens, random-state inputs, subclass inputs or
outputs, lifted parameters, dynamic-dimension markings or grad-mode change, every step of that
chain passes its arguments through unchanged: 2.5 us a call in a warm loop (0.4 us direct),
17 / 37 us (min / median) inside real GPT-2 forward calls, whose caches are cold after XLA ran
(docs/dynamo.md, "Session 15"). ``direct_inference`` then returns a callable that calls the
compiled graph itself.

Why this is exact:

- Grad mode was off when the graph was compiled, and Dynamo guards grad mode (its global-state
  guard) and every input's ``requires_grad``, so this graph is only ever called with grad mode
  off: the runtime wrapper's "switch grad mode off around the call" does nothing, and a later
  call with grad mode on recompiles (a graph with a backward, through AOT autograd as before).
  Autocast likewise: off at compile time, guarded.
- The first call still goes through AOT autograd's callable, so what it does on a first call
  only (check custom ops' aliasing, hand back fakified outputs) is kept.
- The graph's inputs are Dynamo's arguments, one for one (AOT autograd added no parameter,
  token, RNG state or deduplicated argument: the ATen graph has exactly as many placeholders as
  Dynamo passed inputs), and its outputs are the user's outputs, none of them an alias.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._functorch._aot_autograd.schemas import OutputType
from torch.fx.node import map_arg
from torch.utils._python_dispatch import is_traceable_wrapper_subclass


def direct_inference(
    gm: torch.fx.GraphModule,
    example_inputs: list,
    aot_compiled: Callable[..., Any],
    compiled_graphs: list[tuple[Any, torch.fx.GraphModule, Any]],
) -> Callable[..., Any] | None:
    """A callable for Dynamo running the one inference graph in ``compiled_graphs`` (the graph
    runner, the ATen graph and AOT autograd's metadata) directly after a first call through
    ``aot_compiled``; None where AOT autograd's wrapper has work to do (then use
    ``aot_compiled``)."""
    if len(compiled_graphs) != 1:
        return None
    runner, aten_gm, meta = compiled_graphs[0]
    try:
        passes_through = _passes_through(gm, example_inputs, aten_gm, meta)
    except AttributeError:  # AOT autograd's metadata changed shape (another torch): keep it
        passes_through = False
    if not passes_through:
        return None
    call: list[Callable[..., Any]] = []

    def first_call(*args):
        out = aot_compiled(*args)
        call[0] = runner
        return out

    call.append(first_call)

    def compiled_inference(*args):
        return call[0](*args)

    return compiled_inference


def _passes_through(gm, example_inputs, aten_gm, meta) -> bool:
    """Whether AOT autograd's runtime wrappers pass this inference graph's inputs and outputs
    through unchanged (the conditions in the module docstring)."""
    if meta is None or torch.is_grad_enabled() or torch._C._is_any_autocast_enabled():
        return False
    if any(isinstance(x, list | tuple | dict) for x in example_inputs):
        return False  # AOT autograd flattens them (flatten_graph_inputs)
    if any(is_traceable_wrapper_subclass(x) for x in example_inputs):
        return False
    if next(gm.parameters(), None) is not None or next(gm.buffers(), None) is not None:
        return False  # lifted by aot_module_simplified and prepended on every call
    placeholders = len(aten_gm.graph.find_nodes(op="placeholder"))
    if placeholders != len(example_inputs):
        return False  # tokens, RNG states or deduplicated inputs
    if any(info.mutates_data or info.mutates_metadata for info in meta.input_info):
        return False
    if meta.num_intermediate_bases or meta.tokens or meta.grad_enabled_mutation is not None:
        return False
    if getattr(meta, "num_graphsafe_rng_states", 0) or getattr(
        meta, "is_rng_op_functionalized", False
    ):
        return False
    if any(
        info.output_type is not OutputType.non_alias or info.dynamic_dims
        for info in meta.output_info
    ):
        return False
    # A subclass output made inside the graph (from plain inputs) is desugared and rebuilt.
    outputs: list[torch.fx.Node] = []
    map_arg(gm.graph.output_node().args, outputs.append)
    return not any(is_traceable_wrapper_subclass(n.meta.get("example_value")) for n in outputs)
