"""Where JAX has no GPU: CUDA placement and the GPU benchmark fail with a clear message."""

from pathlib import Path

import fresh_python
import gpu_support
import jax
import pytest
import torchlax


def _jax_has_gpu() -> bool:
    try:
        jax.devices("gpu")
    except RuntimeError:
        return False
    return True


pytestmark = pytest.mark.skipif(_jax_has_gpu(), reason="JAX has a GPU here: see the gpu tests")


def test_cuda_placement_without_a_jax_gpu_says_what_to_install():
    with pytest.raises(ValueError, match=r"device='cuda:1'.*JAX sees no GPU.*torchlax\[cuda\]"):
        torchlax.Environment().placement("cuda:1")


def test_gpu_tests_skip_with_a_reason():
    assert gpu_support.unavailable_reason() is not None
    assert "JAX" in gpu_support.unavailable_reason() or "CUDA" in gpu_support.unavailable_reason()


@pytest.mark.slow  # a fresh interpreter importing torch and JAX
def test_gpu_benchmark_exits_with_a_clear_message():
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu.py"
    result = fresh_python.run([str(script)], timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "needs a CUDA GPU visible to PyTorch and JAX" in result.stderr
