"""Checked mode: under ``torchlax.jit`` and ``torch.compile`` the bad values of
``test_bad_input`` raise what eager PyTorch raises, after the call."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import torchlax
import torchlax_core
from test_bad_input import BAD_VALUES, _error, to_jax

# One case of each op (their negative-index twins share the check); each compiles a program.
JITTED = (
    "index_select",
    "gather",
    "take",
    "getitem",
    "setitem",
    "index_put_accumulate",
    "index_add",
    "index_copy",
    "index_fill",
    "scatter_value",
    "scatter_add",
    "put_",
    "embedding",
    "cross_entropy_2d",
    "nll_loss",
    "one_hot",
    "multinomial_nan",
    "remainder",
    "floor_divide",
    "div_trunc",
    "mm_int_float",
    "addmm",
)
# bincount's output shape depends on the values: traced, it raises DataDependentShapeError.


@pytest.fixture
def checked_env():
    env = torchlax_core.default_env()
    before = env.config.checked
    env.config.checked = True
    try:
        with torchlax_core.enable(env):
            yield env
    finally:
        env.config.checked = before


def test_every_bad_value_raises_under_torchlax_jit_in_checked_mode(checked_env):
    cases = {name: (fn, args) for name, fn, args in BAD_VALUES}
    wrong = []
    for name in JITTED:
        fn, args = cases[name]
        expected = _error(fn, *args)
        got = _error(torchlax.jit(fn), *to_jax(args))
        if got != expected:
            wrong.append((name, expected, got))
    assert not wrong


# One op of each family (index read, index write, loss target, integer division): Dynamo and
# the backend run the same checked program builder for all.
COMPILED = ("take", "scatter_add", "cross_entropy", "remainder")


def test_bad_values_raise_under_torch_compile_in_checked_mode(checked_env):
    cases = {name: (fn, args) for name, fn, args in BAD_VALUES}
    try:
        for name in COMPILED:
            fn, args = cases[name]
            torch._dynamo.reset()
            assert _error(torch.compile(fn, backend="torchlax"), *to_jax(args)) == _error(
                fn, *args
            ), name
    finally:
        torch._dynamo.reset()


def _compiled_one_hot():
    torch._dynamo.reset()
    return torch.compile(lambda t: F.one_hot(t, 3), backend="torchlax")


def test_one_hot_compiles_for_valid_classes(checked_env):
    # Dynamo's shape propagation runs the decomposition on fake tensors, which hold no values
    # to check (it used to fail there with "'FakeTensor' object has no attribute 'jax'").
    try:
        got = _compiled_one_hot()(torch.tensor([0, 2], device="jax")).cpu()
    finally:
        torch._dynamo.reset()
    assert torch.equal(got, F.one_hot(torch.tensor([0, 2]), 3))


@pytest.mark.parametrize(
    "classes, message",
    [([0, 5], "smaller than num_classes"), ([-1, 0], "non-negative")],
    ids=["too-large", "negative"],
)
def test_one_hot_out_of_range_raises_under_torch_compile(checked_env, classes, message):
    # aten.one_hot is composite: its torchlax decomposition puts the range checks into the graph
    # as assertions when it is traced with fake tensors.
    try:
        with pytest.raises(RuntimeError, match=f"Class values must be {message}"):
            _compiled_one_hot()(torch.tensor(classes, device="jax"))
    finally:
        torch._dynamo.reset()
