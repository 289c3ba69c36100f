"""Loading a Hugging Face checkpoint onto the jax device: from_pretrained on the CPU, then
.to("jax") (docs/interop.md); device_map="jax" needs accelerate, which torchlax does not add."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torchlax

transformers = pytest.importorskip("transformers")


def _saved_gpt2(tmp_path):
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=1,
        n_head=2,
        n_embd=16,
        vocab_size=32,
        n_positions=16,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    model.save_pretrained(tmp_path)
    return model


def test_from_pretrained_on_the_cpu_then_to_jax(tmp_path):
    reference = _saved_gpt2(tmp_path)
    ids = torch.randint(0, 32, (2, 5), generator=torch.Generator().manual_seed(1))
    with torchlax.enable():
        model = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval().to("jax")
        assert {p.device.type for p in model.parameters()} == {"jax"}
        with torch.no_grad():
            logits = model(ids.to("jax")).logits.cpu()
    with torch.no_grad():
        torch.testing.assert_close(logits, reference(ids).logits, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(importlib.util.find_spec("accelerate") is not None, reason="accelerate here")
def test_device_map_jax_without_accelerate_says_what_to_install(tmp_path):
    # What the docs tell users (transformers' own message): if transformers stops routing
    # device_map through accelerate, docs/interop.md's advice is stale and this fails.
    _saved_gpt2(tmp_path)
    with pytest.raises(ValueError, match="requires `accelerate`"):
        transformers.GPT2LMHeadModel.from_pretrained(tmp_path, device_map="jax")
