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


def _stats_body(input, normalized_shape, weight, bias, eps):
    """A stand-in of layer norm: (output, mean, rstd) all in the computation dtype."""
    mean = jnp.mean(input, keepdims=True)
    return input * weight - mean, mean, jnp.ones_like(mean)


@pytest.mark.parametrize("low", [jnp.float16, jnp.bfloat16])
def test_results_round_like_an_argument_or_to_the_common_dtype(low):
    lowered = declared(
        aten.native_layer_norm.default, _stats_body, None, None, True, ("input", None, None)
    )
    x = jnp.arange(4, dtype=low)
    out, mean, rstd = lowered(x, [4], jnp.ones(4, low), None, 1e-5)
    assert (out.dtype, mean.dtype, rstd.dtype) == (low, low, low)
    # A half input with float32 parameters: the output like the input, the statistics float32.
    out, mean, rstd = lowered(x, [4], jnp.ones(4, jnp.float32), None, 1e-5)
    assert (out.dtype, mean.dtype, rstd.dtype) == (low, jnp.float32, jnp.float32)


def test_a_result_declared_float32_stays_float32():
    def body(query, key, value, dropout_p, is_causal, *, attn_mask=None, scale=None):
        return query + key + value, jnp.sum(query, axis=-1)

    op = aten._scaled_dot_product_flash_attention_for_cpu.default
    lowered = declared(op, body, None, ("query", "key", "value"), True, (None, jnp.float32))
    q = jnp.ones((1, 2, 3), jnp.float16)
    out, logsumexp = lowered(q, q, q, 0.0, False)
    assert out.dtype == jnp.float16 and logsumexp.dtype == jnp.float32


def test_a_bool_argument_keeps_float32_when_true():
    seen = []

    def body(self, dim, half_to_float):
        seen.append(self.dtype)
        return self

    lowered = declared(aten._softmax.default, body, None, None, True, ("half_to_float",))
    x = jnp.ones(3, jnp.bfloat16)
    assert lowered(x, 0, True).dtype == jnp.float32  # computed in float32 and kept
    assert lowered(x, 0, False).dtype == jnp.bfloat16
    assert seen == [jnp.float32, jnp.float32]


def test_a_dtype_argument_casts_the_arguments_first_and_decides_the_result():
    seen = []

    def body(self, dim, dtype=None):
        seen.append(self.dtype)
        return self

    lowered = declared(aten._safe_softmax.default, body, None, None, True, ("dtype",))
    # float32 cast to float16 (PyTorch casts first), computed in float32, rounded to float16.
    assert lowered(jnp.ones(2, jnp.float32), 0, torch.float16).dtype == jnp.float16
    assert seen[-1] == jnp.float32
    assert lowered(jnp.ones(2, jnp.float16), 0, torch.float32).dtype == jnp.float32
    assert lowered(jnp.ones(2, jnp.float16), 0).dtype == jnp.float16


def test_a_wrong_results_declaration_is_a_clear_error():
    with pytest.raises(ValueError, match=r"3 results=.*returns 1 values"):
        declared(aten._softmax.default, _seen, None, None, True, (None, None, None))
    with pytest.raises(ValueError, match=r"'dim'.*tensor, ScalarType or bool arguments"):
        declared(aten._softmax.default, _seen, None, None, True, ("dim",))
    with pytest.raises(ValueError, match=r"results= without opmath=True"):
        declared(aten._softmax.default, _seen, None, None, False, (None,))


def test_safe_softmax_to_float16_computes_in_float32_as_pytorch():
    import torchlax_core

    x = torch.randn(4, 50) * 3
    with torchlax_core.enable():
        actual = torch._safe_softmax(x.to("jax"), 1, dtype=torch.float16).cpu()
    torch.testing.assert_close(
        actual, torch._safe_softmax(x, 1, dtype=torch.float16), atol=0, rtol=0
    )
