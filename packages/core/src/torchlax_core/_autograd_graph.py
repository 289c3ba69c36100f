"""An autograd graph walked before its backward runs: which nodes and leaves it reaches.

``torchlax.jit`` (a ``backward()`` of a traced step that would reach a plain CPU tensor) and
the ``torch.compile`` backend (a traced ``backward()`` reaching an earlier graph or another
device) decide whether to refuse a backward by what its graph reaches, walked here once.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch


def graph_nodes(grad_fns: Iterable[Any]) -> Iterator[Any]:
    """Each autograd node reached from ``grad_fns`` (None skipped), once, depth first (the
    last root's graph first)."""
    stack = [n for n in grad_fns if n is not None]
    visited: set = set()
    while stack:
        node = stack.pop()
        if node in visited:
            continue
        visited.add(node)
        yield node
        stack.extend(n for n, _ in node.next_functions if n is not None)


def graph_leaf(node: Any) -> torch.Tensor | None:
    """The leaf whose ``.grad`` autograd node ``node`` accumulates into (AccumulateGrad), or
    None."""
    leaf = getattr(node, "variable", None)
    return leaf if isinstance(leaf, torch.Tensor) else None
