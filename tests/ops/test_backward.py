"""Backward ops (backward.py) and ops models need (isin, sdpa) against eager PyTorch on the CPU."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from _compare_cpu import check, grads_match  # noqa: E402

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.mark.parametrize(
    "sizes,offset,dim1,dim2",
    [
        ([4, 5], 0, 0, 1),
        ([4, 5], 2, 0, 1),
        ([4, 5], -1, 1, 0),
        ([2, 3, 4], 1, -1, 0),
    ],
)
def test_diagonal_backward(sizes, offset, dim1, dim2):
    grad = torch.diagonal(torch.randn(sizes), offset, dim1, dim2).contiguous()
    check(lambda g: aten.diagonal_backward(g, sizes, offset, dim1, dim2), grad)


@pytest.mark.parametrize(
    "sizes,dim,size,step",
    [
        ([10], 0, 3, 2),
        ([10], 0, 3, 3),
        ([10], 0, 2, 4),
        ([3, 9, 2], 1, 4, 1),
        ([3, 9, 2], -1, 1, 1),
        ([], 0, 1, 1),
    ],
)
def test_unfold_backward(sizes, dim, size, step):
    grad = torch.randn(sizes).unfold(dim, size, step).contiguous()
    grad = torch.randn_like(grad, dtype=torch.float64)
    check(lambda g: aten.unfold_backward(g, sizes, dim, size, step), grad)


def test_unfold_and_diagonal_grads():
    grads_match(
        lambda x: x.unfold(1, 3, 2).sin().sum() + x.diagonal(1).pow(2).sum(), [torch.randn(6, 7)]
    )


@pytest.mark.parametrize("dim", [0, 2])  # PyTorch's fused kernel: first or last dim only
def test_weight_norm_interface_backward(dim):
    v, g = torch.randn(4, 3, 2, dtype=torch.float64), torch.randn(4, 1, 1, dtype=torch.float64)
    if dim == 2:
        g = torch.randn(1, 1, 2, dtype=torch.float64)

    def backward(grad_w, v, g):
        w, norms = aten._weight_norm_interface(v, g, dim)
        return aten._weight_norm_interface_backward(grad_w, v, g, norms, dim)

    check(backward, torch.randn(4, 3, 2, dtype=torch.float64), v, g, jit=False)


@pytest.mark.parametrize(
    "elements,tests",
    [
        (torch.tensor([[1, 2, 3], [4, 5, 0]]), torch.tensor([0, 2, 7])),
        (torch.tensor([1.5, 2.0, -1.0]), torch.tensor([2, -1], dtype=torch.int32)),
        (torch.tensor([1, 2, 3], dtype=torch.int8), torch.tensor([[3.0], [1.0]])),
    ],
)
@pytest.mark.parametrize("invert", [False, True])
def test_isin(elements, tests, invert):
    check(lambda e, t: torch.isin(e, t, invert=invert), elements, tests)


def test_isin_scalars():
    check(lambda e: torch.isin(e, 3), torch.tensor([1, 3, 5]))
    check(lambda t: torch.isin(2, t), torch.tensor([1, 2]))
    check(lambda t: torch.isin(4, t, invert=True), torch.tensor([1, 2]))


# -- scaled_dot_product_attention: only export and dynamo graphs reach its lowering -----------------


def _sdpa_lowering():
    import torchlax_core

    return torchlax_core.default_env().lowering_for(aten.scaled_dot_product_attention.default).fn


SDPA_CASES = {
    "plain": ((2, 4, 5, 8), (2, 4, 7, 8), {}),
    "causal": ((2, 4, 5, 8), (2, 4, 5, 8), {"is_causal": True}),
    "scale": ((1, 2, 3, 4), (1, 2, 6, 4), {"scale": 0.3}),
    "bool_mask": ((2, 2, 4, 8), (2, 2, 6, 8), {"attn_mask": torch.rand(4, 6) > 0.3}),
    "bool_mask_fully_masked_row": (
        (1, 2, 3, 4),
        (1, 2, 3, 4),
        {
            "attn_mask": torch.tensor(
                [[True, False, True], [False, False, False], [True, True, True]]
            )
        },
    ),
    "float_mask": ((2, 2, 4, 8), (2, 2, 6, 8), {"attn_mask": torch.randn(2, 1, 4, 6)}),
    "gqa": ((2, 4, 5, 8), (2, 2, 7, 8), {"enable_gqa": True}),
}


@pytest.mark.parametrize("name", SDPA_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_scaled_dot_product_attention_lowering(name, dtype):
    import jax
    import jax.numpy as jnp

    q_shape, kv_shape, kwargs = SDPA_CASES[name]
    q = torch.randn(q_shape, dtype=dtype)
    k, v = torch.randn(kv_shape, dtype=dtype), torch.randn(kv_shape, dtype=dtype)
    if "attn_mask" in kwargs and kwargs["attn_mask"].is_floating_point():
        kwargs = {**kwargs, "attn_mask": kwargs["attn_mask"].to(dtype)}
    expected = F.scaled_dot_product_attention(q, k, v, **kwargs)
    mask = kwargs.get("attn_mask")
    with jax.enable_x64(True):  # as the core runs every lowering
        jax_kwargs = {**kwargs, "attn_mask": None if mask is None else jnp.asarray(mask.numpy())}
        actual = _sdpa_lowering()(*(jnp.asarray(t.numpy()) for t in (q, k, v)), **jax_kwargs)
    assert actual.dtype == jnp.dtype(str(dtype).removeprefix("torch."))
    torch.testing.assert_close(
        torch.from_numpy(np.asarray(actual).copy()), expected, atol=1e-5, rtol=1e-5
    )


def test_scaled_dot_product_attention_dropout_keeps_expectation():
    import jax
    import jax.numpy as jnp
    import torchlax_core

    q = k = v = jnp.ones((1, 1, 4, 4), jnp.float32)
    with jax.enable_x64(True), torchlax_core.enable():
        torch.manual_seed(0)
        first = _sdpa_lowering()(q, k, v, dropout_p=0.5)
        second = _sdpa_lowering()(q, k, v, dropout_p=0.5)
    # Weights 1/4 each survive with p=0.5 at 1/2: every output is a multiple of 0.5, and two
    # calls draw different keys.
    assert set(np.unique(np.asarray(first) * 2).tolist()) <= set(range(9))
    assert not np.array_equal(np.asarray(first), np.asarray(second))


def test_arange_with_a_symbolic_bound_exports():
    # jax.export's shape polymorphism hands arange a symbolic dim as its bound (dynamic export).
    import jax
    import jax.numpy as jnp
    from torchlax_ops._lowerings.factories import arange, arange_start_step

    with jax.enable_x64(True):
        (n,) = jax.export.symbolic_shape("n")
        spec = jax.ShapeDtypeStruct((n,), jnp.int64)
        plus = jax.export.export(jax.jit(lambda x: arange(x.shape[0]) + x))(spec)
        strided = jax.export.export(jax.jit(lambda x: arange_start_step(2, x.shape[0], 3)))(spec)
        x = np.arange(10, dtype=np.int64)
        np.testing.assert_array_equal(plus.call(x), torch.arange(10).numpy() + x)
        got = strided.call(x)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, torch.arange(2, 10, 3).numpy())
