"""Split an ATen graph into XLA programs and the few nodes that must run eagerly.

A node runs eagerly when torchlax has no lowering for its op (it then runs with PyTorch; a
torchlax Tensor is handed to it as a torch tensor viewing the same memory), when it moves
data between devices (``x.cpu()`` on a jax tensor: only eager torchlax can do that), or when
its output (``.item()``) or output shape (``x[mask]``) depends on data; an op PyTorch tags as
possibly data-dependent whose output shape is static in this call (``x[int_index]``) stays in. ``torch.fx``'s ``CapabilityBasedPartitioner`` groups every
other node into as few XLA programs as possible; each runs as one ``XlaProgram``.
"""

from __future__ import annotations

import logging
import time

import torch
import torch.fx.node
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase
from torch.utils import _pytree as pytree
from torchlax_core import Tensor
from torchlax_core.internal import array_of, get_logger, graph_break

from ._dlpack import jax_to_torch, torch_to_jax
from ._program import _SIZE_QUERIES, XlaProgram, boxed, counters

aten = torch.ops.aten
_log = get_logger("dynamo")


def _holds_tensor(value) -> bool:
    return any(isinstance(v, torch.Tensor) for v in pytree.tree_leaves(value))


def _meta(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _static_shape(node: torch.fx.Node) -> bool:
    """Whether the op's output shape is known without its input values.

    PyTorch tags ops such as ``aten.index.Tensor`` with ``dynamic_output_shape`` because *some*
    calls depend on data (a boolean mask). The fake output says which call this is: its sizes
    are plain (or input-derived) sizes when the shape is static - integer index tensors, always
    - and fresh unbacked symbols when it depends on data. Only the latter must run eagerly.
    """
    return bool(_output_tensors(node)) and not _unbacked_output(node)


def _output_tensors(node: torch.fx.Node) -> list:
    return [v for v in pytree.tree_leaves(_meta(node)) if isinstance(v, torch.Tensor)]


def _unbacked_output(node: torch.fx.Node) -> bool:
    """Whether the fake output has sizes only the data decides (torchvision's ``nms``, say)."""
    return any(free_unbacked_symbols(t) for t in _output_tensors(node))


def normalize(gm: torch.fx.GraphModule) -> None:
    """Drop ``device=`` from ``_to_copy`` nodes that stay on their input's device.

    AOT autograd spells ``x.to(torch.float64)`` as ``_to_copy(x, dtype=..., device=cpu)``; only
    the dtype matters inside one XLA program.
    """
    changed = False
    for node in gm.graph.find_nodes(op="call_function", target=aten._to_copy.default):
        device = node.kwargs.get("device")
        source = _meta(node.args[0])
        if (
            device is not None
            and isinstance(source, torch.Tensor)
            and torch.device(device) == source.device
        ):
            node.kwargs = {k: v for k, v in node.kwargs.items() if k != "device"}
            changed = True
    if changed:
        gm.recompile()


def eager_reason(node: torch.fx.Node, env) -> str | None:
    """Why ``node`` cannot run inside an XLA program, or None if it can."""
    if node.op != "call_function":
        return None
    target = node.target
    if isinstance(target, torch._ops.HigherOrderOperator):
        return "no lowering"
    if not isinstance(target, torch._ops.OpOverload):
        return None  # operator.getitem, SymInt arithmetic: plain Python at trace time
    if target in _SIZE_QUERIES:
        return None
    if torch.Tag.data_dependent_output in target.tags:
        return "data-dependent output"  # .item(): a host read
    if torch.Tag.dynamic_output_shape in target.tags and not _static_shape(node):
        return "data-dependent output shape"
    if _unbacked_output(node):
        return "data-dependent output shape"
    device = node.kwargs.get("device") if target is aten._to_copy.default else None
    if device is not None and torch.device(device).type != "jax":  # pyright: ignore[reportArgumentType]  (_to_copy's device argument is a device)
        # Onto a jax device is a placement inside the program (a constant built on the CPU,
        # say); off it, only eager torchlax can produce the CPU/CUDA tensor.
        return "device transfer"
    if env.lowering_for(target) is not None or env.plugin_fallback_for(target) is not None:
        return None
    # The arguments are graph nodes: look at the values they stand for. An op without a
    # tensor output (``_assert_async``, ``_print``) that takes a tensor must still run eagerly.
    arg_values = torch.fx.node.map_arg((node.args, node.kwargs), _meta)
    if not _holds_tensor(_meta(node)) and not _holds_tensor(arg_values):
        return None  # e.g. aten._assert_scalar on SymBools: evaluated in Python at trace time
    return "no lowering"


class _Lowerable(OperatorSupportBase):
    def __init__(self, env):
        self.env = env

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        # Only computations join a partition; the graph's inputs and outputs stay outside.
        return node.op == "call_function" and eager_reason(node, self.env) is None


def compile_graph(gm: torch.fx.GraphModule, env, name: str):
    """A callable running ``gm``: one ``XlaProgram``, or a split graph of several plus eager nodes."""
    counters["graphs"] += 1
    normalize(gm)
    eager = [(n, r) for n in gm.graph.nodes if (r := eager_reason(n, env)) is not None]
    if not eager:
        _log.info("%s: one XLA program (%d ATen nodes, none eager)", name, len(gm.graph.nodes))
        return _timed(XlaProgram(gm, env, name))
    for node, reason in eager:
        _log.debug("%s: %s runs eagerly (%s)", name, node.format_node(), reason)
        if reason == "no lowering":
            op = node.target
            env.warn_once(
                ("torchlax_dynamo.eager", op),
                f"torchlax has no JAX lowering for {op}; torch.compile(backend='torchlax') runs "
                "it eagerly with PyTorch and splits the graph into XLA programs around it. "
                "Register a lowering for it to keep the whole graph in one XLA program.",
            )
    counters["eager_nodes"] += len(eager)
    split = CapabilityBasedPartitioner(
        gm, _Lowerable(env), allows_single_node_partition=True
    ).partition_and_fuse()
    result = SplitGraph(split, env, name)
    graph_break(
        name,
        f"split into {len(result.programs)} XLA programs around {len(eager)} eager nodes "
        f"({', '.join(sorted({f'{n.target} ({r})' for n, r in eager}, key=str))})",
    )
    return result


class SplitGraph:
    """A graph whose ``fused_*`` submodules are XLA programs and whose other nodes run eagerly."""

    def __init__(self, gm: torch.fx.GraphModule, env, name: str):
        self.gm = gm
        self.env = env
        self.programs = {}
        for node in gm.graph.find_nodes(op="call_module"):
            self.programs[node.target] = _timed(
                XlaProgram(
                    gm.get_submodule(node.target),  # pyright: ignore[reportArgumentType]  (the partitioner's submodules are GraphModules)
                    env,
                    f"{name}.{node.target}",
                )
            )
        self._nodes = list(gm.graph.nodes)
        self.boxed = boxed(self)

    def __call__(self, *args):
        values: dict = {}
        inputs = iter(args)
        lookup = values.__getitem__
        for node in self._nodes:
            op = node.op
            if op == "placeholder":
                values[node] = next(inputs)
            elif op == "call_module":
                values[node] = self.programs[node.target](*torch.fx.node.map_arg(node.args, lookup))
            elif op == "call_function":
                node_args = torch.fx.node.map_arg(node.args, lookup)
                node_kwargs = torch.fx.node.map_arg(node.kwargs, lookup)
                values[node] = _run_eager(node, node_args, node_kwargs, self.env)
            elif op == "get_attr":
                values[node] = getattr(self.gm, node.target)
            elif op == "output":
                out = torch.fx.node.map_arg(node.args[0], lookup)
                return tuple(out) if isinstance(out, list) else out
        raise AssertionError("graph has no output node")


class _TimedProgram:
    """An ``XlaProgram`` whose calls that trace and compile (a new input signature) are logged
    with their time. Used only while the ``torchlax`` logger shows INFO, so the steady-state
    path of an unlogged program is untouched."""

    def __init__(self, program: XlaProgram):
        self.program = program
        self.name = program.name
        self.boxed = boxed(self)

    def __call__(self, *args):
        traces = counters["xla_traces"]
        start = time.perf_counter()
        out = self.program(*args)
        if counters["xla_traces"] != traces:
            _log.info(
                "%s: XLA program traced and compiled for a new input signature; first call %.1f ms",
                self.name,
                1e3 * (time.perf_counter() - start),
            )
        return out


def _timed(program: XlaProgram):
    return _TimedProgram(program) if _log.isEnabledFor(logging.INFO) else program


def _run_eager(node, args, kwargs, env):
    target = node.target
    if not isinstance(target, torch._ops.OpOverload | torch._ops.HigherOrderOperator):
        return target(*args, **kwargs)
    flat, spec = pytree.tree_flatten((args, kwargs))
    if env.lowering_for(target) is not None or not any(isinstance(x, Tensor) for x in flat):
        # Lowered but not traceable (device transfers), or plain torch tensors: run as is.
        return target(*args, **kwargs)
    # No lowering: run PyTorch's kernel on torch views of the torchlax Tensors' memory.
    torch_args, torch_kwargs = pytree.tree_unflatten(
        [jax_to_torch(array_of(x)) if isinstance(x, Tensor) else x for x in flat], spec
    )
    out = target(*torch_args, **torch_kwargs)
    return pytree.tree_map(
        lambda t: Tensor(torch_to_jax(t)) if isinstance(t, torch.Tensor) else t, out
    )
