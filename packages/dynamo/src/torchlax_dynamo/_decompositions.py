"""Which ATen ops AOT autograd decomposes before the graph reaches torchlax.

An op torchlax lowers (or decomposes itself) stays whole: one lowering is usually one or two
XLA ops, better than PyTorch's decomposition into many small ones. Every other op in
PyTorch's core ATen decomposition set (``torch._decomp.core_aten_decompositions()``: ATen to
ATen, unlike the ``torch._refs`` entries of the full table, which produce ``prims``) is
decomposed, so the graph holds as many lowerable ops as possible. What is left without a lowering is run eagerly (see ``_partition``).

The table follows the environment: lowerings registered later (a plugin) take effect on the
next compile.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torchlax_core.internal import tables_of

_cache: dict[int, tuple[Any, dict]] = {}

# Decompositions that are wrong next to an undecomposed partner op: the CPU flash attention
# forward decomposes into the math path, whose second output is not the logsumexp that the
# (fused, undecomposed) flash backward reads. Inductor excludes it too.
_EXCLUDED = frozenset({torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default})


def decompositions_for(env) -> dict[torch._ops.OpOverload, Callable]:
    """The decompositions AOT autograd should apply for ``env``'s lowerings."""
    tables = tables_of(env)
    cached = _cache.get(id(env))
    if cached is not None and cached[0] is tables:
        return cached[1]
    from torch._decomp import core_aten_decompositions

    table = {
        op: fn
        for op, fn in core_aten_decompositions().items()
        if isinstance(op, torch._ops.OpOverload)
        and op not in _EXCLUDED
        and env.lowering_for(op) is None
    }
    _cache[id(env)] = (tables, table)
    return table
