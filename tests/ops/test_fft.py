"""torch.fft, stft/istft, windows and complex-number ops on torchlax Tensors against eager PyTorch."""

from __future__ import annotations

import os
import sys

import jax
import pytest
import torch
import torchlax_core

sys.path.insert(0, os.path.dirname(__file__))
from _compare_cpu import assert_same, check, grads_match, to_jax  # noqa: E402

torch.manual_seed(0)
F32, F64, C64, C128 = torch.float32, torch.float64, torch.complex64, torch.complex128
fft = torch.fft


def tol(*tensors):
    single = any(t.dtype in (F32, C64) for t in tensors if isinstance(t, torch.Tensor))
    return dict(atol=1e-5, rtol=1e-5) if single else dict(atol=1e-10, rtol=1e-10)


REAL = torch.randn(3, 8, dtype=F64)
REAL32 = torch.randn(2, 3, 10)
CPLX = torch.randn(3, 8, dtype=C128)
CPLX64 = torch.randn(2, 4, 6, dtype=C64)

TRANSFORMS = {
    # every torch.fft transform, real and complex inputs, each norm, padding and trimming
    "fft_real": (fft.fft, REAL),
    "fft_complex_ortho": (lambda x: fft.fft(x, norm="ortho"), CPLX),
    "fft_n_pad_forward": (lambda x: fft.fft(x, n=11, norm="forward"), REAL32),
    "fft_int64": (fft.fft, torch.arange(6) - 2),
    "fft_bool": (fft.fft, torch.tensor([True, False, True, True])),
    "ifft_real": (fft.ifft, REAL32),
    "ifft_complex_trim": (lambda x: fft.ifft(x, n=5, dim=0), CPLX),
    "ifft_none": (lambda x: fft.ifft(x, norm="forward"), CPLX64),
    "fft2": (fft.fft2, REAL32),
    "fft2_complex_s": (lambda x: fft.fft2(x, s=(3, 7), norm="ortho"), CPLX64),
    "ifft2": (lambda x: fft.ifft2(x, dim=(0, 2)), CPLX64),
    "fftn_all": (fft.fftn, REAL32),
    "fftn_5d": (lambda x: fft.fftn(x, norm="ortho"), torch.randn(2, 3, 2, 3, 4, dtype=F64)),
    "ifftn_dims": (lambda x: fft.ifftn(x, dim=(2, 0)), CPLX64),
    "rfft": (fft.rfft, REAL),
    "rfft_odd_n": (lambda x: fft.rfft(x, n=7, norm="forward"), REAL32),
    "rfft2_ortho": (lambda x: fft.rfft2(x, norm="ortho"), REAL32),
    "rfftn_unsorted_dims": (lambda x: fft.rfftn(x, dim=(2, 0)), REAL32),
    "rfftn_4d": (lambda x: fft.rfftn(x, dim=(3, 0, 1, 2)), torch.randn(2, 3, 4, 5, dtype=F64)),
    "irfft": (fft.irfft, CPLX),
    "irfft_n_odd": (lambda x: fft.irfft(x, n=9, norm="ortho"), CPLX64),
    "irfft_real_input": (fft.irfft, REAL32),
    "irfft2": (lambda x: fft.irfft2(x, s=(4, 6)), CPLX64),
    "irfftn_forward": (lambda x: fft.irfftn(x, norm="forward"), CPLX64),
    "hfft": (fft.hfft, CPLX),
    "hfft_real_n": (lambda x: fft.hfft(x, n=6, norm="ortho"), REAL32),
    "hfft2": (fft.hfft2, CPLX64),
    "hfftn_s": (lambda x: fft.hfftn(x, s=(3, 6)), CPLX64),
    "ihfft": (fft.ihfft, REAL),
    "ihfft_forward": (lambda x: fft.ihfft(x, norm="forward"), REAL32),
    "ihfft2": (fft.ihfft2, REAL32),
    "ihfftn": (lambda x: fft.ihfftn(x, dim=(0, 2)), REAL32),
    # helpers
    "fftshift": (fft.fftshift, REAL32),
    "ifftshift_dim": (lambda x: fft.ifftshift(x, dim=-1), CPLX64),
}


@pytest.mark.parametrize("name", TRANSFORMS)
def test_transform(name):
    fn, x = TRANSFORMS[name]
    expected = fn(x)
    actual = check(fn, x, **tol(x, expected))
    assert not actual.is_conj()


@pytest.mark.parametrize(
    "dtype,result", [(F32, C64), (F64, C128), (torch.int64, C64), (torch.bool, C64)]
)
def test_result_dtypes(dtype, result):
    x = torch.ones(4, dtype=dtype)
    with torchlax_core.enable():
        xj = x.to("jax")
        assert fft.fft(xj).dtype == result
        assert fft.rfft(xj).dtype == result
        assert fft.irfft(fft.rfft(xj)).dtype == result.to_real()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_is_refused_as_on_cpu(dtype):
    x = torch.randn(8, dtype=dtype)
    with pytest.raises(Exception, match="Unsupported dtype") as cpu:
        fft.fft(x)
    with torchlax_core.enable(), pytest.raises(type(cpu.value)):
        fft.fft(x.to("jax"))


