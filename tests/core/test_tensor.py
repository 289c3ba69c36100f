"""torchlax.Tensor basics: wrapping, metadata, conversions, dtypes, devices, enable()."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torchlax_core
from torchlax_core import DeviceMismatchError, Tensor, UnsupportedDtypeError
from torchlax_core.internal import COMPUTE_DTYPES, DTYPES, scalar_type_name

ALL_DTYPES = [*COMPUTE_DTYPES, torch.float8_e4m3fn, torch.float8_e5m2]


def cpu_sample(dtype):
    base = torch.tensor([[0, 1, 2], [3, 4, 5]])
    if dtype == torch.bool:
        return base % 2 == 0
    if dtype.is_complex:
        return (base + 1j * base).to(dtype)
    return base.to(dtype)


def test_wrap_and_jax_share_the_array():
    array = jnp.arange(6.0).reshape(2, 3)
    t = torchlax_core.wrap(array)
    assert isinstance(t, Tensor) and isinstance(t, torch.Tensor)
    assert t.jax() is array and torchlax_core.unwrap(t) is array
    assert t.shape == torch.Size([2, 3]) and t.dtype == torch.float32
    assert t.device == torch.device("jax", 0) and str(t.device) == "jax:0"
    assert t.dim() == 2 and t.numel() == 6 and not t.requires_grad


def test_wrap_rejects_non_arrays():
    with pytest.raises(TypeError, match="torchlax.from_torch"):
        torchlax_core.wrap(torch.ones(2))


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_dtype_round_trip_is_exact(dtype):
    cpu = cpu_sample(dtype)
    with torchlax_core.enable():
        t = cpu.to("jax")
    assert isinstance(t, Tensor) and t.dtype == dtype
    assert t.jax().dtype == torchlax_core.jax_dtype(dtype)
    back = t.cpu()
    assert back.device.type == "cpu" and back.dtype == dtype
    assert (
        torch.equal(back.view(torch.uint8), cpu.view(torch.uint8))
        if dtype.itemsize == 1
        else torch.equal(back, cpu)
    )


def test_int64_and_float64_are_not_narrowed_and_plain_jax_is_untouched():
    with torchlax_core.enable():
        t = torch.tensor([2**40, -3], dtype=torch.int64).to("jax")
        d = torch.tensor([1e-300], dtype=torch.float64).to("jax")
    assert t.jax().dtype == jnp.int64 and t.tolist() == [2**40, -3]
    assert d.jax().dtype == jnp.float64 and d.item() == 1e-300
    # Plain JAX outside torchlax keeps its own (32-bit by default) behaviour.
    assert jnp.arange(3).dtype == (jnp.int64 if jax.config.jax_enable_x64 else jnp.int32)


def test_unrepresentable_dtype_raises_clearly():
    with pytest.raises(UnsupportedDtypeError, match="complex32"):
        torchlax_core.jax_dtype(torch.complex32)
    with torchlax_core.enable(), pytest.raises(UnsupportedDtypeError, match="complex32"):
        torch.zeros(2, dtype=torch.complex32).to("jax")


@pytest.mark.parametrize("dtype", [*DTYPES, torch.complex32], ids=str)
def test_scalar_type_name_is_pytorchs(dtype):
    # The one map behind every error message that names a dtype in PyTorch's words; PyTorch's
    # legacy tensor type names (torch.LongTensor) use the same ScalarType names.
    with warnings.catch_warnings():  # (complex32 is experimental in PyTorch)
        warnings.simplefilter("ignore")
        expected = torch.empty(0, dtype=dtype).type().removeprefix("torch.")
    assert scalar_type_name(dtype) + "Tensor" == expected
    if dtype in DTYPES:  # JAX dtypes and arrays are named by their torch dtype's name
        jax_type = torchlax_core.jax_dtype(dtype)
        assert scalar_type_name(jax_type) == scalar_type_name(dtype)
        with torchlax_core.enable():  # (64-bit mode: int64 arrays stay int64)
            array = jnp.zeros(1, jax_type)
        assert scalar_type_name(array) == scalar_type_name(dtype)


def test_conversions_behave_as_pytorch():
    cpu = torch.tensor([[1.5, -2.0], [3.0, 4.25]])
    with torchlax_core.enable():
        t = cpu.to("jax")
    np.testing.assert_array_equal(t.numpy(), cpu.numpy())
    assert t.tolist() == cpu.tolist()
    assert torchlax_core.wrap(jnp.asarray(7.5)).item() == 7.5
    assert torch.equal(t.cpu(), cpu) and torch.equal(t.to("cpu"), cpu)
    assert t.to(torch.float64).dtype == torch.float64 and isinstance(t.to(torch.float64), Tensor)
    with pytest.raises(RuntimeError, match="cannot be converted to Scalar"):
        t.item()


def test_numpy_refuses_tensors_that_require_grad_like_pytorch():
    t = torchlax_core.wrap(jnp.ones(2), requires_grad=True)
    with pytest.raises(RuntimeError, match="detach"):
        t.numpy()
    assert t.detach().numpy().tolist() == [1.0, 1.0]


def test_repr_looks_like_pytorch():
    t = torchlax_core.wrap(jnp.asarray([1.0, 2.0]))
    assert repr(t) == "tensor([1., 2.], device='jax:0')"
    r = torchlax_core.wrap(jnp.asarray([1.0]), requires_grad=True)
    assert repr(r) == "tensor([1.], device='jax:0', requires_grad=True)"
    i = torchlax_core.wrap(jnp.asarray([1, 2], dtype=jnp.int32))
    assert repr(i) == "tensor([1, 2], device='jax:0', dtype=torch.int32)"


def test_repr_under_tracing_names_shape_and_dtype():
    seen = []

    def f(x):
        seen.append(repr(torchlax_core.wrap(x)))
        return x

    jax.jit(f)(jnp.ones((2, 3)))
    assert seen == ["torchlax.Tensor(<traced>, shape=(2, 3), dtype=torch.float32, device='jax:0')"]


def test_factories_on_the_jax_device_make_torchlax_tensors():
    # Models create tensors on their inputs' device (torch.arange(n, device=x.device)), so
    # device="jax" works wherever torchlax is imported; enable() scopes the environment.
    assert isinstance(torch.zeros(2, device="jax"), Tensor)
    with torchlax_core.enable():
        cases = {
            "randn": torch.randn(2, 3, device="jax"),
            "arange": torch.arange(5, device="jax"),
            "zeros": torch.zeros(2, device="jax"),
            "tensor": torch.tensor([1, 2], device="jax"),
            "empty": torch.empty(3, device="jax"),
        }
        cpu_still = torch.ones(2) + 1
    assert all(isinstance(t, Tensor) for t in cases.values())
    assert cases["arange"].dtype == torch.int64 and cases["arange"].tolist() == [0, 1, 2, 3, 4]
    assert cases["randn"].shape == (2, 3) and cases["randn"].dtype == torch.float32
    assert cases["tensor"].dtype == torch.int64
    assert type(cpu_still) is torch.Tensor and cpu_still.device.type == "cpu"


def test_enable_globally_and_disable():
    before = jax.config.jax_enable_x64
    try:
        torchlax_core.enable_globally()
        assert torchlax_core.is_enabled() and jax.config.jax_enable_x64
        assert isinstance(torch.ones(1, device="jax"), Tensor)
    finally:
        torchlax_core.disable_globally()
    assert not torchlax_core.is_enabled() and jax.config.jax_enable_x64 == before


def test_module_to_jax_and_back():
    model = torch.nn.Linear(3, 2)
    with torchlax_core.enable():
        model.to("jax")
    assert isinstance(model.weight, Tensor) and isinstance(model.weight, torch.nn.Parameter)
    assert model.weight.requires_grad and model.weight.device == torch.device("jax", 0)
    model.to("cpu")
    assert type(model.weight) is torch.nn.Parameter and model.weight.device.type == "cpu"


def test_device_index_follows_the_array():
    t = torchlax_core.wrap(jax.device_put(jnp.ones(2), jax.devices()[-1]))
    assert t.device == torch.device("jax", jax.devices()[-1].id)
    with pytest.raises(ValueError, match="does not exist"):
        torchlax_core.default_env().placement(f"jax:{len(jax.devices())}")


def test_mixing_with_cpu_tensors_follows_pytorch():
    t = torchlax_core.wrap(jnp.asarray([1.0, 2.0]))
    out = t + torch.tensor(2.0, dtype=torch.float64)  # 0-d CPU tensor acts as a scalar
    assert isinstance(out, Tensor) and out.dtype == torch.float32 and out.tolist() == [3.0, 4.0]
    with pytest.raises(DeviceMismatchError) as info:
        t + torch.ones(2)
    message = str(info.value)
    assert "aten.add.Tensor" in message and "'other'" in message and "cpu" in message


def test_cpu_index_tensors_index_torchlax_tensors_as_in_pytorch():
    cpu = torch.arange(12.0).reshape(3, 4)
    index = torch.tensor([2, 0])
    mask = torch.tensor([True, False, True])
    t = torchlax_core.wrap(jnp.asarray(cpu.numpy()))
    assert torch.equal(t[index].cpu(), cpu[index]) and torch.equal(t[mask].cpu(), cpu[mask])
    t[index] = torchlax_core.wrap(jnp.zeros(4))
    cpu[index] = 0.0
    assert torch.equal(t.cpu(), cpu)
    with pytest.raises(DeviceMismatchError, match="aten.index_select.default"):
        torch.index_select(t, 0, index)  # PyTorch too wants this index on the tensor's device
