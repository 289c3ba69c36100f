"""CUDA tensors and JAX GPU arrays: device mapping, zero copy both ways, stream ordering."""

import statistics
import time

import gpu_support
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torchlax
import torchlax_core
from gpu_support import jax_gpu, pointer
from torchlax_dynamo._dlpack import torch_to_jax
from torchlax_interop import from_torch, to_torch

pytestmark = gpu_support.MARKS


# -- device mapping ----------------------------------------------------------------------------


def test_cuda_devices_map_to_the_jax_gpu_with_the_same_ordinal():
    env = torchlax.default_env()
    for index in range(min(torch.cuda.device_count(), len(jax.devices("gpu")))):
        assert env.placement(f"cuda:{index}") == jax_gpu(index)
    assert env.placement("cuda") == jax_gpu(torch.cuda.current_device())
    # torch.device("jax", i) follows JAX's own device list, whose default backend is the GPU.
    assert env.placement("jax:0") == jax.local_devices()[0]
    assert jax.local_devices()[0].platform == "gpu"


def test_factories_on_jax_land_on_the_gpu():
    with torchlax.enable():
        x = torch.arange(6.0, device="jax")
    assert x.jax().devices() == {jax_gpu(0)}
    np.testing.assert_array_equal(np.asarray(x.jax()), np.arange(6.0))


def test_cuda_tensor_next_to_a_jax_tensor_is_an_error_naming_both_devices():
    with torchlax.enable():
        x = torch.ones(3, device="jax")
        c = torch.ones(3, device="cuda")
        for fn in (lambda: x + c, lambda: c + x, lambda: torch.mul(x, c)):
            with pytest.raises(torchlax.DeviceMismatchError, match=r"cuda:0.*device jax"):
                fn()
        # Promoting explicitly is how the two combine: same GPU, no copy.
        out = x + from_torch(c)
    assert out.jax().devices() == {jax_gpu(0)}
    torch.testing.assert_close(to_torch(out), torch.full((3,), 2.0, device="cuda"))


# -- zero copy -------------------------------------------------------------------------------


def test_from_torch_shares_gpu_memory():
    t = torch.randn(256, 33, device="cuda")
    address = t.data_ptr()  # before promotion: afterwards data_ptr() is a write (copy-on-write)
    x = from_torch(t)
    assert x.jax().devices() == {jax_gpu(0)}
    assert pointer(x.jax()) == address
    torch.testing.assert_close(torch.from_numpy(np.asarray(x.jax())), t.cpu(), rtol=0, atol=0)


def test_to_torch_shares_gpu_memory():
    array = jax.device_put(jnp.arange(1000, dtype=jnp.float32), jax_gpu(0)) * 3
    t = to_torch(array)
    assert type(t) is torch.Tensor and t.device == torch.device("cuda", 0)
    assert t.data_ptr() == pointer(array)
    torch.testing.assert_close(t.cpu(), torch.arange(1000, dtype=torch.float32) * 3)
    # A round trip gives back the very array.
    assert from_torch(t).jax() is array


@pytest.mark.parametrize("dtype", [torch.bool, torch.int64, torch.bfloat16, torch.float64])
def test_gpu_dtypes_round_trip_without_copy(dtype):
    t = (torch.arange(24, device="cuda") % 5).to(dtype)
    address = t.data_ptr()
    x = from_torch(t)
    assert pointer(x.jax()) == address
    back = to_torch(x)
    assert back.dtype == dtype and back.device.type == "cuda" and back.data_ptr() == address
    assert torch.equal(back, t)


def test_promoted_cuda_tensor_is_copy_on_write():
    t = torch.arange(8.0, device="cuda")
    x = from_torch(t)
    t.add_(100)  # torch moves t to a private copy first; the JAX array keeps its value
    np.testing.assert_array_equal(np.asarray(x.jax()), np.arange(8.0))
    assert torch.equal(t.cpu(), torch.arange(8.0) + 100)


