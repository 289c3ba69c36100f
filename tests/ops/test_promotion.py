"""The declared lowering stanza: promotion and opmath bound to the op's schema."""

from __future__ import annotations

import pathlib

import jax.numpy as jnp
import pytest
import torch
import torchlax_ops
from torchlax_ops._promotion import Promotion, declared

aten = torch.ops.aten


def _seen(*args, **kwargs):
    """A stand-in lowering body: hands back what the wrapper passed it."""
    return args, kwargs


def test_promoted_arguments_are_bound_by_the_schema_not_the_python_signature():
    # polygamma(int n, Tensor self): ``self`` is the schema's second argument, whatever the
    # body's parameters are called.
    lowered = declared(aten.polygamma.default, _seen, Promotion.INT_TO_FLOAT, ("self",), False)
    (n, x), _ = lowered(1, jnp.arange(3, dtype=jnp.int32))
    assert n == 1
    assert x.dtype == jnp.float32


def test_promotion_reaches_arguments_passed_by_keyword_and_casts_the_result():
    def body(self, other):
        return self + other

    lowered = declared(aten.add.Tensor, body, Promotion.DEFAULT, ("self", "other"), False)
    out = lowered(jnp.ones(2, jnp.int32), other=jnp.ones(2, jnp.float16))
    assert out.dtype == jnp.float16  # computed in float32 (opmath), returned in float16


def test_default_arguments_are_the_schemas_tensors_and_scalars():
    lowered = declared(aten.isin.Scalar_Tensor, _seen, Promotion.ALWAYS_BOOL, None, False)
    assert getattr(lowered, "promotion")[0] == ("element", "test_elements")  # noqa: B009  (a marker attribute)


def test_an_argument_missing_from_the_schema_is_a_clear_error():
    with pytest.raises(ValueError, match=r"aten.add.Tensor.*\['x'\].*self, other"):
        declared(aten.add.Tensor, _seen, Promotion.DEFAULT, ("x",), False)


@pytest.mark.parametrize("low", [jnp.float16, jnp.bfloat16])
def test_opmath_computes_half_precision_in_float32_and_casts_back(low):
    dtypes = []

    def body(grad_output, output):
        dtypes.append((grad_output.dtype, output.dtype))
        return grad_output * output, jnp.zeros(1, jnp.int32)

    lowered = declared(aten.tanh_backward.default, body, None, None, True)
    out, index = lowered(jnp.ones(2, low), jnp.ones(2, low))
    assert dtypes == [(jnp.float32, jnp.float32)]
    assert out.dtype == low and index.dtype == jnp.int32
    # Nothing in half precision: the body runs as written.
    out, _ = lowered(jnp.ones(2, jnp.float32), jnp.ones(2, jnp.float32))
    assert dtypes[-1] == (jnp.float32, jnp.float32) and out.dtype == jnp.float32


def test_opmath_keeps_the_common_dtype_of_mixed_precision_arguments():
    lowered = declared(aten.tanh_backward.default, lambda g, y: g * y, None, None, True)
    assert lowered(jnp.ones(2, jnp.float32), jnp.ones(2, jnp.float16)).dtype == jnp.float32


def test_the_half_precision_up_cast_is_written_once():
    # One definition (``_promotion``); the lowering families use the declaration or its helpers.
    package = pathlib.Path(torchlax_ops.__file__).parent
    copies = [
        f"{path.name}: {line.strip()}"
        for path in package.rglob("*.py")
        for line in path.read_text().splitlines()
        if line.startswith(("_LOW_PRECISION =", "_HALF =", "HALF =", "def _opmath(", "def _up("))
    ]
    assert copies == ["_promotion.py: HALF = (np.dtype(jnp.float16), np.dtype(jnp.bfloat16))"]
