"""What every GPU test needs: the skip when no GPU is usable, and comparison helpers.

Imported by the GPU tests as ``gpu_support`` (a unique name: tests/ has no packages).
"""

from __future__ import annotations

import functools

import jax
import pytest
import torch


@functools.cache
def unavailable_reason() -> str | None:
    """Why the GPU tests cannot run here, or None when torch and JAX both see a GPU."""
    if not torch.cuda.is_available():
        return "no CUDA device: torch.cuda.is_available() is False"
    try:
        jax.devices("gpu")
    except RuntimeError:
        return (
            "JAX has no GPU backend: install JAX's CUDA plugin with `uv sync --group cuda` "
            '(or `pip install "torchlax[cuda]"`)'
        )
    return None


def _skip_marks():
    reason = unavailable_reason()
    return [pytest.mark.gpu, pytest.mark.skipif(reason is not None, reason=reason or "")]


#: ``pytestmark = gpu_support.MARKS`` in each GPU test module.
MARKS = _skip_marks()


def jax_gpu(index: int = 0) -> jax.Device:
    """The JAX GPU with CUDA ordinal ``index`` (what torch calls ``cuda:index``)."""
    return next(d for d in jax.devices("gpu") if d.local_hardware_id == index)


def pointer(array: jax.Array) -> int:
    return array.unsafe_buffer_pointer()