def test_dynamo_promotion_shares_gpu_memory():
    t = torch.randn(64, 64, device="cuda")
    array = torch_to_jax(t)
    assert array.devices() == {jax_gpu(0)}
    assert pointer(array) == t.data_ptr()
    np.testing.assert_array_equal(np.asarray(array), t.cpu().numpy())


def _median_seconds(fn, repeats=7):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def test_a_1_gib_promotion_costs_what_a_1_kib_one_costs():
    def promote(numel):
        def run():
            t = torch.empty(numel, device="cuda")
            address = t.data_ptr()
            torch.cuda.synchronize()
            start = time.perf_counter()
            x = from_torch(t).jax().block_until_ready()
            elapsed = time.perf_counter() - start
            assert pointer(x) == address, "the promotion copied"
            return elapsed

        from_torch(torch.empty(numel, device="cuda"))  # warm up this size once
        return statistics.median(run() for _ in range(7))

    small = promote(256)  # 1 KiB of float32
    big = promote(1 << 28)  # 1 GiB of float32
    # A copy of 1 GiB moves 2 GiB through HBM: at least ~0.4 ms even on an H200.
    assert big < 2 * small + 1e-4, f"1 KiB: {small * 1e6:.0f} us, 1 GiB: {big * 1e6:.0f} us"
    big_out = jnp.zeros(1 << 28, jnp.float32, device=jax_gpu(0)).block_until_ready()
    small_out = jnp.zeros(256, jnp.float32, device=jax_gpu(0)).block_until_ready()
    small_back = _median_seconds(lambda: to_torch(small_out))
    big_back = _median_seconds(lambda: to_torch(big_out))
    assert big_back < 2 * small_back + 1e-4, (
        f"to_torch 1 KiB: {small_back * 1e6:.0f} us, 1 GiB: {big_back * 1e6:.0f} us"
    )


# -- streams ---------------------------------------------------------------------------------


def _slow_product(a, rounds=20):
    # A queue of 20 matmuls of 4096x4096 (~3 TFLOP): milliseconds of GPU work behind the host.
    b = a
    for _ in range(rounds):
        b = b @ a
    return b


def _square(seed):
    # Singular values in [0, 2]: twenty products grow by at most 2**20, well inside float32.
    g = torch.Generator("cuda").manual_seed(seed)
    return torch.randn(4096, 4096, device="cuda", generator=g) / 64


def test_from_torch_waits_for_the_producing_stream():
    a = _square(0)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        b = _slow_product(a)
        x = from_torch(b)  # the host runs ahead: b's kernels are still queued on `side`
        seen = np.asarray(x.jax())  # read by JAX on its own stream
        c = _slow_product(a)
        seen_dynamo = np.asarray(torch_to_jax(c))  # the Dynamo backend's promotion as well
        expected, expected_dynamo = b.cpu().numpy(), c.cpu().numpy()
    # Same memory, so equal bits: anything else means JAX read before torch had written.
    np.testing.assert_array_equal(seen, expected)
    np.testing.assert_array_equal(seen_dynamo, expected_dynamo)


def test_to_torch_waits_for_the_jax_computation():
    a = jax.device_put(jnp.asarray(_square(1).cpu().numpy()), jax_gpu(0)).block_until_ready()

    @jax.jit
    def slow(a):
        return jax.lax.fori_loop(0, 20, lambda _, b: b @ a, a)

    result = slow(a)  # dispatched asynchronously
    t = to_torch(result)  # torch's current stream waits for XLA before its own kernels
    seen = t.cpu().numpy()  # read by torch on its stream
    np.testing.assert_array_equal(seen, np.asarray(result))


def test_jax_tensor_moves_to_cpu_and_cuda():
    with torchlax.enable():
        x = torch.arange(4.0, device="jax") * 2
        assert isinstance(x, torchlax_core.Tensor)
        assert torch.equal(x.cpu(), torch.arange(4.0) * 2)
        assert torch.equal(x.to("cuda"), torch.arange(4.0, device="cuda") * 2)
