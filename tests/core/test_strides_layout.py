"""Results keep their input's memory order where PyTorch's do: ``.to()`` (preserve_format)
between the CPU and ``jax`` and between dtypes, ``empty_like``/``zeros_like``, and pointwise ops
whose tensor arguments share one transposed or permuted dense layout (TensorIterator).

Each case runs on a CPU tensor and on a torchlax Tensor and compares values, dtype, shape,
strides, storage offset, ``is_contiguous()`` and ``_base``.
"""

from __future__ import annotations

import pytest
import torch
import torchlax_core
from eager_compare import assert_same, to_jax


@pytest.fixture(autouse=True)
def _enabled():
    with torchlax_core.enable():
        yield


def _layout(t):
    return tuple(t.shape), t.stride(), t.storage_offset(), t.is_contiguous(), t._base is None


def _cube():
    return torch.arange(24, dtype=torch.float32).reshape(2, 3, 4).clone()


def test_cpu_to_jax_keeps_a_permuted_layout():
    cpu = _cube().permute(2, 0, 1)
    moved = cpu.to("jax")
    assert _layout(moved) == _layout(cpu.clone())  # strides (1, 12, 4), not a view
    assert moved.stride() == (1, 12, 4)
    assert_same(moved, cpu)
    # A write to the copy reaches neither side of the other.
    moved.add_(1)
    assert_same(moved, cpu + 1)
    assert cpu[0, 0, 0].item() == 0.0


def test_to_with_contiguous_format_is_row_major():
    cpu = _cube().transpose(0, 2)
    moved = cpu.to("jax", memory_format=torch.contiguous_format)
    assert moved.is_contiguous() and moved.stride() == (6, 2, 1)
    assert_same(moved, cpu)
    back = moved.transpose(0, 2).to("cpu", memory_format=torch.contiguous_format)
    assert back.is_contiguous()
    torch.testing.assert_close(back, _cube())


def test_jax_to_cpu_keeps_a_transposed_layout():
    cpu = _cube()
    jx = to_jax(cpu)
    views = (lambda v: v.transpose(0, 2), lambda v: v.permute(1, 2, 0), lambda v: v[1].t())
    for view in views:
        out, expected = view(jx).to("cpu"), view(cpu).clone()
        assert type(out) is torch.Tensor and out.device.type == "cpu"
        assert _layout(out) == _layout(expected)
        torch.testing.assert_close(out, expected)


def test_jax_to_cpu_values_match_pytorch():
    cpu = _cube()
    jx = to_jax(cpu)
    assert _layout(jx.permute(2, 0, 1).cpu()) == _layout(cpu.permute(2, 0, 1).clone())
    torch.testing.assert_close(jx.permute(2, 0, 1).cpu(), cpu.permute(2, 0, 1))


