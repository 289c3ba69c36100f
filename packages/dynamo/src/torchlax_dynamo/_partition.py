"""Split an ATen graph into XLA programs and the few nodes that must run eagerly.

A node runs eagerly when torchlax has no lowering for its op (it then runs with PyTorch; a
torchlax Tensor is handed to it as a torch tensor viewing the same memory), when it moves
data between devices (``x.cpu()`` on a jax tensor: only eager torchlax can do that), or when
its output shape depends on data. ``torch.fx``'s ``CapabilityBasedPartitioner`` groups every
other node into as few XLA programs as possible; each runs as one ``XlaProgram``.
"""

from __future__ import annotations

import torch
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase
from torch.utils import _pytree as pytree
from torchlax_core import Tensor

from ._dlpack import jax_to_torch, torch_to_jax
from ._program import _SIZE_QUERIES, XlaProgram, boxed, counters

aten = torch.ops.aten
_DATA_DEPENDENT = (torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape)


def _holds_tensor(value) -> bool:
    return any(isinstance(v, torch.Tensor) for v in pytree.tree_leaves(value))


def _meta(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def normalize(gm: torch.fx.GraphModule) -> None:
    """Drop ``device=`` from ``_to_copy`` nodes that stay on their input's device.

    AOT autograd spells ``x.to(torch.float64)`` as ``_to_copy(x, dtype=..., device=cpu)``; only
    the dtype matters inside one XLA program.
    """
    changed = False
    for node in gm.graph.find_nodes(op="call_function", target=aten._to_copy.default):
        device = node.kwargs.get("device")
        source = _meta(node.args[0])
        if device is not None and isinstance(source, torch.Tensor) and torch.device(device) == source.device:
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
    if any(tag in target.tags for tag in _DATA_DEPENDENT):
        return "data-dependent output shape"
    device = node.kwargs.get("device") if target is aten._to_copy.default else None
    if device is not None and torch.device(device).type != "jax":
        # Onto a jax device is a placement inside the program (a constant built on the CPU,
        # say); off it, only eager torchlax can produce the CPU/CUDA tensor.
        return "device transfer"
    if env.lowering_for(target) is not None:
        return None
    if not _holds_tensor(_meta(node)) and not _holds_tensor((node.args, node.kwargs)):
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
        return XlaProgram(gm, env, name)
    for node, reason in eager:
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
    return SplitGraph(split, env, name)


class SplitGraph:
    """A graph whose ``fused_*`` submodules are XLA programs and whose other nodes run eagerly."""

    def __init__(self, gm: torch.fx.GraphModule, env, name: str):
        self.gm = gm
        self.env = env
        self.programs = {}
        for node in gm.graph.find_nodes(op="call_module"):
            self.programs[node.target] = XlaProgram(
                gm.get_submodule(node.target), env, f"{name}.{node.target}"
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
        [jax_to_torch(x._value()) if isinstance(x, Tensor) else x for x in flat], spec
    )
    out = target(*torch_args, **torch_kwargs)
    return pytree.tree_map(
        lambda t: Tensor(torch_to_jax(t)) if isinstance(t, torch.Tensor) else t, out
    )
