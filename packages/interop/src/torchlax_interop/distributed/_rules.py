"""Sharding rules: which ``PartitionSpec`` each parameter or buffer of a module gets.

A rule set is a list of ``(regex, spec)`` pairs matched against dotted names
(``layers.0.attn.q_proj.weight``) with ``re.search``; the first match wins and names no rule
matches stay replicated. ``spec`` is a ``PartitionSpec`` or a callable
``(name, shape, mesh) -> PartitionSpec | None`` (``None``: try the next rule).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from jax.sharding import Mesh, PartitionSpec

SpecFn = Callable[[str, tuple, Mesh], PartitionSpec | None]
Rules = Sequence[tuple[str, PartitionSpec | SpecFn]]

REPLICATED = PartitionSpec()


def spec_for(
    name: str, shape: tuple, mesh: Mesh, rules: Rules | SpecFn | PartitionSpec
) -> PartitionSpec:
    """The spec ``rules`` give the tensor ``name`` of ``shape`` (replicated if none matches)."""
    if isinstance(rules, PartitionSpec):
        return fit(rules, shape, mesh)
    if callable(rules):
        rules = [(".*", rules)]
    for pattern, spec in rules:
        if re.search(pattern, name) is None:
            continue
        if callable(spec) and not isinstance(spec, PartitionSpec):
            spec = spec(name, tuple(shape), mesh)
            if spec is None:
                continue
        check(spec, name, shape, mesh)
        return spec
    return REPLICATED


def _axis_size(mesh: Mesh, axes: Any) -> int:
    if axes is None:
        return 1
    names = axes if isinstance(axes, tuple) else (axes,)
    size = 1
    for axis in names:
        size *= mesh.shape[axis]
    return size


def fits(spec: PartitionSpec, shape: tuple, mesh: Mesh) -> bool:
    """Whether ``spec`` shards ``shape`` evenly on ``mesh``."""
    if len(spec) > len(shape):
        return False
    return all(dim % _axis_size(mesh, axes) == 0 for dim, axes in zip(shape, spec, strict=False))


def fit(spec: PartitionSpec, shape: tuple, mesh: Mesh) -> PartitionSpec:
    """``spec`` where it shards ``shape`` evenly, else replicated."""
    return spec if fits(spec, shape, mesh) else REPLICATED


def check(spec: PartitionSpec, name: str, shape: tuple, mesh: Mesh) -> None:
    if len(spec) > len(shape):
        raise ValueError(
            f"The sharding rule gives {name} (shape {tuple(shape)}) the spec {spec}, which names "
            f"{len(spec)} dimensions; the tensor has {len(shape)}. Fix the rule's regex or spec."
        )
    for axes in spec:
        for axis in axes if isinstance(axes, tuple) else (axes,):
            if axis is not None and axis not in mesh.shape:
                raise ValueError(
                    f"The sharding rule for {name} names mesh axis {axis!r}, but the mesh has axes "
                    f"{tuple(mesh.axis_names)}."
                )
    for i, (dim, axes) in enumerate(zip(shape, spec, strict=False)):
        size = _axis_size(mesh, axes)
        if dim % size:
            raise ValueError(
                f"The sharding rule gives {name} (shape {tuple(shape)}) the spec {spec}: dimension "
                f"{i} ({dim}) does not divide evenly over mesh axes {axes} ({size} devices). Pick "
                "a mesh or model size that divides, or a rule that leaves that dimension whole."
            )


def fsdp_rule(axis: str = "data") -> SpecFn:
    """Fully sharded: each tensor's largest dimension that ``axis`` divides is split over it.

    Ties go to the first such dimension; a tensor no dimension of which divides is replicated.
    """

    def rule(name: str, shape: tuple, mesh: Mesh) -> PartitionSpec:
        size = mesh.shape[axis]
        candidates = [i for i, dim in enumerate(shape) if dim % size == 0 and dim >= size]
        if not candidates or size == 1:
            return REPLICATED
        best = max(candidates, key=lambda i: (shape[i], -i))
        return PartitionSpec(*[axis if i == best else None for i in range(best + 1)])

    return rule


def fsdp_rules(axis: str = "data") -> list:
    """The rule set ``[(".*", fsdp_rule(axis))]``: every parameter and buffer fully sharded."""
    return [(".*", fsdp_rule(axis))]


# Projection names of common transformer implementations (torch.nn, Hugging Face, GPT-2).
_COLUMN = r"(q_proj|k_proj|v_proj|query|key|value|qkv|in_proj|up_proj|gate_proj|fc1|w1|w3|linear1|c_fc|c_attn|wi|wi_0|wi_1|intermediate\.dense)"
_ROW = (
    r"(o_proj|out_proj|down_proj|fc2|w2|linear2|c_proj|wo|attention\.output\.dense|output\.dense)"
)
_EMBEDDING = (
    r"(embed_tokens|word_embeddings|wte|tok_embeddings|token_embedding|embedding|embed|lm_head)"
)


def megatron_rules(model_axis: str = "model", data_axis: str | None = None) -> list:
    """Megatron-style tensor parallelism for transformers over mesh axis ``model_axis``.

    - column-parallel (output features split): q/k/v, fused qkv, ``in_proj`` and MLP up/gate
      projections; their biases are split the same way;
    - row-parallel (input features split): attention output and MLP down projections; their
      biases stay replicated (added after the all-reduce);
    - embeddings and the LM head: split over the vocabulary (rows).

    Weights follow ``nn.Linear``'s ``(out, in)`` layout; GPT-2's ``Conv1D`` (``c_attn``,
    ``c_fc``, ``c_proj``) stores ``(in, out)`` and gets the transposed specs. With
    ``data_axis`` every other parameter is FSDP-sharded over it (else replicated).
    """
    m = model_axis
    rules: list = [
        (r"(^|\.)(c_attn|c_fc)\.weight$", PartitionSpec(None, m)),
        (r"(^|\.)(c_attn|c_fc)\.bias$", PartitionSpec(m)),
        (r"(^|\.)c_proj\.weight$", PartitionSpec(m, None)),
        (rf"(^|\.){_COLUMN}(_weight|\.weight)$", PartitionSpec(m, None)),
        (rf"(^|\.){_COLUMN}(_bias|\.bias)$", PartitionSpec(m)),
        (rf"(^|\.){_ROW}\.weight$", PartitionSpec(None, m)),
        (rf"(^|\.){_EMBEDDING}\.weight$", PartitionSpec(m, None)),
    ]
    if data_axis is not None:
        rules.append((".*", fsdp_rule(data_axis)))
    return rules
