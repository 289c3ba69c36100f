"""In-place ops and ``out=`` keep the tensor object, bump ``_version`` and follow PyTorch's dtypes.

Also: CPU tensors mixed with torchlax Tensors (0-d CPU tensors are scalars, others raise).
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


def _pair(t):
    return t, to_jax(t)


INPLACE = {
    "add_": lambda x: x.add_(torch.ones_like(x), alpha=2),
    "add_scalar": lambda x: x.add_(1.5),
    "mul_": lambda x: x.mul_(3),
    "sub_": lambda x: x.sub_(x),
    "zero_": lambda x: x.zero_(),
    "fill_": lambda x: x.fill_(2.5),
    "copy_": lambda x: x.copy_(torch.full_like(x, 4.0)),
    "iadd": lambda x: x.__iadd__(2),
}


@pytest.mark.parametrize("name", sorted(INPLACE))
def test_inplace_keeps_identity_and_bumps_version(name):
    op = INPLACE[name]
    cpu, jx = _pair(torch.arange(6, dtype=torch.float32).reshape(2, 3))
    obj_id, version = id(jx), jx._version
    expected = op(cpu)
    actual = op(jx)
    assert actual is jx and id(jx) == obj_id
    assert jx._version > version
    assert_same(jx, expected)


def test_inplace_on_int_keeps_int_and_rejects_float_result():
    cpu, jx = _pair(torch.arange(4))
    jx.add_(2)
    cpu.add_(2)
    assert_same(jx, cpu)
    jx.mul_(True)
    assert jx.dtype == torch.int64
    with pytest.raises(
        RuntimeError, match="result type Float can't be cast to the desired output type Long"
    ):
        torch.arange(4).add_(1.5)  # PyTorch's own message, for reference
    with pytest.raises(
        RuntimeError, match="result type Float can't be cast to the desired output type Long"
    ):
        jx.add_(1.5)


def test_inplace_on_float16_casts_result_down():
    cpu, jx = _pair(torch.ones(3, dtype=torch.float16))
    other_cpu, other = _pair(torch.full((3,), 0.5, dtype=torch.float32))
    assert_same(jx.add_(other), cpu.add_(other_cpu))
    assert jx.dtype == torch.float16


def test_inplace_broadcast_to_larger_shape_raises():
    jx = to_jax(torch.ones(3, 1))
    with pytest.raises(RuntimeError):
        jx.add_(to_jax(torch.ones(3, 4)))


def test_out_keeps_identity_and_dtype():
    a_cpu, a = _pair(torch.arange(6, dtype=torch.float32))
    out_cpu, out = _pair(torch.empty(6, dtype=torch.float32))
    obj_id = id(out)
    result = torch.add(a, a, out=out)
    torch.add(a_cpu, a_cpu, out=out_cpu)
    assert result is out and id(out) == obj_id
    assert_same(out, out_cpu)


def test_out_with_wider_dtype_casts():
    a_cpu, a = _pair(torch.arange(6))
    out_cpu, out = _pair(torch.zeros(6, dtype=torch.float64))
    torch.mul(a, 3, out=out)
    torch.mul(a_cpu, 3, out=out_cpu)
    assert_same(out, out_cpu)


def test_out_with_narrowing_category_raises_like_pytorch():
    a = to_jax(torch.rand(4))
    out = to_jax(torch.zeros(4, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="can't be cast to the desired output type Long"):
        torch.add(torch.rand(4), 1, out=torch.zeros(4, dtype=torch.int64))  # PyTorch agrees
    with pytest.raises(RuntimeError, match="can't be cast to the desired output type Long"):
        torch.add(a, 1, out=out)


# out= tensors of another shape are resized as PyTorch resizes them (a warning when one that
# had elements is resized): fn(x, out), and the out tensor to start from.
OUT_RESIZES = {
    "empty_grows": (lambda x, o: torch.add(x, 1, out=o), lambda: torch.empty(0)),
    "larger_shrinks": (lambda x, o: torch.mul(x, 2, out=o), lambda: torch.zeros(10)),
    "smaller_grows": (lambda x, o: torch.sub(x, 1, out=o), lambda: torch.zeros(2)),
    "reduction": (lambda x, o: torch.sum(x, 0, out=o), lambda: torch.empty(0)),
    "matmul": (lambda x, o: torch.mm(x, x.t(), out=o), lambda: torch.empty(0)),
    "diag": (lambda x, o: torch.diag(x, out=o), lambda: torch.empty(0)),
    "nonzero": (lambda x, o: torch.nonzero(x, out=o), lambda: torch.empty(0, dtype=torch.long)),
    "two_outputs": (
        lambda x, o: torch.max(x, 1, out=(o, torch.empty(0, dtype=torch.long, device=o.device))),
        lambda: torch.empty(0),
    ),
}


@pytest.mark.parametrize("name", sorted(OUT_RESIZES))
def test_out_of_another_shape_is_resized_as_pytorch(name):
    import warnings

    fn, make_out = OUT_RESIZES[name]
    x_cpu, x = _pair(torch.arange(6, dtype=torch.float32).reshape(2, 3))
    results = []
    for xs, out in ((x_cpu, make_out()), (x, to_jax(make_out()))):
        obj_id = id(out)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = fn(xs, out)
        first = result[0] if isinstance(result, tuple) else result
        assert first is out and id(out) == obj_id
        resized = [w for w in caught if "was resized since it had shape" in str(w.message)]
        results.append((out, len(resized)))
    (expected, expected_warnings), (actual, actual_warnings) = results
    assert_same(actual, expected)
    assert actual_warnings == expected_warnings
    if name != "nonzero":  # (PyTorch's nonzero writes its out column-major)
        assert actual.stride() == expected.stride()


def test_resize_grows_keeping_contents_and_offset():
    results = []
    for base in (torch.arange(6.0), to_jax(torch.arange(6.0))):
        tail = base[2:]
        tail.resize_(3, 3)
        tail[2, 2] = 7  # an element of the grown part
        results.append((tail, tail.storage_offset(), tail.stride()))
    assert_same(results[1][0][0], results[0][0][0])  # the storage's elements, kept
    assert results[1][0][2, 2].item() == 7 and results[1][1:] == results[0][1:]


def test_out_dtype_rules_as_pytorch():
    # neg/floor/ceil want out's dtype exactly; sin casts into any dtype its result casts to.
    cases = (
        (torch.neg, torch.float32, torch.float64),
        (torch.floor, torch.float32, torch.float64),
        (torch.ceil, torch.int32, torch.int64),
        (torch.sin, torch.int64, torch.int64),
        (torch.sin, torch.float32, torch.float64),
        (torch.neg, torch.int64, torch.int64),
    )
    for op, dtype, out_dtype in cases:
        x_cpu, x = _pair(torch.ones(3, dtype=dtype))
        out_cpu, out = _pair(torch.empty(0, dtype=out_dtype))
        try:
            expected = op(x_cpu, out=out_cpu)
        except RuntimeError as error:
            with pytest.raises(RuntimeError) as caught:
                op(x, out=out)
            assert str(error) in str(caught.value), (op, dtype, out_dtype)
        else:
            assert_same(op(x, out=out), expected)
            assert_same(out, expected)


def test_zero_dim_cpu_tensor_acts_as_scalar():
    cpu, jx = _pair(torch.arange(4, dtype=torch.float32))
    scalar = torch.tensor(2.5)
    assert_same(jx * scalar, cpu * scalar)
    assert_same(scalar + jx, scalar + cpu)
    # An int64 0-d tensor does not promote a float32 tensor (it is a scalar of a lower category).
    assert_same(jx + torch.tensor(3), cpu + torch.tensor(3))


def test_cpu_tensor_next_to_jax_tensor_raises_naming_op_argument_and_devices():
    jx = to_jax(torch.ones(3))
    with pytest.raises(torchlax_core.DeviceMismatchError) as info:
        jx + torch.ones(3)
    message = str(info.value)
    assert "aten.add.Tensor" in message
    assert "argument 'other'" in message
    assert "cpu" in message and "jax" in message
    with pytest.raises(torchlax_core.DeviceMismatchError, match="argument 'self'"):
        torch.ones(3).mul(jx)


# -- writes into memory that overlaps itself (issue 37, item 6) ---------------------------------


def _expanded(device):
    return torch.zeros(1, 3, device=device).expand(4, 3)


OVERLAPPING_WRITES = [
    ("add_", lambda x: x.add_(1)),
    ("mul_of_a_slice", lambda x: x[1:].mul_(2)),
    ("copy_", lambda x: x.copy_(torch.ones(4, 3, device=x.device))),
    ("out", lambda x: torch.add(torch.ones(4, 3, device=x.device), 1, out=x)),
    ("uniform_", lambda x: x.uniform_()),
    # PyTorch lets these through (they write one value everywhere, or warn only).
    ("fill_", lambda x: x.fill_(2.0)),
    ("zero_", lambda x: x.zero_()),
    (
        "masked_fill_",
        lambda x: x.masked_fill_(torch.ones(4, 3, dtype=torch.bool, device=x.device), 3.0),
    ),
]


@pytest.mark.parametrize(
    "write", [w for _, w in OVERLAPPING_WRITES], ids=[n for n, _ in OVERLAPPING_WRITES]
)
def test_a_write_into_an_expanded_view_is_refused_as_on_cpu(write):
    try:
        write(_expanded("cpu"))
        refused = None
    except RuntimeError as error:
        refused = error
    with torchlax_core.enable():
        base = torch.zeros(1, 3, device="jax")
        x = base.expand(4, 3)
        if refused is None:
            expected = write(_expanded("cpu"))
            assert torch.equal(write(x).cpu(), expected)
            return
        with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
            write(x)
        assert torch.equal(base.cpu(), torch.zeros(1, 3))  # the user's tensor is untouched
