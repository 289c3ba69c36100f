"""from_torch / to_torch: zero copy through DLPack, and protection of the immutable side."""

import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torchlax_core
from torchlax_core.internal import COMPUTE_DTYPES
from torchlax_interop import (
    SharedMemoryWriteError,
    check_shared_writes,
    from_torch,
    jax_view,
    to_torch,
    torch_view,
)


@pytest.fixture(autouse=True)
def _no_pending_writes():
    yield
    try:
        check_shared_writes()
    except SharedMemoryWriteError:
        pass  # a test that provoked one and did not consume it must not leak it to the next


def _pointer(array: jax.Array) -> int:
    return array.unsafe_buffer_pointer()


# -- zero copy -------------------------------------------------------------------------------------


def test_from_torch_shares_memory():
    t = torch.arange(64, dtype=torch.float32)
    address = t.data_ptr()
    x = from_torch(t)
    assert isinstance(x, torchlax_core.Tensor)
    assert _pointer(x.jax()) == address
    np.testing.assert_array_equal(np.asarray(x.jax()), t.numpy())


def test_to_torch_shares_memory():
    array = jnp.arange(64, dtype=jnp.float32) * 2
    t = to_torch(array)
    assert type(t) is torch.Tensor and t.device.type == "cpu"
    assert t.data_ptr() == _pointer(array)
    x = torchlax_core.wrap(array)
    assert to_torch(x).data_ptr() == _pointer(array)


@pytest.mark.parametrize("dtype", COMPUTE_DTYPES)
def test_dtypes_round_trip_without_copy(dtype):
    t = (torch.arange(32) % 3).to(dtype)
    address = t.data_ptr()
    x = from_torch(t)
    assert x.dtype == dtype
    assert x.jax().dtype == torchlax_core.jax_dtype(dtype)  # int64 stays int64
    assert _pointer(x.jax()) == address
    back = to_torch(x)
    assert back.dtype == dtype and back.data_ptr() == address
    assert torch.equal(back, t)


def test_zero_dim_and_empty():
    scalar = from_torch(torch.tensor(2.5))
    assert scalar.shape == () and scalar.jax().shape == () and float(scalar.jax()) == 2.5
    empty = from_torch(torch.zeros(2, 0, 3, dtype=torch.int64))
    assert empty.shape == (2, 0, 3) and empty.dtype == torch.int64
    assert to_torch(empty).shape == (2, 0, 3)
    assert to_torch(jnp.asarray(True)).dtype == torch.bool


def test_transposed_tensor_is_shared():
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    address = base.data_ptr()
    x = from_torch(base.t())
    assert _pointer(x.jax()) == address  # DLPack carries the permuted layout
    np.testing.assert_array_equal(np.asarray(x.jax()), base.t().numpy())


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.arange(20.0)[::2],  # a stride DLPack cannot express for XLA
        lambda: torch.arange(3.0).expand(4, 3),  # broadcast (stride 0)
        lambda: torch.arange(6.0).reshape(2, 3)._neg_view(),  # negative bit
        lambda: torch.complex(torch.arange(3.0), torch.ones(3)).conj(),
    ],  # conjugate bit
    ids=["stepped", "expanded", "neg-bit", "conj-bit"],
)
def test_layouts_dlpack_cannot_share_are_copied_correctly(make):
    t = make()
    x = from_torch(t)
    np.testing.assert_array_equal(np.asarray(x.jax()), t.resolve_conj().resolve_neg().numpy())


# -- protection: the torch side writes ---------------------------------------------------------------


def test_write_to_promoted_tensor_does_not_change_jax_array():
    t = torch.arange(8, dtype=torch.float32)
    x = from_torch(t)
    t.add_(100)
    np.testing.assert_array_equal(np.asarray(x.jax()), np.arange(8, dtype=np.float32))
    assert t[0].item() == 100  # the torch tensor did change


def test_write_through_another_view_of_the_storage_does_not_change_jax_array():
    base = torch.zeros(4, 4)
    x = from_torch(base[1])
    base.fill_(7.0)
    base[1].mul_(3)
    np.testing.assert_array_equal(np.asarray(x.jax()), np.zeros(4, np.float32))


def test_repeated_promotion_keeps_every_array_valid():
    t = torch.arange(16, dtype=torch.float32)
    first = from_torch(t).jax()
    t.add_(1)
    second = from_torch(t).jax()
    t.add_(1)
    third = from_torch(t).jax()
    del t
    gc.collect()
    garbage = [torch.full((16,), -1.0) for _ in range(64)]  # reuse freed memory if any
    np.testing.assert_array_equal(np.asarray(first), np.arange(16))
    np.testing.assert_array_equal(np.asarray(second), np.arange(16) + 1)
    np.testing.assert_array_equal(np.asarray(third), np.arange(16) + 2)
    del garbage


