"""Ops run outside ``torchlax.enable()`` (JAX's 64-bit mode off) keep int64/float64 data exact.

Models are built inside ``enable()`` and then called outside it; every op must still compute
in 64 bits. Before the fix, ``copy_`` and writes through a slice narrowed the data to 32 bits
(batch norm's running statistics in float64 drifted by ~1e-8, int64 values above 2**32 were lost).
"""

from __future__ import annotations

import copy

import jax
import pytest
import torch
import torchlax_core
from eager_compare import to_jax


@pytest.fixture(autouse=True)
def _x64_off():
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", False)
    yield
    assert not jax.config.jax_enable_x64, "an op left JAX's 64-bit mode on"
    jax.config.update("jax_enable_x64", before)


def _exact(actual, expected, tol=0.0):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert str(actual.jax().dtype) == str(expected.dtype).replace("torch.", "")
    torch.testing.assert_close(actual.cpu(), expected, rtol=tol, atol=tol)


def test_copy_keeps_float64():
    src = torch.tensor([1 / 3, 2 / 7, 1e-300], dtype=torch.float64)
    dst = to_jax(torch.zeros(3, dtype=torch.float64))
    dst.copy_(to_jax(src))
    _exact(dst, src)
    dst.copy_(src)  # from a CPU tensor
    _exact(dst, src)


def test_copy_keeps_int64():
    src = torch.tensor([2**40 + 1, -(2**50), 7])
    dst = to_jax(torch.zeros(3, dtype=torch.int64))
    dst.copy_(to_jax(src))
    _exact(dst, src)


def test_write_through_slice_keeps_int64_root():
    cpu = torch.tensor([2**40, 3, 5, 2**62])
    jx = to_jax(cpu)
    cpu[1:3] += 1
    jx[1:3] += 1
    _exact(jx, cpu)


def test_write_through_slice_keeps_float64_root():
    cpu = torch.tensor([1 / 3, 1 / 7, 1 / 11, 1 / 13], dtype=torch.float64)
    jx = to_jax(cpu)
    cpu[::2].mul_(1 / 3)
    jx[::2].mul_(1 / 3)
    _exact(jx, cpu)


def test_batch_norm_running_stats_float64_match_exactly():
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm2d(8).double().train()
    x = torch.randn(2, 8, 2, 2, dtype=torch.float64)
    with torchlax_core.enable():
        jbn = copy.deepcopy(bn).to("jax")
    with torch.no_grad():
        bn(x)
        jbn(to_jax(x))
    jax_buffers = dict(jbn.named_buffers())
    for name, expected in bn.named_buffers():
        _exact(jax_buffers[name], expected, tol=1e-15)


def test_environment_dispatch_runs_ops_in_64_bit_mode_and_raises_their_errors():
    # Environment.dispatch (compiled programs, export) goes through run_op like every other
    # entry point: 64-bit mode on for the op, and errors raised to the Python caller.
    env = torchlax_core.default_env()
    big = torch.tensor([2**31 + 5, -(2**31) - 1, 7], dtype=torch.int64)  # squares fit in 64 bits
    x = to_jax(big)
    for _ in range(3):  # plainly, then compiled by the op cache, then a cache hit
        _exact(env.dispatch(torch.ops.aten.mul.Tensor, (x, x), {}), big * big)
        _exact(env.dispatch(torch.ops.aten.mul.Tensor, (x, 3), {}), big * 3)
    bare = torchlax_core.Environment(autoload=False)  # the core's built-ins only: no mul
    with pytest.raises(torchlax_core.OpNotLoweredError, match="aten.mul.Tensor"):
        bare.dispatch(torch.ops.aten.mul.Tensor, (x, x), {})
