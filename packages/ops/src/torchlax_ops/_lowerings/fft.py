"""Discrete Fourier transforms, sample frequencies, windows and complex-number ops.

``torch.fft.*`` and ``stft``/``istft`` reach ATen as three primitives: ``_fft_r2c`` (real to
complex, forward), ``_fft_c2c`` (complex to complex, either direction) and ``_fft_c2r`` (complex
to real, inverse). PyTorch has already promoted integer inputs to the default float dtype,
padded or trimmed the signal, and turned ``norm=`` into an integer ``normalization``:

    0: no scaling, 1: scale by 1/sqrt(n), 2: scale by 1/n

where n is the product of the signal sizes along the transformed dims (the output's, for
c2r). jnp's inverse transforms divide by n themselves; ``_rescale`` turns that into PyTorch's
scaling with at most one multiply.

Conjugation: PyTorch's ``conj()`` is a lazy view (``_conj``) that sets a conjugate bit. A
torchlax Tensor holds a ``jax.Array`` and has no such bit, so ``_conj`` computes the conjugate
as a view of its base: reads see the base's current values conjugated, ``is_conj()`` is False
and ``resolve_conj()`` returns the tensor as is (there is nothing left to resolve); the negative
bit (``_neg_view``) likewise. Writing through a conjugate view raises (the core cannot write a
reinterpreting view back into its base); write to the base, or ``conj_physical()`` for a tensor
of its own.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torchlax_core import jax_dtype, torch_dtype

from .. import _aten
from .._table import lowering

aten = _aten.aten  # (an op this torch lacks: a Missing, skipped)


def _signal_size(shape, dim) -> int:
    return math.prod(shape[d] for d in dim)


def _rescale(out, normalization: int, *, inverse: bool, n: int):
    """Scale jnp's result (inverses already divided by ``n``) as PyTorch's ``normalization``."""
    if normalization not in (0, 1, 2):
        raise RuntimeError(
            f"_fft: normalization must be 0 (none), 1 (by 1/sqrt(n)) or 2 (by 1/n), got "
            f"{normalization!r}."
        )
    if n == 0:
        return out
    if inverse:
        factor = (n, math.sqrt(n), 1)[normalization]
    else:
        factor = (1, 1 / math.sqrt(n), 1 / n)[normalization]
    if factor == 1:
        return out
    return out * jnp.asarray(factor, dtype=jnp.finfo(out.dtype).dtype)


def _check_real(op: str, self) -> None:
    if self.dtype not in (jnp.float32, jnp.float64):
        raise RuntimeError(
            f"{op}: torchlax transforms float32 and float64 signals (to complex64/complex128); "
            f"got a {torch_dtype(self.dtype)} tensor. Convert it with .float() or .double() first."
        )


def _check_complex(op: str, self) -> None:
    if self.dtype not in (jnp.complex64, jnp.complex128):
        raise RuntimeError(
            f"{op}: expects a complex64 or complex128 tensor, got {torch_dtype(self.dtype)}."
        )


def _dims(self, dim) -> list[int]:
    return [d % self.ndim if self.ndim else d for d in dim]


@lowering(aten._fft_r2c.default)
def fft_r2c(self, dim, normalization, onesided):
    _check_real("_fft_r2c", self)
    dim = _dims(self, dim)
    if not dim:
        return self.astype(jnp.result_type(self.dtype, jnp.complex64))
    transform = jnp.fft.rfftn if onesided else jnp.fft.fftn
    out = transform(self, axes=dim)
    return _rescale(out, normalization, inverse=False, n=_signal_size(self.shape, dim))


@lowering(aten._fft_c2c.default)
def fft_c2c(self, dim, normalization, forward):
    _check_complex("_fft_c2c", self)
    dim = _dims(self, dim)
    if not dim:
        return self
    transform = jnp.fft.fftn if forward else jnp.fft.ifftn
    out = transform(self, axes=dim)
    return _rescale(out, normalization, inverse=not forward, n=_signal_size(self.shape, dim))


@lowering(aten._fft_c2r.default)
def fft_c2r(self, dim, normalization, last_dim_size):
    _check_complex("_fft_c2r", self)
    dim = _dims(self, dim)
    sizes = [self.shape[d] for d in dim[:-1]] + [last_dim_size]
    out = jnp.fft.irfftn(self, s=sizes, axes=dim)
    return _rescale(out, normalization, inverse=True, n=math.prod(sizes))


# -- sample frequencies -------------------------------------------------------------------------


def _frequencies(op: str, indices, n: int, d: float, dtype):
    out_dtype = jnp.dtype(jax_dtype(dtype or torch.get_default_dtype()))
    if not jnp.issubdtype(out_dtype, jnp.floating):
        raise RuntimeError(f"{op} requires a floating point dtype, got {torch_dtype(out_dtype)}.")
    # PyTorch multiplies by 1 / (n * d) in the op's compute type (float32 for half types), as
    # C++ doubles: d == 0 gives infinities, not an error.
    compute = jnp.float64 if out_dtype == jnp.float64 else jnp.float32
    with np.errstate(divide="ignore"):
        scale = np.float64(1.0) / np.float64(n * d)
    return (indices.astype(compute) * jnp.asarray(scale, dtype=compute)).astype(out_dtype)


@lowering(aten.fft_fftfreq.default)
def fft_fftfreq(n, d=1.0, *, dtype=None, layout=None, device=None, pin_memory=None):
    indices = jnp.concatenate([jnp.arange((n + 1) // 2), jnp.arange(-(n // 2), 0)])
    return _frequencies("fftfreq", indices, n, d, dtype)


@lowering(aten.fft_rfftfreq.default)
def fft_rfftfreq(n, d=1.0, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _frequencies("rfftfreq", jnp.arange(n // 2 + 1), n, d, dtype)


# -- windows (stft's ``window=torch.hann_window(n, device=x.device)``) ---------------------------
# A window depends only on static arguments: computed with NumPy on the host (no per-length XLA
# compilation), then placed as a constant. PyTorch evaluates it step by step on an arange in the
# window's dtype (for half types: each step in float32 on constants of the window's dtype
# (``c``), then rounded (``r``)); a periodic window is the symmetric one of length n + 1 without
# its last element.


def _window(op: str, window_length: int, periodic: bool, dtype, formula):
    out_dtype = np.dtype(jax_dtype(dtype or torch.get_default_dtype()))
    if not jnp.issubdtype(out_dtype, jnp.floating):
        raise RuntimeError(f"{op} expects floating point dtypes, got: {torch_dtype(out_dtype)}.")
    if window_length < 0:
        raise RuntimeError(
            f"{op} requires non-negative window length, got window_length={window_length}."
        )
    if window_length <= 1:
        return jnp.ones((window_length,), out_dtype)
    n = window_length + 1 if periodic else window_length
    compute = np.dtype(np.float64 if out_dtype == np.float64 else np.float32)

    def r(x):
        return x if out_dtype == compute else x.astype(out_dtype).astype(compute)

    def c(value):
        return r(np.asarray(value, dtype=compute))

    window = formula(r(np.arange(n, dtype=compute)), n, c, r)
    return jnp.asarray(window[:window_length].astype(out_dtype))


@lowering(
    aten.hamming_window.default,
    aten.hamming_window.periodic,
    aten.hamming_window.periodic_alpha,
    aten.hamming_window.periodic_alpha_beta,
)
def hamming_window(
    window_length,
    periodic=True,
    alpha=0.54,
    beta=0.46,
    *,
    dtype=None,
    layout=None,
    device=None,
    pin_memory=None,
):
    def formula(i, n, c, r):
        angle = r(i * c(2 * math.pi / (n - 1)))
        return r(r(np.cos(angle)) * c(-beta)) + c(alpha)

    return _window("hamming_window", window_length, periodic, dtype, formula)


@lowering(aten.hann_window.default, aten.hann_window.periodic)
def hann_window(
    window_length, periodic=True, *, dtype=None, layout=None, device=None, pin_memory=None
):
    return hamming_window(window_length, periodic, 0.5, 0.5, dtype=dtype)


@lowering(aten.blackman_window.default, aten.blackman_window.periodic)
def blackman_window(
    window_length, periodic=True, *, dtype=None, layout=None, device=None, pin_memory=None
):
    def formula(i, n, c, r):
        x = r(i * c(math.pi / (n - 1)))
        first = r(r(np.cos(r(x * c(4)))) * c(0.08))
        second = r(r(np.cos(r(x * c(2)))) * c(0.5))
        return r(first - second) + c(0.42)

    return _window("blackman_window", window_length, periodic, dtype, formula)


@lowering(aten.bartlett_window.default, aten.bartlett_window.periodic)
def bartlett_window(
    window_length, periodic=True, *, dtype=None, layout=None, device=None, pin_memory=None
):
    def formula(i, n, c, r):
        x = r(i * c(2 / (n - 1)))
        return np.where(i >= ((n - 1) >> 1) + 1, c(2) - x, x)

    return _window("bartlett_window", window_length, periodic, dtype, formula)


@lowering(aten.kaiser_window.default, aten.kaiser_window.periodic, aten.kaiser_window.beta)
def kaiser_window(
    window_length,
    periodic=True,
    beta=12.0,
    *,
    dtype=None,
    layout=None,
    device=None,
    pin_memory=None,
):
    def formula(i, n, c, r):
        # One kernel in the compute type: its constants are not rounded to the window's dtype.
        alpha = (n - 1) / 2.0
        ratio = (i.astype(np.float64) - alpha) / alpha
        # abs: an arange rounded to bfloat16 can step past the window's end (ratio > 1).
        window = np.i0(beta * np.sqrt(np.abs(1 - ratio * ratio))) / np.i0(beta)
        return window.astype(i.dtype)

    return _window("kaiser_window", window_length, periodic, dtype, formula)


# -- complex numbers ------------------------------------------------------------------------------


@lowering(aten._conj.default)
def conj_view(self):
    # A view op: the core keeps it aliased to its base (see the module docstring).
    return jnp.conj(self)


@lowering(aten._neg_view.default)
def neg_view(self):
    # PyTorch's other lazy bit (``is_neg()``), materialised the same way as ``_conj``.
    return jnp.negative(self)


@lowering(aten._conj_physical.default, aten.conj_physical.default, aten._conj_copy.default)
def conj_physical(self):
    return jnp.conj(self)


def _check_complex_parts(op: str, a, b, names: tuple[str, str]) -> None:
    if a.dtype != b.dtype:
        raise RuntimeError(
            f"{op}: expected '{names[0]}' and '{names[1]}' to have the same dtype, but got "
            f"{torch_dtype(a.dtype)} and {torch_dtype(b.dtype)}."
        )
    if a.dtype not in (jnp.float32, jnp.float64):
        raise RuntimeError(
            f"{op}: expected float32 or float64 '{names[0]}' and '{names[1]}' (torchlax has no "
            f"complex32), but got {torch_dtype(a.dtype)}."
        )


@lowering(aten.complex.default)
def complex_(real, imag):
    _check_complex_parts("complex", real, imag, ("real", "imag"))
    real, imag = jnp.broadcast_arrays(real, imag)
    return jax.lax.complex(real, imag)


@lowering(aten.polar.default)
def polar(abs, angle):  # noqa: A002  (the schema's name)
    _check_complex_parts("polar", abs, angle, ("abs", "angle"))
    abs, angle = jnp.broadcast_arrays(abs, angle)  # noqa: A001
    return jax.lax.complex(abs * jnp.cos(angle), abs * jnp.sin(angle))