def test_promoted_array_outlives_the_torch_tensor():
    t = torch.arange(1024, dtype=torch.float64)
    array = from_torch(t).jax()
    t.mul_(-1)  # moves t to its own buffer
    del t
    gc.collect()
    garbage = [torch.full((1024,), 5.0, dtype=torch.float64) for _ in range(32)]
    np.testing.assert_array_equal(np.asarray(array), np.arange(1024, dtype=np.float64))
    del garbage


def test_copy_true_shares_nothing():
    t = torch.arange(64, dtype=torch.float32)
    x = from_torch(t, copy=True)
    assert _pointer(x.jax()) != t.data_ptr()
    np.testing.assert_array_equal(np.asarray(x.jax()), t.numpy())


# -- protection: the tensor to_torch shared is written ---------------------------------------------


def test_write_to_shared_tensor_is_detected():
    x = torchlax_core.wrap(jnp.arange(6, dtype=jnp.float32))
    t = to_torch(x)
    t.mul_(2)
    with pytest.raises(SharedMemoryWriteError, match="to_torch.*modified in place.*copy=True"):
        from_torch(torch.ones(2))
    check_shared_writes()  # reported once


def test_to_torch_copy_true_may_be_written():
    array = jnp.arange(6, dtype=jnp.float32)
    t = to_torch(array, copy=True)
    assert t.data_ptr() != _pointer(array)
    t.mul_(2)
    check_shared_writes()
    np.testing.assert_array_equal(np.asarray(array), np.arange(6))


def test_round_trip_gives_back_the_same_array():
    array = jnp.arange(10, dtype=jnp.int64) if jax.config.jax_enable_x64 else jnp.arange(10)
    t = to_torch(array)
    assert from_torch(t).jax() is array


# -- autograd across the boundary -------------------------------------------------------------------


def test_gradients_flow_through_from_torch_and_to_torch():
    w = torch.randn(5, requires_grad=True)
    x = from_torch(w)
    assert x.requires_grad
    back = to_torch(x)
    (back * torch.arange(5.0)).sum().backward()
    torch.testing.assert_close(w.grad, torch.arange(5.0))


# -- pytrees ------------------------------------------------------------------------------------------


def test_jax_view_and_torch_view_convert_pytrees_without_copies():
    a, b = jnp.ones(3), jnp.zeros((2, 2), jnp.int32)
    tree = {"a": a, "rest": [b, 3, None], "t": (a,)}
    tensors = torch_view(tree)
    assert isinstance(tensors["a"], torchlax_core.Tensor)
    assert tensors["rest"][1] == 3 and tensors["rest"][2] is None
    arrays = jax_view(tensors)
    assert arrays["a"] is a and arrays["rest"][0] is b and arrays["t"][0] is a
    cpu = torch.arange(4.0)
    address = cpu.data_ptr()
    assert _pointer(jax_view({"cpu": cpu})["cpu"]) == address


def test_promoting_the_same_tensor_again_reuses_the_array():
    t = torch.arange(32, dtype=torch.float32)
    first = from_torch(t).jax()
    assert from_torch(t).jax() is first  # nothing written since: the same array, no copy
    t.add_(1)
    second = from_torch(t).jax()
    assert second is not first
    np.testing.assert_array_equal(np.asarray(second), np.arange(32) + 1)
    np.testing.assert_array_equal(np.asarray(first), np.arange(32))


def test_a_dropped_promotion_costs_nothing_later():
    t = torch.arange(32, dtype=torch.float32)
    address = t.data_ptr()
    from_torch(t)  # the array is dropped at once
    gc.collect()
    assert _pointer(from_torch(t).jax()) == address  # the buffer came back to torch, uncopied


def test_the_buffer_lives_as_long_as_a_jax_array_sharing_it():
    t = torch.arange(256, dtype=torch.float32)
    array = from_torch(t).jax()
    moved = jax.device_put(array, jax.devices()[0])  # a new array object on the same buffer
    del array
    t.mul_(0)
    del t
    gc.collect()
    garbage = [torch.full((256,), 9.0) for _ in range(32)]
    np.testing.assert_array_equal(np.asarray(moved), np.arange(256))
    del garbage


def test_sparse_tensor_is_a_clear_error():
    with pytest.raises(TypeError, match="to_dense"):
        from_torch(torch.ones(3).to_sparse())


def test_inference_tensors_and_parameters():
    with torch.inference_mode():
        t = torch.arange(4.0)
    assert float(from_torch(t).jax()[3]) == 3.0
    p = torch.nn.Parameter(torch.ones(3))
    with torch.no_grad():
        x = from_torch(p)
        assert not x.requires_grad
        p.add_(1)  # an optimizer step after promotion
    np.testing.assert_array_equal(np.asarray(x.jax()), np.ones(3))


def test_numpy_backed_tensor_is_copied_and_protected():
    n = np.arange(4.0)
    x = from_torch(torch.from_numpy(n))
    n[0] = 100.0  # memory torch does not own cannot be made copy-on-write: it was copied
    np.testing.assert_array_equal(np.asarray(x.jax()), np.arange(4.0))
