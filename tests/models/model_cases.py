"""Real models built from configs with random weights (nothing is downloaded).

Imported by the model tests as ``model_cases`` (a unique name: tests/ has no packages)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch


@dataclasses.dataclass
class ModelCase:
    name: str
    build: Callable[[], torch.nn.Module]
    inputs: Callable[[], tuple]
    output: Callable[[object], torch.Tensor]  # the tensor to compare (logits, features)
    tolerance: float = 1e-4
    # dtype of the training tests. float64 where float32 rounding alone decides a ReLU mask: in
    # ResNet-18 a pre-ReLU sum of float64 value 1.6e-6 rounds to +4.8e-7 on PyTorch's CPU and to
    # -4.8e-7 under XLA (one float32 ulp at that magnitude), and that one element changes every
    # gradient upstream by 1-3%. CPU float32 itself is as far from float64 for other inputs.
    train_dtype: torch.dtype = torch.float32


def _tokens(batch=2, length=12, vocab=128):
    return (torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(1)),)


def _images(size=32):
    return (torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(2)),)


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(
        GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=128, n_positions=64, pad_token_id=0)
    )


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(
        LlamaConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=128,
            max_position_embeddings=64,
            pad_token_id=0,
        )
    )


def _bert():
    from transformers import BertConfig, BertForSequenceClassification

    return BertForSequenceClassification(
        BertConfig(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            vocab_size=128,
            max_position_embeddings=64,
            num_labels=3,
        )
    )


def _vit():
    from transformers import ViTConfig, ViTForImageClassification

    return ViTForImageClassification(
        ViTConfig(
            image_size=32,
            patch_size=8,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            num_labels=10,
        )
    )


def _resnet18():
    import torchvision

    return torchvision.models.resnet18(num_classes=10)


def _mobilenet_v3():
    from torchvision.models import mobilenetv3

    # MobileNetV3-Small's stem, head and its first five inverted-residual blocks of eleven: they
    # hold every kind of block it has (squeeze-excite or not, ReLU or hardswish, 3x3 and 5x5
    # depthwise convolutions, stride 2 and stride-1 residual); the other six repeat those kinds
    # at other widths. Eager tests compile each op signature, and each block's widths are new
    # signatures: the full eleven cost twice the CI time and check nothing more.
    blocks, _ = mobilenetv3._mobilenet_v3_conf("mobilenet_v3_small")
    return mobilenetv3.MobileNetV3(blocks[:5], last_channel=1024, num_classes=10)


def tiny_gpt2_and_prompt():
    """A one-layer GPT-2 that can generate (bos/eos/pad 0) and a 5-token prompt: the
    generation tests' model (their paths are the same at any depth)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=1,
        n_head=4,
        n_embd=32,
        vocab_size=64,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    model = GPT2LMHeadModel(config).eval()
    return model, torch.randint(1, 64, (1, 5), generator=torch.Generator().manual_seed(1))


def _logits(out):
    return out.logits if hasattr(out, "logits") else out


CASES = {
    "gpt2": ModelCase("gpt2", _gpt2, _tokens, _logits),
    "llama": ModelCase("llama", _llama, _tokens, _logits),
    "bert": ModelCase("bert", _bert, _tokens, _logits),
    "vit": ModelCase("vit", _vit, _images, _logits),
    "resnet18": ModelCase(
        "resnet18", _resnet18, lambda: _images(64), _logits, 2e-4, train_dtype=torch.float64
    ),
    "mobilenet_v3": ModelCase("mobilenet_v3", _mobilenet_v3, lambda: _images(64), _logits, 2e-4),
}


def built(case: ModelCase, *, train: bool = False, dtype: torch.dtype = torch.float32):
    torch.manual_seed(0)
    model = case.build().to(dtype)
    model.train(train)
    inputs = tuple(t.to(dtype) if t.is_floating_point() else t for t in case.inputs())
    return model, inputs
