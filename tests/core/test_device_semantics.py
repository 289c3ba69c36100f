"""The ``jax`` device answers as a PyTorch device: factory dtypes from the first call of a
process on, 64-bit buffers, the default dtype, empty tensors and ``out=`` resizing."""

from __future__ import annotations

import textwrap

import fresh_python
import pytest
import torch
import torchlax_core
from eager_compare import assert_same, to_jax


def _fresh(code: str) -> str:
    """Run ``code`` in a new interpreter (no environment yet, JAX's 64-bit mode off)."""
    result = fresh_python.run(["-c", textwrap.dedent(code)], timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip()


# -- the first op of a process ------------------------------------------------------------------

FIRST_CALLS = {
    "zeros_long": "torch.zeros(3, dtype=torch.long, device='jax')",
    "zeros_float64": "torch.zeros(3, dtype=torch.float64, device='jax')",
    "empty_long": "torch.empty(3, dtype=torch.long, device='jax').zero_()",
    "arange": "torch.arange(5, device='jax')",
    "arange_float64": "torch.arange(0, 1, 0.25, dtype=torch.float64, device='jax')",
    "linspace": "torch.linspace(0, 1, 5, device='jax')",
    "full_long": "torch.full((2,), 2**40, device='jax')",
    "tensor": "torch.tensor([2**40, 3], device='jax')",
}


@pytest.mark.parametrize("name", sorted(FIRST_CALLS))
def test_first_factory_call_of_a_process(name):
    # Outside enable(), the very first call builds its result as every later call does.
    expr = FIRST_CALLS[name]
    out = _fresh(f"""
        import torch, torchlax_core, jax
        t = {expr}
        cpu = {expr.replace("'jax'", "'cpu'")}
        assert jax.config.jax_enable_x64 is False
        print(t.dtype, t.jax().dtype, cpu.dtype, torch.equal(t.cpu(), cpu))
    """)
    dtype, jax_dtype, cpu_dtype, equal = out.splitlines()[-1].split(" ")
    assert dtype == cpu_dtype, out
    assert jax_dtype == dtype.replace("torch.", ""), out
    assert equal == "True", out


# -- 64-bit buffers and the default dtype -------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64, torch.complex128])
def test_empty_keeps_64_bit_dtypes(dtype):
    torchlax_core.default_env()
    t = torch.empty(3, dtype=dtype, device="jax")  # outside enable(): 64-bit mode is off
    assert t.dtype == dtype and str(t.jax().dtype) == str(dtype).replace("torch.", "")
    if dtype.is_complex:
        return  # make_tensor writes complex values through view_as_real: see test_strides
    made = torch.testing.make_tensor(4, dtype=dtype, device="jax")
    assert made.dtype == dtype and str(made.jax().dtype) == str(dtype).replace("torch.", "")


@pytest.fixture
def _default_float64():
    before = torch.get_default_dtype()
    yield
    torch.set_default_dtype(before)


@pytest.mark.usefixtures("_default_float64")
def test_set_default_dtype_reaches_factories_and_promotion():
    ints = to_jax(torch.arange(3))
    for default in (torch.float32, torch.float64, torch.float32):
        torch.set_default_dtype(default)
        assert torch.empty(2, device="jax").dtype == default
        assert torch.ones(2, device="jax").dtype == default
        assert torch.randn(2, device="jax").dtype == default
        assert torch.tensor([1.0], device="jax").dtype == default
        # Promotion that involves the default dtype is not answered from a stale cache.
        assert_same(ints * 1.5, torch.arange(3) * 1.5)
        assert_same(ints / ints.add(1), torch.arange(3) / torch.arange(3).add(1))


# -- empty tensors ------------------------------------------------------------------------------


def test_view_dtype_of_zero_element_tensors():
    for shape, src, dst in [
        ((0, 4), torch.float32, torch.float16),
        ((0, 4), torch.float16, torch.float32),
        ((2, 0), torch.float32, torch.int8),
    ]:
        cpu = torch.zeros(shape, dtype=src)
        expected, actual = cpu.view(dst), to_jax(cpu).view(dst)
        assert_same(actual, expected)
        assert actual.stride() == expected.stride()


def test_view_dtype_upsize_errors_as_pytorch():
    for make in (
        lambda d: torch.zeros(3, dtype=torch.float16, device=d),
        lambda d: torch.zeros((), dtype=torch.float16, device=d),
    ):
        with pytest.raises(RuntimeError) as cpu_error:
            make("cpu").view(torch.float32)
        with pytest.raises(RuntimeError) as jax_error:
            make("jax").view(torch.float32)
        assert str(jax_error.value).split(",")[0] == str(cpu_error.value).split(",")[0]


def test_moving_a_cpu_tensor_to_jax_leaves_it_resizable():
    # (Tensor.numpy() would mark the CPU storage non-resizable: out= and resize_ then fail.)
    for dtype in (torch.float32, torch.bfloat16, torch.bool):
        cpu = torch.empty(0, dtype=dtype)
        cpu.to("jax")
        torch.ones(3, dtype=dtype, out=cpu)
        assert cpu.shape == (3,) and cpu.untyped_storage().resizable()


def test_is_pinned_is_false_as_for_a_cuda_tensor():
    # Pinned memory is page-locked host memory; torch.distributed.checkpoint asks every tensor
    # it saves (before: OpNotLoweredError for aten.is_pinned)
    torchlax_core.default_env()
    t = torch.ones(3, device="jax")
    assert t.is_pinned() is False
    assert t.is_pinned(torch.device("cpu")) is False
