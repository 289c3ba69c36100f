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