def test_under_torchlax_jit():
    import torchlax

    def spectrum(x):
        return fft.irfft(fft.rfft(x, norm="ortho") * 2, n=x.shape[-1], norm="ortho")

    x = torch.randn(3, 16)
    with torchlax_core.enable():
        actual = torchlax.jit(spectrum)(x.to("jax"))
    assert_same(actual, spectrum(x))


def test_lowering_is_traceable_by_jax():
    x = torch.randn(4, 6, dtype=F64)
    with torchlax_core.enable():
        jitted = jax.jit(lambda a: fft.fft2(torchlax_core.wrap(a)).jax())
        actual = torchlax_core.wrap(jitted(x.to("jax").jax()))
    assert_same(actual, fft.fft2(x), atol=1e-12, rtol=1e-12)


OUT_VARIANTS = {
    "fft": (lambda x, out: fft.fft(x, out=out), REAL32, torch.empty(2, 3, 10, dtype=C64)),
    "rfft": (lambda x, out: fft.rfft(x, out=out), REAL, torch.empty(3, 5, dtype=C128)),
    "irfft": (lambda x, out: fft.irfft(x, out=out), CPLX64, torch.empty(2, 4, 10)),
    "ifft2": (lambda x, out: fft.ifft2(x, out=out), CPLX64, torch.empty(2, 4, 6, dtype=C64)),
    "complex": (
        lambda x, out: torch.complex(x, x * 2, out=out),
        REAL,
        torch.empty(3, 8, dtype=C128),
    ),
    "polar": (lambda x, out: torch.polar(x.abs(), x, out=out), REAL, torch.empty(3, 8, dtype=C128)),
}


@pytest.mark.parametrize("name", OUT_VARIANTS)
def test_out(name):
    fn, x, out = OUT_VARIANTS[name]

    def with_out(x, out):
        result = fn(x, out)
        return result, out

    expected = with_out(x, out.clone())
    check(with_out, x, out, jit=False, **tol(x, out))
    with torchlax_core.enable():
        out_j = out.to("jax")
        result = fn(x.to("jax"), out_j)
    assert result is out_j
    assert_same(out_j, expected[1], **tol(x, out))


def test_out_of_the_wrong_dtype_is_refused():
    with torchlax_core.enable(), pytest.raises(RuntimeError, match="complex output"):
        fft.fft(REAL.to("jax"), out=torch.empty(3, 8, dtype=F64, device="jax"))


# -- stft / istft / frequencies / windows ----------------------------------------------------------


def test_stft():
    signal, window = torch.randn(2, 50), torch.hann_window(16)

    def fn(x, w):
        return torch.stft(x, 16, hop_length=4, window=w, return_complex=True)

    check(fn, signal, window)


def test_stft_method_onesided_false_complex_signal():
    signal, window = torch.randn(40, dtype=C128), torch.hamming_window(8, dtype=F64)
    check(
        lambda x, w: x.stft(8, window=w, center=False, return_complex=True),
        signal,
        window,
        atol=1e-10,
        rtol=1e-10,
    )


def test_stft_with_a_window_made_on_the_device():
    signal = torch.randn(60, dtype=F64)

    def fn(x):
        window = torch.hann_window(12, dtype=x.dtype, device=x.device)
        return torch.stft(x, 12, window=window, return_complex=True, normalized=True)

    check(fn, signal, atol=1e-10, rtol=1e-10)


def test_istft_round_trip_eager():
    # istft checks its window envelope on the host (``aten.equal``): eager only.
    window = torch.hann_window(16, dtype=F64)
    spec = torch.stft(
        torch.randn(80, dtype=F64), 16, hop_length=4, window=window, return_complex=True
    )
    check(
        lambda s, w: torch.istft(s, 16, hop_length=4, window=w),
        spec,
        window,
        jit=False,
        atol=1e-10,
        rtol=1e-10,
    )


