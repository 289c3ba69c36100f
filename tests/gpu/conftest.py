"""GPU tests: full-precision float32 on both sides, so results compare as on the CPU."""

import jax
import pytest
import torch


def _cudnn_tf32_off():
    # flags()' other arguments default to turning cuDNN off: None leaves each as it is.
    return torch.backends.cudnn.flags(
        enabled=None,
        benchmark=None,
        benchmark_limit=None,
        deterministic=None,
        allow_tf32=False,
        fp32_precision=None,
        depthwise_kernel=None,
    )


@pytest.fixture(autouse=True)
def _full_precision():
    # PyTorch lets cuDNN convolutions use TF32 by default, and XLA may pick TF32 or bf16 passes
    # for float32 dots and convolutions; compare float32 as float32.
    # (cudnn.flags(), not assignment: PyTorch's test utilities, which OpInfo imports into the
    # same worker, freeze the global flags.)
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with _cudnn_tf32_off(), jax.default_matmul_precision("highest"):
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
