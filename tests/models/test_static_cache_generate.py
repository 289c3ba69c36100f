"""docs/training.md's generation recipe: generate() with a static KV cache under
torch.compile(backend="torchlax") gives eager PyTorch's tokens, and a second generate() of the
same lengths compiles nothing (a dynamic cache changes shape with every token)."""

from __future__ import annotations

import pytest
import torch
import torchlax

transformers = pytest.importorskip("transformers")


@pytest.mark.slow
def test_static_cache_generate_under_the_backend_matches_eager_and_stops_compiling():
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=1,
        n_head=4,
        n_embd=32,
        vocab_size=64,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(1, 64, (1, 5), generator=torch.Generator().manual_seed(1))
    settings = {"max_new_tokens": 6, "do_sample": False, "cache_implementation": "static"}
    reference = model.generate(ids, **settings)

    model.forward = torch.compile(model.forward, backend="torchlax")
    assert model.generate(ids, **settings).tolist() == reference.tolist()
    before = torchlax.default_env().stats()["compilations"]
    assert before > 0  # the backend counts its compilations there
    assert model.generate(ids, **settings).tolist() == reference.tolist()
    assert torchlax.default_env().stats()["compilations"] == before
