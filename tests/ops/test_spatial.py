"""Spatial ops on torchlax Tensors against eager PyTorch on the CPU: grid sampling, antialiased
resampling, fractional and adaptive pooling, half-precision convolution; values, dtypes, shapes,
eagerly and under jax.jit, and gradients."""

from __future__ import annotations

import itertools
import os
import sys

import pytest
import torch
import torch.nn.functional as F
import torchlax_core

sys.path.insert(0, os.path.dirname(__file__))
from _compare_cpu import check, grads_match, to_jax  # noqa: E402

aten = torch.ops.aten
EXACT = {"atol": 0.0, "rtol": 0.0}


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def grid(*shape, dtype=torch.float32):
    """Sampling positions in [-1.2, 1.2]: some fall outside the input, exercising the padding."""
    return torch.rand(*shape, dtype=dtype) * 2.4 - 1.2


def tolerance(dtype):
    # bfloat16 follows PyTorch's scalar kernel step by step, so it matches exactly.
    return EXACT if dtype == torch.bfloat16 else {"atol": 1e-5, "rtol": 1e-5}


# -- grid sampling --------------------------------------------------------------------------------

# Each padding mode once per interpolation mode, both align_corners values across them: every
# configuration is a separate XLA compile, so the grid stays small.
PADDINGS = [("zeros", False), ("border", True), ("reflection", False), ("reflection", True)]


