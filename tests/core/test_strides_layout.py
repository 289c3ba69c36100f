"""Results keep their input's memory order where PyTorch's do: ``.to()`` (preserve_format)
between the CPU and ``jax`` and between dtypes, ``empty_like``/``zeros_like``, and pointwise ops
laid out by TensorIterator's rule (mixed layouts, broadcasting, strided slices).

Each case runs on a CPU tensor and on a torchlax Tensor and compares values, dtype, shape,
strides, storage offset, ``is_contiguous()`` and ``_base``.
"""

from __future__ import annotations

import jax.numpy as jnp
import pytest
import torch
import torchlax_core
from eager_compare import assert_same, to_jax
from torchlax_core.internal import traced_input


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


def _m(*shape):
    numel = 1
    for n in shape:
        numel *= n
    return torch.arange(numel, dtype=torch.float32).reshape(shape) - 5


# Each case gets ``f`` (identity on the CPU, ``to_jax`` on jax) to make its inputs.
CASES = {
    "add_scalar": lambda f: f(_m(4, 6)).t() + 1,
    "mul_same_layout": lambda f: f(_m(4, 6)).t() * f(_m(4, 6)).t(),
    "sin": lambda f: f(_m(4, 6)).t().sin(),
    "compare": lambda f: f(_m(4, 6)).t() > 5,
    "where": lambda f: torch.where(f(_m(4, 6)).t() > 5, f(_m(4, 6)).t(), 0.0),
    "clone": lambda f: f(_m(4, 6)).t().clone(),
    "clone_contiguous": lambda f: f(_m(4, 6)).t().clone(memory_format=torch.contiguous_format),
    "double": lambda f: f(_m(4, 6)).t().double(),
    "empty_like_shape": lambda f: torch.zeros_like(f(_m(4, 6)).t()),
    "ones_like_int": lambda f: torch.ones_like(f(_m(4, 6)).t(), dtype=torch.int64),
    "full_like": lambda f: torch.full_like(f(_m(4, 6)).t(), 3.0),
    "permuted_3d": lambda f: f(_m(2, 3, 4)).permute(2, 0, 1).exp(),
    "chain": lambda f: ((f(_m(4, 6)).t() + 1) * 2).neg(),
    # TensorIterator's general rule: the first argument that orders two dimensions decides,
    # a broadcast dimension (stride 0) orders nothing
    "first_decides": lambda f: f(_m(4, 6)).t() + f(_m(6, 4)),
    "first_decides_row_major": lambda f: f(_m(6, 4)) + f(_m(4, 6)).t(),
    "broadcast_bias": lambda f: f(_m(4, 6)).t() + f(_m(4)),
    "bias_first": lambda f: f(_m(4)) * f(_m(4, 6)).t(),
    "broadcast_column": lambda f: f(_m(6, 1)) - f(_m(4, 6)).t(),
    "of_a_slice_view": lambda f: f(_m(4, 6))[1:].t() + 1,
    "of_a_strided_slice": lambda f: f(_m(4, 6)).t()[:, ::2] * 2,
    "clone_of_a_strided_slice": lambda f: f(_m(4, 6)).t()[:, ::2].clone(),
    "zeros_like_strided": lambda f: torch.zeros_like(f(_m(4, 6)).t()[::2]),
    "two_permutations": lambda f: (
        f(_m(2, 3, 4)).permute(2, 0, 1) + f(_m(2, 3, 4)).transpose(0, 1).permute(2, 1, 0)
    ),
    "size_one_dims": lambda f: f(_m(3, 1, 4)).permute(1, 2, 0) * f(_m(4, 3)),
    "expanded": lambda f: f(_m(1, 6)).expand(4, 6).t() * 2,
    "channels_last_and_row_major": lambda f: (
        f(_m(2, 3, 4, 5)).contiguous(memory_format=torch.channels_last) * f(_m(2, 3, 4, 5))
    ),
    "row_major_and_channels_last": lambda f: (
        f(_m(2, 3, 4, 5)) * f(_m(2, 3, 4, 5)).contiguous(memory_format=torch.channels_last)
    ),
    "channels_last_bias": lambda f: (
        f(_m(2, 3, 4, 5)).contiguous(memory_format=torch.channels_last) + f(_m(3, 1, 1))
    ),
    "ternary": lambda f: torch.addcmul(f(_m(4)), f(_m(4, 6)).t(), f(_m(6, 4))),
    "clamp_tensors": lambda f: torch.clamp(f(_m(4, 6)).t(), f(_m(6, 1)), f(_m(4)) + 30),
    "tuple_results": lambda f: torch.frexp(f(_m(4, 6)).t() + f(_m(6, 1)))[1],
    "empty_broadcast": lambda f: f(_m(3, 0)).t() + f(_m(1, 3)),
    "empty_and_number": lambda f: f(_m(0, 3)).t() + 1,  # the number is an operand
    "masked_fill_is_row_major": lambda f: f(_m(4, 6)).t().masked_fill(f(_m(6, 4)) > 3, 0.0),
    "backward_operand_order": lambda f: torch.ops.aten.threshold_backward(
        f(_m(4, 6)).t(), f(_m(6, 4)), 0.0
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_pointwise_results_keep_memory_order(name):
    expected, actual = CASES[name](lambda t: t), CASES[name](to_jax)
    assert_same(actual, expected)
    assert _layout(actual) == _layout(expected)


def test_a_kept_layout_reads_and_writes_through_views():
    # a broadcast result stored in memory order: views of it, and writes through them
    cpu_x, cpu_b = _m(4, 6), _m(4)
    jx_x, jx_b = to_jax(cpu_x), to_jax(cpu_b)
    expected, actual = cpu_x.t() + cpu_b, jx_x.t() + jx_b
    for view in (lambda r: r.t().view(-1), lambda r: r[2:, 1], lambda r: r.t()[1]):
        assert _layout(view(actual)) == _layout(view(expected))
        assert_same(view(actual), view(expected))
    actual.t()[1].mul_(10)
    expected.t()[1].mul_(10)
    assert_same(actual, expected)


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


def _pointwise_overloads():
    # Every registered ATen op, not ``dir(torch.ops.aten)``: that lists only the packets some
    # code has touched so far, which made the test's coverage depend on the tests before it.
    names = {
        n.split("::")[1].split(".")[0]
        for n in torch._C._dispatch_get_all_op_names()
        if n.startswith("aten::")
    }
    for name in sorted(n for n in names if not n.startswith("_")) + sorted(
        n for n in names if n.startswith("_")
    ):
        packet = getattr(torch.ops.aten, name, None)
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if torch.Tag.pointwise in op.tags and not op._schema.is_mutable:
                yield op


# Pointwise ops whose CPU result is not TensorIterator's own: ldexp multiplies by a row-major
# pow(2, other); positive and conj_physical of real tensors return their input.
_NOT_ITERATOR_LAID = {"aten.ldexp.Tensor", "aten.positive.default", "aten.conj_physical.default"}


def test_the_layout_rule_matches_the_cpu_for_every_pointwise_op():
    """The rule alone (no jax), against the strides of PyTorch's CPU result: each pointwise
    overload with tensor arguments in mixed, broadcast and strided layouts."""
    from torch._prims_common import make_contiguous_strides_for
    from torchlax_core._iterator_layout import iterator_strides
    from torchlax_core._layouts import _operand_positions, keeps_layout

    layouts = {
        "t": lambda: (_m(4, 6) + 5.5).t(),
        "row_major": lambda: _m(6, 4) + 5.5,
        "bias": lambda: _m(4) + 5.5,
        "column": lambda: _m(6, 1) + 5.5,
        "strided": lambda: (_m(4, 12) + 5.5).t()[::2],
    }
    combos = [("t",), ("strided",), ("t", "row_major"), ("row_major", "t"), ("t", "bias")]
    combos += [("bias", "t"), ("column", "t"), ("strided", "t")]
    checked, wrong = 0, []
    for op in _pointwise_overloads():
        if str(op) in _NOT_ITERATOR_LAID:
            continue
        schema = op._schema.arguments
        for combo in combos:
            call, tensors = [], 0
            for a in schema:
                if a.kwarg_only or (a.has_default_value() and tensors == len(combo)):
                    break
                if isinstance(a.type, torch.TensorType):
                    call.append(layouts[combo[min(tensors, len(combo) - 1)]]())
                    tensors += 1
                elif isinstance(a.type, torch.NumberType):
                    call.append(2)
                else:
                    call = None
                    break
            if call is None or tensors < len(combo):
                continue
            if (
                "bitwise" in str(op)
                or "shift" in str(op)
                or str(op).split(".")[1] in ("gcd", "lcm")
            ):
                call = [c.long() if isinstance(c, torch.Tensor) else c for c in call]
            try:
                out = op(*call)
            except (RuntimeError, NotImplementedError):  # not for these dtypes
                continue
            out = out[0] if isinstance(out, tuple) else out
            if not isinstance(out, torch.Tensor):
                continue
            positions = _operand_positions(op)
            assert positions is not None  # an ATen overload
            operands = tuple(
                (c.shape, c.stride()) if isinstance(c, torch.Tensor) else ((), ())
                for c in (call[i] for i in positions if i < len(call))
                if isinstance(c, torch.Tensor | int)
            )
            predicted = iterator_strides(operands) if keeps_layout(op) else None
            if predicted is None:
                predicted = tuple(make_contiguous_strides_for(out.shape))
            checked += 1
            if predicted != out.stride():
                wrong.append((str(op), combo, out.stride(), predicted))
    assert checked > 800, checked
    assert not wrong, wrong


def test_a_program_input_enters_its_trace_row_major_laid_out_or_stored_in_order():
    # traced_input, the one way a compiled program's input array becomes the tensor its trace
    # computes with (torchlax.jit's steps, the backend's graphs): row-major; laid out with
    # strides (the array holds the values in logical order); or passed in memory order.
    values = jnp.arange(6.0, dtype=jnp.float32).reshape(2, 3)
    expected = torch.arange(6.0).reshape(2, 3)
    plain = traced_input(values)
    assert plain.stride() == (3, 1)
    strided = traced_input(values, (1, 2))  # a transpose's strides, the values as they read
    assert strided.stride() == (1, 2)
    stored = traced_input(values.T, (1, 2), (1, 0))  # the elements in memory order
    assert stored.stride() == (1, 2)
    for t in (plain, strided, stored):
        assert torch.equal(t.cpu(), expected)
