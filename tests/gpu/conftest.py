"""GPU tests: full-precision float32 on both sides, so results compare as on the CPU."""

import jax
import pytest
import torch


@pytest.fixture(autouse=True)
def _full_precision():
    # PyTorch lets cuDNN convolutions use TF32 by default, and XLA may pick TF32 or bf16 passes
    # for float32 dots and convolutions; compare float32 as float32.
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    with jax.default_matmul_precision("highest"):
        yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
