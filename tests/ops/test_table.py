"""The ops package's own tables: each op has exactly one lowering or decomposition."""

from __future__ import annotations

import collections
import inspect
import traceback

import jax.numpy as jnp
import pytest
import torch
import torchlax_ops._plugin  # noqa: F401  (fills the tables)
from torchlax_ops._table import DECOMPOSITIONS, FUNCTIONS, LOWERINGS, NAMED


def _where(fn):
    return f"{fn.__module__}.{fn.__qualname__}"


def test_no_op_is_registered_twice():
    for table in (LOWERINGS, DECOMPOSITIONS, FUNCTIONS):
        owners = collections.defaultdict(set)
        for op, fn in table:
            owners[op].add(_where(fn))
        twice = {str(op): sorted(fns) for op, fns in owners.items() if len(fns) > 1}
        assert not twice, f"ops registered by more than one function: {twice}"


# A composite op may have both on purpose: the decomposition replaces PyTorch's composite at the
# jax device's autograd key (core register_composite_overrides), the lowering serves graphs that
# keep the op whole (export, dynamo), where the lowering wins.
_BOTH_ON_PURPOSE = {
    # decomposition: the overrideable fused op (autograd records one node); lowering: graphs.
    "aten.scaled_dot_product_attention.default",
}


def test_an_op_is_lowered_or_decomposed_not_both():
    both = {str(op) for op, _ in LOWERINGS} & {str(op) for op, _ in DECOMPOSITIONS}
    both -= _BOTH_ON_PURPOSE
    assert not both, f"ops with both a lowering and a decomposition (the lowering wins): {both}"


def test_every_lowering_is_a_named_function_of_its_module():
    # A traceback and the table name the op: no lambdas, no factory-local names (a factory
    # renames what it makes with ``_table.named``), and the code object carries the name too,
    # since tracebacks print the code's name.
    entries = [*LOWERINGS, *DECOMPOSITIONS, *((name, fn) for name, (_, fn) in NAMED.items())]
    unnamed = {}
    for op, fn in entries:
        if fn.__module__.startswith(("torch._decomp", "torch._refs")):
            continue  # PyTorch's own decompositions, listed in _decompositions.py
        module_ok = fn.__module__.startswith("torchlax_ops._lowerings.")
        name_ok = fn.__name__.isidentifier() and "<" not in fn.__qualname__
        code_ok = inspect.unwrap(fn).__code__.co_name == fn.__name__  # (under @elementwise)
        if not (module_ok and name_ok and code_ok):
            code = inspect.unwrap(fn).__code__.co_name
            unnamed[str(op)] = f"{fn.__module__}.{fn.__qualname__} (code: {code})"
    assert not unnamed, f"lowerings without a name of their own: {unnamed}"
    assert len(entries) > 800  # the walk saw the whole table


def test_a_traceback_names_the_op_of_a_factory_made_lowering():
    lowered = dict(LOWERINGS)
    eq = lowered[torch.ops.aten.eq.Tensor]
    with pytest.raises(TypeError, match="shapes") as raised:
        eq(jnp.zeros(2), jnp.zeros(3))  # fails inside the lowering's body
    frames = [frame.name for frame in traceback.extract_tb(raised.tb)]
    assert "eq" in frames, frames


def test_where_names_the_file_and_line_of_an_ops_lowering():
    from torchlax_ops._table import where

    (found,) = where("aten.add.Tensor")
    path, _, rest = found.partition(":")
    assert path.endswith("_lowerings/elementwise.py") and rest.split()[1:] == ["add", "(lowering)"]
    line = int(rest.split()[0])
    assert open(path).read().splitlines()[line - 1].startswith("@lowering(aten.add.Tensor")
    assert any("sum_dim" in entry for entry in where(torch.ops.aten.sum))  # a packet: overloads
    (derived,) = where("aten.add_.Tensor")  # derived by the core from add.Tensor
    assert derived == f"{found} (derived: aten.add_.Tensor from it)"


def test_the_files_named_in_where_to_find_an_op_exist():
    import pathlib
    import re

    root = pathlib.Path(__file__).parents[2]
    text = (root / "docs" / "architecture.md").read_text()
    section = text.split("## Where to find an op")[1].split("\n## ")[0]
    lowerings = root / "packages/ops/src/torchlax_ops/_lowerings"
    named = set(re.findall(r"`([\w./]+\.py)`", section))
    missing = []
    for name in named:
        if "/" in name:  # a path from the repository root
            candidates = [root / name]
        else:  # a lowering family, a test, or a module of torchlax_ops
            candidates = [lowerings / name, root / "tests/ops" / name, lowerings.parent / name]
        if not any(path.exists() for path in candidates):
            missing.append(name)
    assert len(named) > 30 and not missing, missing


def test_where_points_a_derived_overload_at_its_functional_lowering():
    from torchlax_ops._table import where

    (entry,) = where("aten.index_put_")
    assert "indexing.py" in entry and "index_put (lowering) (derived" in entry, entry
    assert all("derived" in e for e in where("aten.add.out")) and where("aten.add.out")
