"""Real models on CUDA tensors through torchlax, compared with PyTorch's CUDA eager result.

Random weights from configs (nothing is downloaded); float32 at full precision on both sides
(see conftest.py).
"""

import copy

import gpu_support
import pytest
import torch
import torchlax
from gpu_support import jax_gpu

pytestmark = gpu_support.MARKS


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2, n_head=4, n_embd=64, vocab_size=128, n_positions=64, pad_token_id=0
    )
    config._attn_implementation = "eager"
    return GPT2LMHeadModel(config).cuda().eval()


def _tokens():
    return torch.randint(
        0, 128, (2, 16), device="cuda", generator=torch.Generator("cuda").manual_seed(1)
    )


def test_gpt2_forward_and_backward_under_torch_compile():
    eager = _gpt2()
    model = copy.deepcopy(eager)
    compiled = torch.compile(model, backend="torchlax")
    tokens = _tokens()
    expected = eager(tokens, labels=tokens)
    out = compiled(tokens, labels=tokens)
    assert out.logits.device == torch.device("cuda", 0)
    torch.testing.assert_close(out.logits, expected.logits, rtol=1e-4, atol=1e-4)
    expected.loss.backward()
    out.loss.backward()
    torch.testing.assert_close(out.loss, expected.loss, rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(eager.named_parameters(), model.parameters()):
        assert q.grad is not None and q.grad.device == q.device, name
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-3, atol=2e-5, msg=name)


def test_gpt2_forward_under_torchlax_jit_on_the_gpu():
    eager = _gpt2()
    tokens = _tokens()
    with torch.no_grad():
        expected = eager(tokens).logits
    with torchlax.enable(), torch.no_grad():
        model = copy.deepcopy(eager).to("jax")
        logits = torchlax.jit(model)(tokens.to("jax")).logits
    assert logits.jax().devices() == {jax_gpu(0)}
    torch.testing.assert_close(torchlax.to_torch(logits), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_resnet18_forward_under_torch_compile():
    import torchvision

    torch.manual_seed(0)
    eager = torchvision.models.resnet18(num_classes=10).cuda().eval()
    compiled = torch.compile(copy.deepcopy(eager), backend="torchlax")
    g = torch.Generator("cuda").manual_seed(2)
    images = torch.randn(4, 3, 64, 64, device="cuda", generator=g)
    with torch.no_grad():
        expected = eager(images)
        out = compiled(images)
    assert out.device == torch.device("cuda", 0)
    # cuDNN and XLA pick different convolution algorithms (summation orders) in float32.
    torch.testing.assert_close(out, expected, rtol=1e-3, atol=1e-3)
