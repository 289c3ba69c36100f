"""The ops package's own tables: each op has exactly one lowering or decomposition."""

from __future__ import annotations

import collections

import torchlax_ops._plugin  # noqa: F401  (fills the tables)
from torchlax_ops._table import DECOMPOSITIONS, FUNCTIONS, LOWERINGS


def _where(fn):
    return f"{fn.__module__}.{fn.__qualname__}"


def test_no_op_is_registered_twice():
    for table in (LOWERINGS, DECOMPOSITIONS, FUNCTIONS):
        owners = collections.defaultdict(set)
        for op, fn in table:
            owners[op].add(_where(fn))
        twice = {str(op): sorted(fns) for op, fns in owners.items() if len(fns) > 1}
        assert not twice, f"ops registered by more than one function: {twice}"


def test_an_op_is_lowered_or_decomposed_not_both():
    both = {str(op) for op, _ in LOWERINGS} & {str(op) for op, _ in DECOMPOSITIONS}
    assert not both, f"ops with both a lowering and a decomposition (the lowering wins): {both}"