CASES = {
    "add_scalar": lambda x: x.t() + 1,
    "mul_same_layout": lambda x: x.t() * x.t(),
    "sin": lambda x: x.t().sin(),
    "compare": lambda x: x.t() > 5,
    "where": lambda x: torch.where(x.t() > 5, x.t(), 0.0),
    "clone": lambda x: x.t().clone(),
    "clone_contiguous": lambda x: x.t().clone(memory_format=torch.contiguous_format),
    "double": lambda x: x.t().double(),
    "empty_like_shape": lambda x: torch.zeros_like(x.t()),
    "ones_like_int": lambda x: torch.ones_like(x.t(), dtype=torch.int64),
    "full_like": lambda x: torch.full_like(x.t(), 3.0),
    "permuted_3d": lambda x: x.view(2, 3, 4).permute(2, 0, 1).exp(),
    "chain": lambda x: ((x.t() + 1) * 2).neg(),
    "of_a_slice_view": lambda x: x[1:].t() + 1,  # not the whole storage: row-major, as values
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_pointwise_results_keep_memory_order(name):
    cpu = torch.arange(24, dtype=torch.float32).reshape(4, 6).clone()
    jx = to_jax(cpu)
    expected, actual = CASES[name](cpu), CASES[name](jx)
    assert_same(actual, expected)
    if name == "of_a_slice_view":  # the documented limit: a layout is kept only from a
        assert actual.is_contiguous()  # tensor that owns its storage array
    else:
        assert _layout(actual) == _layout(expected)


def test_empty_like_keeps_strides():
    cpu = _cube().permute(1, 2, 0)
    jx = to_jax(_cube()).permute(1, 2, 0)
    assert _layout(torch.empty_like(jx)) == _layout(torch.empty_like(cpu))
    assert _layout(torch.empty_strided((3, 2), (1, 3), device="jax")) == _layout(
        torch.empty_strided((3, 2), (1, 3))
    )


def test_results_kept_in_order_are_ordinary_tensors():
    cpu = torch.arange(6, dtype=torch.float32).reshape(2, 3).clone()
    jx = to_jax(cpu)
    expected, actual = cpu.t() + 1, jx.t() + 1
    # in place through the kept layout, then read
    expected.mul_(3)
    actual.mul_(3)
    assert_same(actual, expected)
    assert_same(jx, cpu)  # the input is untouched
    # PyTorch's view rules follow from the strides: view(-1) of a transposed layout raises
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        expected.view(-1)
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        actual.view(-1)
    assert _layout(actual.contiguous()) == _layout(expected.contiguous())
    assert_same(actual.reshape(-1), expected.reshape(-1))
    assert actual.T.is_contiguous() and expected.T.is_contiguous()
    # the transposed-back view of the stored result is a view of it, as in PyTorch
    assert actual.T._base is actual
    assert_same(actual.T @ torch.ones(3, 1, device="jax"), expected.T @ torch.ones(3, 1))


def test_autograd_through_a_kept_layout():
    cpu = torch.arange(6, dtype=torch.float32).reshape(2, 3).requires_grad_()
    jx = to_jax(cpu)
    ((cpu.t() * 2).sin()).sum().backward()
    ((jx.t() * 2).sin()).sum().backward()
    assert jx.grad is not None and cpu.grad is not None
    assert_same(jx.grad, cpu.grad)


@pytest.mark.parametrize(
    ("dims", "ndim"), [((1, 1), 2), ((1, -2), 3), ((0, 1, 2), 3), ((0,), 2), ((0, 1), 1)]
)
def test_rot90_refuses_bad_dims_as_pytorch(dims, ndim):
    cpu = torch.arange(2**ndim).view((2,) * ndim)
    with pytest.raises(RuntimeError) as expected:
        cpu.rot90(1, dims)
    with pytest.raises(RuntimeError) as actual:
        to_jax(cpu).rot90(1, dims)
    assert str(actual.value) == str(expected.value)


def test_rot90_out_of_range_dim_is_an_index_error():
    with pytest.raises(IndexError, match="Dimension out of range"):
        to_jax(torch.arange(4).view(2, 2)).rot90(1, [0, 2])


@pytest.mark.parametrize(
    ("shape", "memory_format"),
    [((2, 3, 4, 5), torch.channels_last), ((2, 3, 2, 4, 5), torch.channels_last_3d)],
)
def test_resize_to_channels_last_reads_the_storage_as_pytorch(shape, memory_format):
    numel = 1
    for n in shape:
        numel *= n
    cpu = torch.arange(numel, dtype=torch.float32)
    jx = to_jax(cpu)
    cpu.resize_(shape, memory_format=memory_format)
    jx.resize_(shape, memory_format=memory_format)
    assert _layout(jx) == _layout(cpu)
    assert jx.is_contiguous(memory_format=memory_format)
    assert_same(jx, cpu)
    # resize_as_ with preserve_format takes the template's memory format, without it row-major
    for fmt in ({"memory_format": torch.preserve_format}, {}):
        flat_cpu = torch.arange(numel, dtype=torch.float32)
        flat_jx = to_jax(flat_cpu)
        flat_cpu.resize_as_(cpu, **fmt)
        flat_jx.resize_as_(jx, **fmt)
        assert _layout(flat_jx) == _layout(flat_cpu)
        assert_same(flat_jx, flat_cpu)


@pytest.mark.parametrize(
    "make",
    [
        lambda x: x.contiguous(memory_format=torch.channels_last),
        lambda x: x.clone(memory_format=torch.channels_last),
        lambda x: torch.zeros_like(x, memory_format=torch.channels_last),
        lambda x: x.contiguous(memory_format=torch.channels_last).contiguous(),
    ],
)
def test_channels_last_on_request(make):
    cpu = torch.arange(120, dtype=torch.float32).reshape(2, 3, 4, 5)
    expected, actual = make(cpu), make(to_jax(cpu))
    assert _layout(actual) == _layout(expected)
    assert_same(actual, expected)


def test_channels_last_of_another_rank_raises_as_pytorch():
    for fmt, message in (
        (torch.channels_last, "required rank 4 tensor to use channels_last format"),
        (torch.channels_last_3d, "required rank 5 tensor to use channels_last_3d format"),
    ):
        with pytest.raises(RuntimeError, match=message):
            torch.zeros(2, 3).contiguous(memory_format=fmt)
        with pytest.raises(RuntimeError, match=message):
            to_jax(torch.zeros(2, 3)).contiguous(memory_format=fmt)