@pytest.mark.parametrize("dtype", [None, F64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n,d", [(7, 0.5), (8, 1.0), (1, 0.3), (0, 1.0), (5, -2.0), (4, 0.0)])
def test_frequencies_exact(dtype, n, d):
    with torchlax_core.enable():
        for fn in (fft.fftfreq, fft.rfftfreq):
            expected = fn(n, d, dtype=dtype)
            actual = fn(n, d, dtype=dtype, device="jax")
            assert_same(actual, expected, atol=0, rtol=0)


WINDOWS = {
    "hann": lambda n, p, **kw: torch.hann_window(n, p, **kw),
    "hamming": lambda n, p, **kw: torch.hamming_window(n, p, **kw),
    "hamming_alpha_beta": lambda n, p, **kw: torch.hamming_window(n, p, 0.6, 0.3, **kw),
    "blackman": lambda n, p, **kw: torch.blackman_window(n, p, **kw),
    "bartlett": lambda n, p, **kw: torch.bartlett_window(n, p, **kw),
    "kaiser": lambda n, p, **kw: torch.kaiser_window(n, p, 5.0, **kw),
}


@pytest.mark.parametrize("name", WINDOWS)
@pytest.mark.parametrize("dtype", [None, F64, torch.float16, torch.bfloat16])
def test_windows(name, dtype):
    make = WINDOWS[name]
    atol = 1e-6 if dtype is None else 1e-14 if dtype == F64 else 0.0  # half types: bit-exact
    with torchlax_core.enable():
        for n in (0, 1, 2, 5, 8, 33, 300):
            for periodic in (True, False):
                expected = make(n, periodic, dtype=dtype)
                actual = make(n, periodic, dtype=dtype, device="jax")
                assert_same(actual, expected, atol=atol, rtol=0, what=f"{name}({n}, {periodic})")


def test_window_of_an_integer_dtype_is_refused():
    with torchlax_core.enable(), pytest.raises(RuntimeError, match="floating point"):
        torch.hann_window(8, dtype=torch.int64, device="jax")


# -- complex numbers -------------------------------------------------------------------------------


def test_complex_and_polar_broadcast():
    check(torch.complex, torch.randn(3, 1), torch.randn(4))
    check(torch.polar, torch.rand(3, 1, dtype=F64), torch.randn(4, dtype=F64))


def test_complex_of_mixed_dtypes_is_refused():
    with torchlax_core.enable(), pytest.raises(RuntimeError, match="same dtype"):
        torch.complex(torch.randn(2, device="jax"), torch.randn(2, dtype=F64, device="jax"))


def test_polar_special_values():
    abs_ = torch.tensor([0.0, 1.0, float("inf"), 2.0, float("nan")], dtype=F64)
    angle = torch.tensor([0.0, float("inf"), 0.0, -1.5, 1.0], dtype=F64)
    check(torch.polar, abs_, angle)


def test_conj_is_a_materialised_view():
    c = torch.randn(3, 4, dtype=C64)
    with torchlax_core.enable():
        cj = c.to("jax")
        view = cj.conj()
        # torchlax has no conjugate bit: the view holds conjugated values.
        assert not view.is_conj()
        assert view.resolve_conj() is view
        assert_same(view, c.conj().resolve_conj(), atol=0, rtol=0)
        assert view._base is cj
        cj.mul_(2)  # reads through the view see the base's new values
        assert_same(view, (2 * c).conj().resolve_conj(), atol=0, rtol=0)
        view.add_(1j)  # a write through the view reaches the base, conjugated as in PyTorch
        expected = 2 * c
        expected.conj().add_(1j)
        assert_same(cj, expected, atol=0, rtol=0)


def test_neg_view_is_materialised_too():
    x = torch.randn(4, dtype=C64)
    with torchlax_core.enable():
        view = torch._neg_view(x.to("jax"))
    assert not view.is_neg()
    assert_same(view, torch._neg_view(x).resolve_neg(), atol=0, rtol=0)


def test_conj_physical_and_methods():
    c = torch.randn(5, dtype=C128)
    check(torch.conj_physical, c)
    check(lambda x: x.conj() * x, c)
    check(lambda x: x.clone().conj_physical_(), c, jit=False)
    check(torch.conj, torch.randn(4))  # real: the tensor itself


def test_conj_under_jit():
    check(lambda x: (x.conj() + fft.fft(x).conj()).resolve_conj(), torch.randn(6, dtype=C64))


# -- autograd --------------------------------------------------------------------------------------

GRADS = {
    "rfft": lambda x: fft.rfft(x, norm="ortho").abs().sum(),
    "fft2": lambda x: fft.fft2(x).real.pow(2).sum(),
    "irfft": lambda x: fft.irfft(torch.complex(x, x.flip(-1)), n=10).pow(2).sum(),
    "hfft_ihfft": lambda x: fft.hfft(fft.ihfft(x) * 2).pow(2).sum(),
    "polar": lambda x: torch.polar(x.abs() + 0.1, x).imag.sum(),
    "stft": lambda x: (
        torch.stft(
            x.flatten(),
            8,
            window=torch.hann_window(8, dtype=x.dtype, device=x.device),
            return_complex=True,
        )
        .abs()
        .sum()
    ),
}


# stft's backward costs ~10 s of first-time XLA compiles of its ops in a fresh process.
@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n == "stft" else n for n in GRADS]
)
def test_grad(name):
    grads_match(GRADS[name], [torch.randn(3, 8, dtype=F64)], atol=1e-10, rtol=1e-10)


def test_grad_of_a_complex_leaf():
    c = torch.randn(2, 6, dtype=C128, requires_grad=True)
    fft.ifft(c, norm="ortho").abs().pow(2).sum().backward()
    (cj,) = to_jax([c.detach()])
    cj.requires_grad_(True)
    with torchlax_core.enable():
        fft.ifft(cj, norm="ortho").abs().pow(2).sum().backward()
    assert_same(cj.grad, c.grad, atol=1e-10, rtol=1e-10)