def sample_paddings(x, g, mode, dtype):
    """Each padding eagerly; one of them under jit as well."""
    for padding_mode, align_corners in PADDINGS:
        check(
            lambda x, g, p=padding_mode, a=align_corners: F.grid_sample(
                x, g, mode=mode, padding_mode=p, align_corners=a
            ),
            x,
            g,
            jit=padding_mode == "border",
            **tolerance(dtype),
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
def test_grid_sample_2d(mode, dtype):
    x, g = torch.randn(2, 3, 7, 9, dtype=dtype), grid(2, 5, 4, 2, dtype=dtype)
    sample_paddings(x, g, mode, dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_grid_sample_3d(mode, dtype):
    x, g = torch.randn(2, 3, 4, 5, 6, dtype=dtype), grid(2, 3, 4, 2, 3, dtype=dtype)
    sample_paddings(x, g, mode, dtype)


def test_grid_sampler_aten_ops():
    x, g = torch.randn(1, 2, 5, 20), grid(1, 13, 10, 2)
    check(aten.grid_sampler_2d, x, g, 0, 0, False)
    x3, g3 = torch.randn(1, 2, 3, 4, 5), grid(1, 2, 3, 4, 3)
    check(aten.grid_sampler_3d, x3, g3, 1, 2, True)


@pytest.mark.parametrize(
    ("mode", "padding_mode", "align_corners"),
    [
        ("bilinear", "zeros", False),
        ("bilinear", "reflection", True),
        ("nearest", "border", False),
        ("bicubic", "reflection", False),
    ],
)
def test_grid_sample_2d_grads(mode, padding_mode, align_corners):
    x, g = torch.randn(2, 3, 5, 6, dtype=torch.float64), grid(2, 4, 3, 2, dtype=torch.float64)
    grads_match(
        lambda x, g: (
            F.grid_sample(x, g, mode=mode, padding_mode=padding_mode, align_corners=align_corners)
            .pow(2)
            .sum()
        ),
        [x, g],
        atol=1e-9,
        rtol=1e-9,
    )


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_grid_sample_3d_grads(mode):
    x, g = torch.randn(1, 2, 3, 4, 5, dtype=torch.float64), grid(1, 2, 3, 2, 3, dtype=torch.float64)
    grads_match(
        lambda x, g: (
            F.grid_sample(x, g, mode=mode, padding_mode="reflection", align_corners=False)
            .pow(2)
            .sum()
        ),
        [x, g],
        atol=1e-9,
        rtol=1e-9,
    )


def test_affine_grid_then_sample_grads():
    theta = torch.tensor([[[0.9, -0.2, 0.1], [0.3, 1.1, -0.05]]])
    x = torch.randn(1, 3, 6, 6)

    def warp(x, theta):
        g = F.affine_grid(theta, [1, 3, 5, 4], align_corners=False)
        return F.grid_sample(x, g, align_corners=False).sum()

    grads_match(warp, [x, theta], atol=1e-5, rtol=1e-5)


# -- antialiased resampling -----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_interpolate_antialias(mode):
    x = torch.randn(2, 3, 16, 15)
    for size, align_corners in itertools.product(
        [(5, 7), (20, 31), (16, 7), (3, 15)], (False, True)
    ):
        check(
            lambda x, s=size, a=align_corners: F.interpolate(
                x, size=s, mode=mode, antialias=True, align_corners=a
            ),
            x,
            jit=size == (5, 7),
        )


def test_interpolate_antialias_scale_factor_and_float64():
    x = torch.randn(1, 2, 16, 15, dtype=torch.float64)
    check(
        lambda x: F.interpolate(x, scale_factor=(0.3, 0.7), mode="bilinear", antialias=True),
        x,
        atol=1e-12,
        rtol=1e-12,
    )
    # An unchanged axis is left alone even with a scale factor given, as PyTorch does.
    check(
        lambda x: F.interpolate(
            x,
            scale_factor=(0.5, 1.0),
            mode="bilinear",
            antialias=True,
            recompute_scale_factor=False,
        ),
        x,
        atol=1e-12,
        rtol=1e-12,
    )
    check(
        lambda x: aten._upsample_bilinear2d_aa(x, [6, 9], False, None, None),
        x,
        atol=1e-12,
        rtol=1e-12,
    )


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_interpolate_antialias_grads(mode):
    x = torch.randn(1, 2, 9, 8, dtype=torch.float64)
    grads_match(
        lambda x: F.interpolate(x, size=(4, 11), mode=mode, antialias=True).pow(2).sum(),
        [x],
        atol=1e-10,
        rtol=1e-10,
    )


# -- fractional max pooling -------------------------------------------------------------------------

FRACTIONAL_DTYPES = [torch.float32, torch.float64, torch.bfloat16]


@pytest.mark.parametrize("dtype", FRACTIONAL_DTYPES, ids=str)
def test_fractional_max_pool2d(dtype):
    x = torch.randn(2, 3, 11, 13, dtype=dtype)
    samples = torch.rand(2, 3, 2, dtype=dtype)
    check(lambda x, r: aten.fractional_max_pool2d(x, [3, 2], [5, 7], r), x, samples, **EXACT)
    check(
        lambda x, r: F.fractional_max_pool2d(
            x, (2, 3), output_size=(9, 4), return_indices=True, _random_samples=r
        ),
        x[0],
        samples[:1],
        **EXACT,
    )
    check(
        lambda x, r: F.fractional_max_pool2d(x, 2, output_ratio=(0.5, 0.5), _random_samples=r),
        x,
        samples,
        **EXACT,
    )


@pytest.mark.parametrize("dtype", FRACTIONAL_DTYPES, ids=str)
def test_fractional_max_pool3d(dtype):
    x = torch.randn(2, 3, 7, 8, 9, dtype=dtype)
    samples = torch.rand(2, 3, 3, dtype=dtype)
    check(lambda x, r: aten.fractional_max_pool3d(x, [2, 3, 2], [4, 5, 6], r), x, samples, **EXACT)
    check(
        lambda x, r: F.fractional_max_pool3d(
            x, (3, 2, 2), output_size=(3, 6, 5), return_indices=True, _random_samples=r
        ),
        x[1],
        samples[:1],
        **EXACT,
    )


def test_fractional_max_pool_nan_and_ties():
    x = torch.randn(1, 2, 8, 8)
    x[0, 0, 2:4, 2:4] = float("nan")
    x[0, 1] = torch.round(x[0, 1])  # many ties: the first maximum in scan order wins
    samples = torch.rand(1, 2, 2)
    check(lambda x, r: aten.fractional_max_pool2d(x, [2, 2], [5, 5], r), x, samples, **EXACT)


def test_fractional_max_pool_grads():
    x, samples = (
        torch.randn(2, 3, 9, 10, dtype=torch.float64),
        torch.rand(2, 3, 2, dtype=torch.float64),
    )
    grads_match(
        lambda x: (
            F.fractional_max_pool2d(x, 3, output_size=(5, 6), _random_samples=samples.to(x.device))
            .pow(2)
            .sum()
        ),
        [x],
    )
    x3, s3 = (
        torch.randn(1, 2, 6, 7, 8, dtype=torch.float64),
        torch.rand(1, 2, 3, dtype=torch.float64),
    )
    grads_match(
        lambda x: (
            F.fractional_max_pool3d(x, 2, output_size=(4, 5, 3), _random_samples=s3.to(x.device))
            .pow(2)
            .sum()
        ),
        [x3],
    )


def test_fractional_max_pool_draws_its_samples():
    # Without _random_samples the samples are drawn on the jax device: check the structure.
    x = torch.randn(2, 3, 10, 12)
    with torchlax_core.enable():
        out, indices = F.fractional_max_pool2d(
            to_jax(x), 3, output_size=(4, 5), return_indices=True
        )
    assert out.dtype == torch.float32 and out.shape == (2, 3, 4, 5)
    assert indices.dtype == torch.int64 and indices.shape == (2, 3, 4, 5)
    picked = torch.gather(x.flatten(2), 2, indices.cpu().flatten(2)).reshape(out.shape)
    torch.testing.assert_close(out.cpu(), picked, **EXACT)


def test_fractional_max_pool_too_large_pool():
    x = torch.randn(1, 1, 5, 5)
    with torchlax_core.enable(), pytest.raises(RuntimeError, match="too large"):
        aten.fractional_max_pool2d(to_jax(x), [3, 3], [4, 4], to_jax(torch.rand(1, 1, 2)))


# -- adaptive average pooling, 3-d ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_adaptive_avg_pool3d(dtype):
    x = torch.randn(2, 3, 8, 9, 10, dtype=dtype)
    check(lambda x: F.adaptive_avg_pool3d(x, (5, 7, 4)), x, **tolerance(dtype))
    check(lambda x: F.adaptive_avg_pool3d(x, (3, 4, 6)), x[0], **tolerance(dtype))


def test_adaptive_avg_pool3d_grads():
    x = torch.randn(1, 2, 7, 6, 5, dtype=torch.float64)
    grads_match(
        lambda x: F.adaptive_avg_pool3d(x, (3, 4, 2)).pow(2).sum(), [x], atol=1e-10, rtol=1e-10
    )


# -- half-precision convolution -------------------------------------------------------------------


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_bfloat16_convolution_rounds_once(n, transposed):
    """bfloat16 convolution accumulates in float32 and rounds once, after adding the bias."""
    x = torch.randn(2, 4, *([5] * n), dtype=torch.bfloat16)
    if transposed:
        conv = getattr(F, f"conv_transpose{n}d")
        w, b = (
            torch.randn(4, 3, *([3] * n), dtype=torch.bfloat16),
            torch.randn(3, dtype=torch.bfloat16),
        )
        kwargs = {"stride": 2, "padding": 1, "output_padding": 1}
    else:
        conv = getattr(F, f"conv{n}d")
        w, b = (
            torch.randn(6, 2, *([3] * n), dtype=torch.bfloat16),
            torch.randn(6, dtype=torch.bfloat16),
        )
        kwargs = {"stride": 2, "padding": 1, "groups": 2}
    once = conv(x.float(), w.float(), b.float(), **kwargs).bfloat16()
    with torchlax_core.enable():
        actual = conv(*to_jax((x, w, b)), **kwargs)
    assert actual.dtype == torch.bfloat16
    torch.testing.assert_close(actual.cpu(), once, **EXACT)
    if transposed and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        # Without AVX512-BF16 PyTorch's CPU kernel rounds three times (bfloat16 GEMM, col2im
        # sums and bias in bfloat16): `once` above is the reference there.
        return
    check(lambda x, w, b: conv(x, w, b, **kwargs), x, w, b, atol=1e-2, rtol=1.6e-2)
