"""Checked mode: under ``torchlax.jit`` and ``torch.compile`` the bad values of
``test_bad_input`` raise what eager PyTorch raises, after the call."""

from __future__ import annotations

import pytest
import torch
import torchlax
import torchlax_core
from test_bad_input import BAD_VALUES, _error, to_jax

# One case of each op (their negative-index twins share the check); each compiles a program.
JITTED = ("index_select", "gather", "take", "getitem", "setitem", "index_put_accumulate",
          "index_add", "index_copy", "index_fill", "scatter_value", "scatter_add", "put_",
          "embedding", "cross_entropy_2d", "nll_loss", "one_hot", "multinomial_nan", "remainder",
          "floor_divide", "div_trunc", "mm_int_float", "addmm")
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
                fn, *args), name
    finally:
        torch._dynamo.reset()
