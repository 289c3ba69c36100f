"""PyTorch's device-generic behaviour on the ``jax`` device, each case run on the CPU beside it:
factories with ``out=``, ``nonzero``, boolean-mask indexing and its errors, ``setitem``
expansion, ``torch.result_type`` and the ``out=`` dtype rule."""

from __future__ import annotations

import warnings

import pytest
import torch
import torchlax_core  # noqa: F401  (registers the jax device)


def _on(device: str, fn):
    """``fn(device)``'s result, or the exception it raised."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # resize_output's deprecation
            return fn(device)
    except Exception as error:  # compared below: type and gist of the message
        return error


def _same_as_cpu(fn, *, values=True):
    """``fn`` on ``jax`` answers as on the CPU: values, dtype, shape, strides, or the error type."""
    expected, actual = _on("cpu", fn), _on("jax", fn)
    if isinstance(expected, Exception):
        assert type(actual) is type(expected), f"{actual!r} instead of {expected!r}"
        return actual
    assert not isinstance(actual, Exception), f"{actual!r} where the CPU returns a result"
    assert actual.device.type == "jax"
    assert (actual.dtype, actual.shape, actual.stride(), actual.storage_offset()) == (
        expected.dtype,
        expected.shape,
        expected.stride(),
        expected.storage_offset(),
    )
    if values:
        torch.testing.assert_close(actual.cpu(), expected, equal_nan=True)
    return actual


# -- factories with out= ------------------------------------------------------------------------


def _out(shape, dtype=torch.float32):
    return lambda device: torch.empty(shape, dtype=dtype, device=device)


FACTORY_OUTS = {
    "linspace_resized": (lambda o: torch.linspace(0, 1, 5, out=o), _out(0)),
    "linspace_float64": (lambda o: torch.linspace(-1, 1, 7, out=o), _out(7, torch.float64)),
    "linspace_into_int64": (lambda o: torch.linspace(0, 10, 5, out=o), _out(5, torch.int64)),
    "linspace_zero_steps": (lambda o: torch.linspace(0, 1, 0, out=o), _out(3)),
    "linspace_negative_steps": (lambda o: torch.linspace(0, 1, -1, out=o), _out(3)),
    "logspace": (lambda o: torch.logspace(0, 2, 3, out=o), _out(7)),
    "logspace_base2": (lambda o: torch.logspace(0, 4, 5, 2.0, out=o), _out(0, torch.float64)),
    "zeros": (lambda o: torch.zeros(2, 3, out=o), _out(0)),
    "zeros_int32": (lambda o: torch.zeros(2, 3, out=o), _out(6, torch.int32)),
    "ones": (lambda o: torch.ones(2, 3, out=o), _out((2, 3), torch.float64)),
    "full_int64": (lambda o: torch.full((2, 3), 7, out=o), _out(0, torch.int64)),
    "full_float": (lambda o: torch.full((2, 3), 7.5, out=o), _out(0)),
    "eye": (lambda o: torch.eye(3, out=o), _out(0)),
    "eye_m_int64": (lambda o: torch.eye(3, 4, out=o), _out(0, torch.int64)),
    "eye_into_strided_out": (
        lambda o: torch.eye(3, out=o),
        lambda device: torch.zeros(3, 6, device=device)[:, ::2],
    ),
    "eye_into_transposed_out": (
        lambda o: torch.eye(3, out=o),
        lambda device: torch.zeros(3, 3, device=device).t(),
    ),
    "arange": (lambda o: torch.arange(5, out=o), _out(0, torch.int64)),
    "arange_float": (lambda o: torch.arange(0, 1, 0.25, out=o), _out(9)),
    "arange_bad_step_sign": (lambda o: torch.arange(0, 5, -1, out=o), _out(0)),
    "range_int64": (lambda o: torch.range(0, 4, 2, out=o), _out(0, torch.int64)),
    "range_float64": (lambda o: torch.range(0, 1, 0.3, out=o), _out(0, torch.float64)),
    "empty": (lambda o: torch.empty(2, 3, out=o), _out(0)),
}


@pytest.mark.parametrize("name", sorted(FACTORY_OUTS))
def test_factory_with_out_as_pytorch(name):
    factory, make_out = FACTORY_OUTS[name]

    def run(device):
        out = make_out(device)
        result = factory(out)
        assert result is out  # out= returns the out tensor itself
        return result

    _same_as_cpu(run, values=name != "empty")


def test_range_without_out_includes_end_and_checks_step_sign():
    for device in ("cpu", "jax"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torch.range is deprecated
            _same_as_cpu(lambda d: torch.range(0, 1, 0.25, device=d))
            with pytest.raises(RuntimeError, match="upper bound and lower bound inconsistent"):
                torch.range(4, 0, 1, device=device)


# -- nonzero ------------------------------------------------------------------------------------


def _matrix(device):
    return torch.tensor([[0, 1, 0], [2, 0, 3]], device=device)


def _long_out(shape):
    return lambda device: torch.empty(shape, dtype=torch.long, device=device)


NONZEROS = {
    "plain": lambda d: torch.nonzero(_matrix(d)),
    "discontiguous_input": lambda d: torch.nonzero(_matrix(d).t()),
    "zero_dim": lambda d: torch.nonzero(torch.tensor(5, device=d)),
    "none_found": lambda d: torch.nonzero(torch.zeros(2, 3, device=d)),
    "argwhere": lambda d: torch.argwhere(_matrix(d)),
    "as_tuple": lambda d: torch.stack(torch.nonzero(_matrix(d), as_tuple=True)),
    "out_empty": lambda d: torch.nonzero(_matrix(d), out=_long_out(0)(d)),
    "out_right_shape_keeps_strides": lambda d: torch.nonzero(_matrix(d), out=_long_out((3, 2))(d)),
    "out_of_another_shape": lambda d: torch.nonzero(_matrix(d), out=_long_out((2, 5))(d)),
    "out_transposed": lambda d: torch.nonzero(_matrix(d), out=_long_out((2, 3))(d).t()),
    "out_int32_refused": lambda d: torch.nonzero(
        _matrix(d), out=torch.empty(0, dtype=torch.int32, device=d)
    ),
}


@pytest.mark.parametrize("name", sorted(NONZEROS))
def test_nonzero_values_and_strides_as_pytorch(name):
    # PyTorch allocates nonzero's (n, ndim) result transposed: strides (1, n).
    _same_as_cpu(NONZEROS[name])


def test_nonzero_result_reads_and_writes_like_a_plain_tensor():
    result = torch.nonzero(_matrix("jax"))
    assert result._base is None and not result.is_contiguous()
    result[0, 0] = 7
    expected = torch.nonzero(_matrix("cpu"))
    expected[0, 0] = 7
    assert torch.equal(result.cpu(), expected)
    assert torch.equal(result.contiguous().cpu(), expected.contiguous())


# -- the fused CPU attention: results laid out as the query is ------------------------------------


def _attention(device, heads_transposed: bool):
    """The fused CPU attention op on (2, 3 heads, 5, 4) tensors, made as GPT-2 makes them."""
    torch.manual_seed(0)
    merged = [torch.randn(2, 5, 12).to(device) for _ in range(3)]
    if heads_transposed:  # (B, L, H*E) -> (B, H, L, E): the query's strides (60, 4, 12, 1)
        q, k, v = (x.view(2, 5, 3, 4).transpose(1, 2) for x in merged)
    else:
        q, k, v = (x.view(2, 3, 5, 4) for x in merged)
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, is_causal=True)


ATTENTION = {
    "output": lambda d: _attention(d, True)[0],
    "logsumexp": lambda d: _attention(d, True)[1],
    "output_row_major_query": lambda d: _attention(d, False)[0],
    "logsumexp_row_major_query": lambda d: _attention(d, False)[1],
    # Heads merged back by a view, as GPT-2 does: a row-major output would refuse the view.
    "output_merged_by_view": lambda d: _attention(d, True)[0].transpose(1, 2).view(2, 5, 12),
}


@pytest.mark.parametrize("name", sorted(ATTENTION))
def test_fused_attention_results_strides_as_pytorch(name):
    _same_as_cpu(ATTENTION[name])


# -- boolean masks, index types, setitem --------------------------------------------------------


def _grid(device):
    return torch.arange(6.0, device=device).reshape(2, 3)


def _put(index, values):
    def run(device):
        target = _grid(device)
        target[index(device)] = values(device)
        return target

    return run


INDEXING = {
    "mask_of_wrong_length": lambda d: _grid(d)[torch.tensor([True, False, True], device=d)],
    "byte_mask_of_wrong_length": lambda d: _grid(d)[
        torch.tensor([1, 0, 1], dtype=torch.uint8, device=d)
    ],
    "mask_of_wrong_shape": lambda d: _grid(d)[torch.ones(3, 2, dtype=torch.bool, device=d)],
    "byte_mask": lambda d: _grid(d)[torch.tensor([1, 0], dtype=torch.uint8, device=d)],
    "two_masks": lambda d: _grid(d)[
        torch.tensor([True, False], device=d), torch.tensor([True, False, True], device=d)
    ],
    "out_of_range": lambda d: _grid(d)[torch.tensor([5], device=d)],
    "float_index": lambda d: _grid(d)[torch.tensor([0.0], device=d)],
    "int8_index": lambda d: _grid(d)[torch.tensor([0], dtype=torch.int8, device=d)],
    "int32_index": lambda d: _grid(d)[torch.tensor([1], dtype=torch.int32, device=d)],
    "put_values_too_wide": _put(
        lambda d: torch.tensor([0, 1], device=d), lambda d: torch.ones(2, 2, device=d)
    ),
    "put_values_to_mask_count_mismatch": _put(
        lambda d: _grid(d) > 2, lambda d: torch.ones(4, device=d)
    ),
    "put_advanced_mismatch": _put(
        lambda d: (torch.tensor([0, 1], device=d), torch.tensor([0, 1], device=d)),
        lambda d: torch.ones(3, device=d),
    ),
    "put_values_with_leading_ones": _put(
        lambda d: torch.tensor([0, 1], device=d), lambda d: torch.ones(1, 1, 3, device=d)
    ),
    "put_masked_values": _put(
        lambda d: _grid(d) > 2, lambda d: torch.tensor([10.0, 20.0, 30.0], device=d)
    ),
    "indices_not_broadcasting": lambda d: _grid(d)[
        torch.tensor([0, 1], device=d), torch.tensor([0, 1, 2], device=d)
    ],
    "put_indices_not_broadcasting": _put(
        lambda d: (torch.tensor([0, 1], device=d), torch.tensor([0, 1, 2], device=d)),
        lambda d: torch.tensor(1.0, device=d),
    ),
    "index_without_indices": lambda d: torch.ops.aten.index(_grid(d), []),
    "index_put_accumulate_without_indices": lambda d: torch.rand([], device=d).index_put(
        [], torch.tensor([1.0], device=d), True
    ),
    "index_put_accumulate_empty": lambda d: torch.zeros(0, 3, device=d).index_put_(
        (torch.tensor([], dtype=torch.long, device=d),), torch.ones(0, 3, device=d), True
    ),
}


@pytest.mark.parametrize("name", sorted(INDEXING))
def test_indexing_results_and_errors_as_pytorch(name):
    _same_as_cpu(INDEXING[name])


def test_indexing_error_messages_say_what_pytorch_says():
    names = ("put_values_too_wide", "float_index", "mask_of_wrong_length")
    for name in (*names, "indices_not_broadcasting", "put_indices_not_broadcasting"):
        expected, actual = _on("cpu", INDEXING[name]), _on("jax", INDEXING[name])
        assert isinstance(expected, Exception) and isinstance(actual, Exception)
        assert str(expected) in str(actual), (name, str(actual))


def test_uint8_masks_warn_once_each_as_pytorch():
    def index(device):
        v = torch.randn(5, 7, 3, device=device)
        byte = torch.uint8
        return v[
            torch.tensor([1, 0, 1, 1, 0], dtype=byte, device=device),
            :,
            torch.ones(3, dtype=byte, device=device),
        ]

    def messages(device):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            shape = index(device).shape
        return shape, [(w.category, str(w.message).split(" (Triggered")[0]) for w in caught]

    expected = messages("cpu")
    assert len(expected[1]) == 2 and messages("jax") == expected

    def default_filter(device):  # once per line: PyTorch names the user's line, so must we
        v, mask = torch.ones(5, 2, device=device), torch.ones(5, dtype=torch.uint8, device=device)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            v[mask].sum()
            v[mask].sum()
        return [w.filename for w in caught]

    assert default_filter("jax") == default_filter("cpu") == [__file__, __file__]


# -- the out= dtype rule ------------------------------------------------------------------------

OUT_DTYPE_CASES = {
    "mm_into_float64": lambda d, out: torch.mm(
        torch.ones(64, 32, device=d), torch.ones(32, 16, device=d), out=out
    ),
    "narrow_copy_into_float64": lambda d, out: torch.narrow_copy(
        torch.ones(8, 4, device=d), 0, 2, 3, out=out
    ),
    "neg_into_float64": lambda d, out: torch.neg(torch.ones(64, 64, device=d), out=out),
    "sin_into_float64": lambda d, out: torch.sin(torch.ones(64, 64, device=d), out=out),
    "cumsum_into_float64": lambda d, out: torch.cumsum(torch.ones(8, 4, device=d), 1, out=out),
}


@pytest.mark.parametrize("name", sorted(OUT_DTYPE_CASES))
def test_out_dtype_verdict_is_learned_without_real_shaped_cpu_data(name, monkeypatch):
    # The CPU stand-ins are empty or broadcast zeros, whatever the arguments' shapes.
    from torchlax_core import _mutation

    monkeypatch.setattr(_mutation, "_OUT_DTYPE_ERRORS", {})
    sizes = []
    zeros = torch.zeros

    def recording_zeros(*args, **kwargs):
        made = zeros(*args, **kwargs)
        sizes.append(made.numel())
        return made

    def run(device):
        return OUT_DTYPE_CASES[name](device, torch.empty(0, dtype=torch.float64, device=device))

    expected = _on("cpu", run)
    monkeypatch.setattr(torch, "zeros", recording_zeros)
    actual = _on("jax", run)
    monkeypatch.setattr(torch, "zeros", zeros)
    assert sizes and max(sizes) <= 1, sizes
    if isinstance(expected, Exception):
        assert type(actual) is type(expected) and str(expected) in str(actual), actual
    else:
        assert not isinstance(actual, Exception), actual
        assert actual.dtype == torch.float64
        torch.testing.assert_close(actual.cpu(), expected)


# -- type promotion -----------------------------------------------------------------------------


def _ints(dtype, device):
    return torch.tensor([0, 1, 2], dtype=dtype, device=device)


PROMOTIONS = {
    "uint8_plus_large_int_wraps": lambda d: _ints(torch.uint8, d) + 1000,
    "int8_minus_large_int_wraps": lambda d: _ints(torch.int8, d) - 300,
    "uint8_times_large_int_wraps": lambda d: _ints(torch.uint8, d) * 1000,
    "uint8_plus_float": lambda d: _ints(torch.uint8, d) + 5.5,
    "uint8_plus_0d_double": lambda d: _ints(torch.uint8, d) + torch.tensor(5.5, dtype=torch.double),
    "float_plus_0d_double": lambda d: (
        _ints(torch.float32, d) + torch.tensor(5.5, device=d).double()
    ),
    "add_float_alpha_to_ints": lambda d: torch.add(
        _ints(torch.int32, d), _ints(torch.int32, d), alpha=1.1
    ),
    "sub_float_alpha_from_ints": lambda d: torch.sub(
        _ints(torch.int32, d), _ints(torch.int32, d), alpha=0.5
    ),
    "add_int_alpha": lambda d: torch.add(_ints(torch.int32, d), _ints(torch.int32, d), alpha=3),
    "integer_addcdiv": lambda d: torch.addcdiv(
        _ints(torch.int32, d), _ints(torch.int32, d), _ints(torch.int32, d) + 1
    ),
    # div with a rounding mode keeps integer dtypes (true division makes them float).
    "div_ints_true": lambda d: torch.div(_ints(torch.int32, d), 2),
    "div_ints_floor": lambda d: torch.div(-_ints(torch.int32, d), 2, rounding_mode="floor"),
    "div_uint8_by_int64_trunc": lambda d: torch.div(
        _ints(torch.uint8, d), _ints(torch.int64, d) + 1, rounding_mode="trunc"
    ),
    "div_uint8_by_float_floor": lambda d: torch.div(
        _ints(torch.uint8, d), 2.5, rounding_mode="floor"
    ),
    "div_ints_floor_into_float_out": lambda d: torch.div(
        _ints(torch.int64, d),
        2,
        rounding_mode="floor",
        out=torch.empty(3, dtype=torch.float64, device=d),
    ),
    "div_unknown_rounding_mode": lambda d: torch.div(_ints(torch.int32, d), 2, rounding_mode="x"),
    "div_unknown_rounding_mode_in_place": lambda d: _ints(torch.int32, d).div_(
        2, rounding_mode="round"
    ),
}


@pytest.mark.parametrize("name", sorted(PROMOTIONS))
def test_promotion_results_and_errors_as_pytorch(name):
    result = _same_as_cpu(PROMOTIONS[name])
    if isinstance(result, Exception):
        assert str(_on("cpu", PROMOTIONS[name])).split(",")[0].rstrip(".") in str(result)


def test_result_type_of_jax_tensors_and_cpu_scalars_as_pytorch():
    def operands(device):
        return [
            _ints(torch.int32, device),
            _ints(torch.uint8, device),
            torch.ones(2, dtype=torch.float16, device=device),
            torch.tensor(2.5, dtype=torch.float64, device=device),
            torch.tensor(2.5, dtype=torch.float64),  # a 0-d CPU tensor next to jax tensors
            torch.tensor(True, device=device),
            3,
            2.5,
            1j,
            True,
        ]

    cpu, jax = operands("cpu"), operands("jax")
    for i in range(len(cpu)):
        for j in range(len(cpu)):
            if isinstance(cpu[i], torch.Tensor) or isinstance(cpu[j], torch.Tensor):
                assert torch.result_type(jax[i], jax[j]) == torch.result_type(cpu[i], cpu[j]), (
                    cpu[i],
                    cpu[j],
                )


def _floats(dtype, device):
    return torch.tensor([1.0, 2.0, 3.0], dtype=dtype, device=device)


LERPS = {
    "half_scalar_weight": lambda d: torch.lerp(
        _floats(torch.float16, d), _floats(torch.float16, d) * 3, 0.3
    ),
    "bfloat16_tensor_weight": lambda d: torch.lerp(
        _floats(torch.bfloat16, d), _floats(torch.bfloat16, d) * 3, _floats(torch.bfloat16, d) / 7
    ),
    "double_0d_weight_keeps_float": lambda d: torch.lerp(
        _floats(torch.float32, d), _floats(torch.float32, d) * 3, torch.tensor(0.25).double().to(d)
    ),
    "double_end_refused": lambda d: torch.lerp(
        _floats(torch.float32, d), _floats(torch.float64, d), 0.5
    ),
    "double_0d_end_refused": lambda d: torch.lerp(
        _floats(torch.float32, d), torch.tensor(1.0, dtype=torch.float64, device=d), 0.5
    ),
    "double_weight_refused": lambda d: torch.lerp(
        _floats(torch.float32, d), _floats(torch.float32, d), _floats(torch.float64, d)
    ),
    "integers_refused": lambda d: torch.lerp(_ints(torch.int64, d), _ints(torch.int64, d), 0.5),
    "into_float64_out": lambda d: torch.lerp(
        _floats(torch.float32, d),
        _floats(torch.float32, d) * 2,
        0.5,
        out=torch.empty(3, dtype=torch.float64, device=d),
    ),
}


@pytest.mark.parametrize("name", sorted(LERPS))
def test_lerp_dtypes_and_errors_as_pytorch(name):
    result = _same_as_cpu(LERPS[name])
    if isinstance(result, Exception):
        assert str(_on("cpu", LERPS[name])) in str(result)


def test_index_put_refuses_values_of_another_dtype_as_pytorch():
    def put(device):
        target = torch.ones(5, 2, dtype=torch.double, device=device)
        target[:, [1]] = torch.zeros(5, 1, dtype=torch.int32, device=device)
        return target

    error = _same_as_cpu(put)
    assert "Index put requires the source and destination dtypes match" in str(error)


@pytest.mark.parametrize(
    ("source", "target"),
    [
        (torch.int64, torch.complex64),
        (torch.complex64, torch.float64),
        (torch.int32, torch.float32),
    ],
)
def test_view_dtype_of_empty_tensors_between_same_size_dtypes(source, target):
    # Same element size, one side complex: no bytes to regroup.
    _same_as_cpu(lambda d: torch.zeros(0, 5, 4, dtype=source, device=d).view(target))


def test_setitem_checks_the_shape_before_the_dtype_and_casts_one_masked_value():
    def wrong_shape_and_dtype(device):
        target = torch.arange(4, device=device)
        target[target > -1] = torch.tensor([1.0, 2.0], device=device)
        return target

    def one_value(device):
        target = torch.ones(2, 3, dtype=torch.long, device=device)
        target[target > 0] = torch.tensor([5.0], device=device)
        return target

    assert "shape mismatch" in str(_same_as_cpu(wrong_shape_and_dtype))
    _same_as_cpu(one_value)


# -- set_ ---------------------------------------------------------------------------------------

SETS = {
    "storage_strided": lambda b, a: b.set_(a.untyped_storage(), 2, (2, 2), (1, 2)),
    "storage_whole": lambda b, a: b.set_(a.untyped_storage()),
    "storage_transposed_3d": lambda b, a: b.set_(a.untyped_storage(), 1, (2, 1, 2), (1, 5, 3)),
    "tensor_view": lambda b, a: b.set_(a[1:].view(-1, 1)),
}


@pytest.mark.parametrize("name", sorted(SETS))
def test_set_shares_the_storage_both_ways_as_pytorch(name):
    def run(device):
        a = torch.arange(6.0, device=device)
        b = SETS[name](torch.empty(0, device=device), a)
        assert b.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()
        b.mul_(10)  # through b into a ...
        a[5] = -1.0  # ... and through a into b
        return torch.cat([b.flatten().clone(), a]).view(1, -1), b

    expected, actual = _on("cpu", run), _on("jax", run)
    if isinstance(expected, Exception):
        assert type(actual) is type(expected) and str(expected) in str(actual), actual
        return
    assert not isinstance(actual, Exception), actual
    for got, want in zip(actual, expected, strict=True):
        assert (got.shape, got.stride(), got.storage_offset()) == (
            want.shape,
            want.stride(),
            want.storage_offset(),
        )
        torch.testing.assert_close(got.cpu(), want)


def test_set_past_the_end_of_a_storage_is_refused():
    # PyTorch grows the shared storage in place; torchlax cannot (docs/semantics.md).
    a = torch.arange(6.0, device="jax")
    with pytest.raises(RuntimeError, match="past the storage's 6 elements"):
        torch.empty(0, device="jax").set_(a.untyped_storage(), 4, (2, 2), (2, 1))
    with pytest.raises(RuntimeError, match="not a jax tensor's storage"):
        torch.empty(0, device="jax").set_(torch.arange(6.0).untyped_storage())


# -- argument errors PyTorch's kernels raise (JAX would raise its own, or nothing) ---------------


def _ones(*shape, dtype=torch.float32):
    return lambda device: torch.ones(shape, dtype=dtype, device=device)


ARGUMENT_ERRORS = {
    "add_not_broadcasting": lambda d: _ones(2)(d) + _ones(3)(d),
    "add_in_place_not_broadcasting": lambda d: _ones(2, 3)(d).add_(_ones(2)(d)),
    "add_in_place_growing": lambda d: _ones(2)(d).add_(_ones(3, 2)(d)),
    "mul_out_not_broadcasting": lambda d: torch.mul(_ones(2)(d), _ones(3)(d), out=_ones(2)(d)),
    "where_not_broadcasting": lambda d: torch.where(
        _ones(4, dtype=torch.bool)(d), _ones(3)(d), _ones(3)(d)
    ),
    "maximum_not_broadcasting": lambda d: torch.maximum(_ones(2)(d), _ones(3)(d)),
    "addcmul_not_broadcasting": lambda d: torch.addcmul(_ones(2)(d), _ones(3)(d), _ones(2)(d)),
    "mm_shapes": lambda d: _ones(2, 3)(d) @ _ones(2, 3)(d),
    "bmm_shapes": lambda d: torch.bmm(_ones(2, 2, 3)(d), _ones(2, 2, 3)(d)),
    "dot_lengths": lambda d: torch.dot(_ones(2)(d), _ones(3)(d)),
    "cat_sizes": lambda d: torch.cat([_ones(2, 3)(d), _ones(2, 4)(d)]),
    "stack_sizes": lambda d: torch.stack([_ones(2)(d), _ones(3)(d)]),
    "bitwise_and_of_floats": lambda d: _ones(2)(d) & _ones(2)(d),
    "gcd_of_floats": lambda d: torch.gcd(_ones(2)(d), _ones(2)(d)),
    "transpose_dim_out_of_range": lambda d: _ones(2, 3)(d).transpose(0, 2),
    "flip_dim_out_of_range": lambda d: _ones(2, 3)(d).flip(2),
    "flip_repeated_dim": lambda d: _ones(2, 3)(d).flip(1, -1),
    "t_of_3d": lambda d: _ones(2, 3, 4)(d).t(),
}


@pytest.mark.parametrize("name", sorted(ARGUMENT_ERRORS))
def test_argument_errors_as_pytorch(name):
    # The exception type and PyTorch's message: "+" must not become "unsupported operand type(s)".
    expected, actual = _on("cpu", ARGUMENT_ERRORS[name]), _on("jax", ARGUMENT_ERRORS[name])
    assert isinstance(expected, Exception), "PyTorch accepts the case: fix it"
    assert type(actual) is type(expected), f"{actual!r} instead of {expected!r}"
    assert str(expected) in str(actual), actual


def test_a_failing_lowering_on_arguments_pytorch_accepts_keeps_its_error():
    # The meta kernel accepts these shapes: JAX's own error stands (nothing is made up).
    from torchlax_core import _meta_errors

    jax_error = TypeError("add got incompatible shapes for broadcasting")
    args = (torch.ones(2, 3, device="jax"), torch.ones(3, device="jax"))
    assert _meta_errors.pytorch_error(torch.ops.aten.add.Tensor, args, {}, jax_error) is None
    refused = _meta_errors.pytorch_error(
        torch.ops.aten.add.Tensor, (args[0], torch.ones(2, device="jax")), {}, jax_error
    )
    assert isinstance(refused, RuntimeError) and "must match the size" in str(refused)


# -- empty and zero-size index tensors ------------------------------------------------------------

EMPTY_INDICES = {
    "empty_list": lambda d: _grid(d)[[]],
    "empty_list_second_dim": lambda d: _grid(d)[:, []],
    "index_of_shape_0x2": lambda d: _grid(d)[torch.zeros(0, 2, dtype=torch.long, device=d)],
    "index_of_shape_0x2_second_dim": lambda d: _grid(d)[
        :, torch.zeros(0, 2, dtype=torch.long, device=d)
    ],
    "put_through_index_of_shape_0x2": _put(
        lambda d: torch.zeros(0, 2, dtype=torch.long, device=d), lambda d: torch.tensor(1.0)
    ),
}


@pytest.mark.parametrize("name", sorted(EMPTY_INDICES))
def test_empty_index_tensors_as_pytorch(name):
    _same_as_cpu(EMPTY_INDICES[name])
