"""Factories given bad sizes on the jax device raise what eager CPU PyTorch raises, at once.

A factory that JAX refuses used to be asked again with ``device="jax"`` for PyTorch's error,
which sent the question back into torchlax, without end (``torch.eye(-2, device="jax")`` hung).
Each case runs under a timeout of its own (the thread method: a hang inside PyTorch's dispatcher
ignores a signal), so a hang fails instead of stalling the run.
"""

from __future__ import annotations

import pytest
import torch
import torchlax_core

# (id, factory of a device): each raises on eager PyTorch's CPU.
BAD_SIZES = [
    ("empty", lambda d: torch.empty(2, -3, device=d)),
    ("zeros", lambda d: torch.zeros(-1, device=d)),
    ("ones", lambda d: torch.ones((-2,), device=d)),
    ("full", lambda d: torch.full((2, -1), 1.5, device=d)),
    ("empty_strided_size", lambda d: torch.empty_strided((-2,), (1,), device=d)),
    ("empty_strided_stride", lambda d: torch.empty_strided((2, 3), (3, -1), device=d)),
    ("rand", lambda d: torch.rand(-1, device=d)),
    ("randn", lambda d: torch.randn(-3, device=d)),
    ("normal", lambda d: torch.normal(0.0, 1.0, (-1,), device=d)),
    ("randint", lambda d: torch.randint(0, 5, (-1,), device=d)),
    ("randint_high", lambda d: torch.randint(-2, (3,), device=d)),
    ("randint_empty_range", lambda d: torch.randint(5, 0, (3,), device=d)),
    ("randperm", lambda d: torch.randperm(-1, device=d)),
    ("eye", lambda d: torch.eye(-2, device=d)),
    ("eye_columns", lambda d: torch.eye(3, -1, device=d)),
    ("arange_zero_step", lambda d: torch.arange(0, 5, 0, device=d)),
    ("arange_wrong_sign", lambda d: torch.arange(5, 0, 1, device=d)),
    ("arange_nan", lambda d: torch.arange(0, float("nan"), device=d)),
    ("arange_inf", lambda d: torch.arange(0, float("inf"), device=d)),
    ("arange_minus_inf", lambda d: torch.arange(float("-inf"), 5, device=d)),
    ("linspace", lambda d: torch.linspace(0, 1, -1, device=d)),
    ("logspace", lambda d: torch.logspace(0, 1, -1, device=d)),
    ("tril_indices_row", lambda d: torch.tril_indices(-1, 3, device=d)),
    ("tril_indices_col", lambda d: torch.tril_indices(3, -1, device=d)),
    ("triu_indices_row", lambda d: torch.triu_indices(-1, 3, device=d)),
    ("triu_indices_col", lambda d: torch.triu_indices(3, -2, device=d)),
    ("hann_window", lambda d: torch.hann_window(-1, device=d)),
    ("new_ones", lambda d: torch.empty(2, device=d).new_ones((3, -1))),
    ("overflow", lambda d: torch.zeros(2**62, 2**62, device=d)),
]


@pytest.mark.timeout(120, method="thread")  # a hang ends the worker: a failure
@pytest.mark.parametrize("factory", [f for _, f in BAD_SIZES], ids=[n for n, _ in BAD_SIZES])
def test_bad_size_raises_as_on_cpu(factory):
    with pytest.raises(Exception) as on_cpu:
        factory("cpu")
    with torchlax_core.enable(), pytest.raises(Exception) as on_jax:
        factory("jax")
    assert type(on_jax.value) is type(on_cpu.value), (on_jax.value, on_cpu.value)


@pytest.mark.timeout(120, method="thread")  # a hang ends the worker: a failure
def test_bad_size_error_names_the_dimension():
    with torchlax_core.enable(), pytest.raises(RuntimeError, match="negative dimension -3"):
        torch.randn(-3, device="jax")
