"""Host data put on the jax device (``torch.tensor(..., device="jax")``, ``.to("jax")``,
``torch.empty``): ``_host_put.put`` makes the array ``jax.device_put`` makes, each result a new
buffer that neither its source nor another tensor shares."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torchlax_core
from torchlax_core import _host_put

SHAPES = [(), (0,), (3,), (2, 0, 3), (4, 5)]
DTYPES = [np.float32, np.float64, np.int64, np.int8, np.bool_, np.complex128, jnp.bfloat16]


def _host(shape, dtype) -> np.ndarray:
    return (np.arange(math.prod(shape)) % 3 + 1).astype(dtype).reshape(shape)


def _same_array(got, expected, host) -> None:
    assert got.aval == expected.aval  # shape, dtype, weak_type
    assert got.committed == expected.committed
    assert got.sharding == expected.sharding
    np.testing.assert_array_equal(np.asarray(got), host)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_put_makes_the_array_device_put_makes(dtype):
    for shape in SHAPES:
        host = _host(shape, dtype)
        with torchlax_core.enable():  # 64-bit mode, as torchlax runs: int64/float64 kept
            expected = jax.device_put(host)
        _same_array(_host_put.put(host.copy()), expected, host)
        # JAX's default device by name is still uncommitted
        _same_array(_host_put.put(host.copy(), jax.devices()[0]), expected, host)


def test_put_on_a_named_device_commits_as_device_put(monkeypatch):
    device = jax.devices()[0]
    host = _host((2, 3), np.int64)
    with torchlax_core.enable():
        expected = jax.device_put(host, device)
    assert expected.committed
    # (one device here: another default makes jax:0 a named, non-default device)
    monkeypatch.setattr(_host_put, "get_default_device", lambda: None)
    _same_array(_host_put.put(host.copy(), device), expected, host)


def test_put_falls_back_to_device_put_without_the_runtime_call(monkeypatch):
    monkeypatch.setattr(_host_put, "_batched_device_put", None)
    host = _host((3,), np.int64)
    with torchlax_core.enable():
        expected = jax.device_put(host)
    _same_array(_host_put.put(host.copy()), expected, host)


def test_64_bit_data_kept_outside_enable():
    # the jax device works outside torchlax.enable(), where JAX's 64-bit mode is off
    big = torch.tensor([2**40 + 1, -3])
    tiny = torch.tensor([1e-300, 2.5], dtype=torch.float64)
    for source in (big, tiny):
        moved = source.to("jax")
        assert moved.dtype == source.dtype
        assert torch.equal(moved.cpu(), source)
    made = torch.tensor([2**40 + 1], device="jax")
    assert made.dtype == torch.int64 and made.cpu().item() == 2**40 + 1


def test_moved_data_does_not_follow_later_writes_to_its_source():
    # On a CPU device the runtime may keep a host buffer as the array's (zero-copy): the
    # source's own memory must never be that buffer.
    source = torch.arange(6.0).reshape(2, 3)
    moved = source.to("jax")
    source.add_(100)
    assert torch.equal(moved.cpu(), torch.arange(6.0).reshape(2, 3))


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.tensor([], device="jax"),
        lambda: torch.tensor([1.0, 2.0], device="jax"),
        lambda: torch.empty(0, device="jax"),
        lambda: torch.empty(3, device="jax"),
        lambda: torch.empty((2, 0), dtype=torch.int64, device="jax"),
        lambda: torch.zeros(0).to("jax"),
    ],
    ids=["tensor_empty", "tensor_data", "empty_0", "empty_3", "empty_2x0_int64", "to_empty"],
)
def test_small_factories_make_new_unshared_tensors(make):
    with torchlax_core.enable():
        a, b = make(), make()
        assert a.device == torch.device("jax", 0)
        assert torchlax_core.unwrap(a) is not torchlax_core.unwrap(b)
        before = b.cpu().clone()
        a.add_(1)  # an in-place op on one leaves the other as it was
        a.resize_(4).fill_(7)
        assert torch.equal(b.cpu(), before)
        assert torch.equal(a.cpu(), torch.full((4,), 7, dtype=a.dtype))


@pytest.mark.parametrize("size", [(0,), (3,), (2, 0), (1024,), (1025,), (64, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_empty_has_the_shape_dtype_and_strides_of_pytorch(size, dtype):
    # (4096 bytes and below are made on the host, above by XLA: both sides of the threshold)
    expected = torch.empty(size, dtype=dtype)
    with torchlax_core.enable():
        got = torch.empty(size, dtype=dtype, device="jax")
    assert got.shape == expected.shape and got.dtype == expected.dtype
    assert got.stride() == expected.stride()
    assert torch.equal(got.cpu(), torch.zeros(size, dtype=dtype))  # XLA has no uninitialised memory
