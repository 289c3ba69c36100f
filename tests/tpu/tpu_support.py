"""What every TPU test needs: the skip where JAX sees no TPU, and the TPU's float32 tolerances.

Imported by the TPU tests as ``tpu_support`` (a unique name: tests/ has no packages).
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path

import jax
import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Float32 on a TPU, products at torchlax's default precision (HIGHEST: float32 accuracy):
#: elementwise transcendentals (exp, log, tanh, erf) differ from the CPU's by up to ~1e-4
#: relative (docs/tpu.md), and a small model's outputs by a few times that.
FORWARD_TOL = 1e-3
#: A training step's parameters after two SGD steps (lr 0.1): gradients carry the forward's
#: differences, amplified where a normalisation divides by a small variance.
TRAINING_TOL = 5e-3


@functools.cache
def unavailable_reason() -> str | None:
    """Why the TPU tests cannot run here, or None when JAX's default device is a TPU."""
    try:
        devices = jax.devices()
    except RuntimeError as exc:  # no backend at all
        return f"JAX has no usable backend: {exc}"
    if devices[0].platform != "tpu":
        return (
            f"no TPU visible to JAX (jax.devices() is {devices}); on a TPU VM install "
            "torchlax[tpu] (docs/tpu.md)"
        )
    return None


#: ``pytestmark = tpu_support.MARKS`` in each TPU test module.
MARKS = [
    pytest.mark.tpu,
    pytest.mark.skipif(unavailable_reason() is not None, reason=unavailable_reason() or ""),
]


def model_cases():
    """tests/models/model_cases.py (the models the CPU suite checks)."""
    sys.path.insert(0, str(ROOT / "tests" / "models"))
    import model_cases

    return model_cases


def tpu_benchmark():
    """benchmarks/tpu.py as a module."""
    spec = importlib.util.spec_from_file_location("tpu_benchmark", ROOT / "benchmarks" / "tpu.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
