"""docs/training.md's generation recipe: generate() with a static KV cache under
torch.compile(backend="torchlax") gives eager PyTorch's tokens, and a second generate() of the
same lengths compiles nothing (a dynamic cache changes shape with every token)."""

from __future__ import annotations

import pytest
import torch
import torchlax

transformers = pytest.importorskip("transformers")

from model_cases import tiny_gpt2_and_prompt  # noqa: E402  (after the skip)


@pytest.mark.slow
def test_static_cache_generate_under_the_backend_matches_eager_and_stops_compiling():
    model, ids = tiny_gpt2_and_prompt()
    settings = {"max_new_tokens": 6, "do_sample": False, "cache_implementation": "static"}
    reference = model.generate(ids, **settings)

    model.forward = torch.compile(model.forward, backend="torchlax")
    assert model.generate(ids, **settings).tolist() == reference.tolist()
    before = torchlax.default_env().stats()["compilations"]
    assert before > 0  # the backend counts its compilations there
    assert model.generate(ids, **settings).tolist() == reference.tolist()
    assert torchlax.default_env().stats()["compilations"] == before


def jit_forward(model):
    """docs/training.md's recipe: ``model.forward`` under ``torchlax.jit``, the static cache's
    tensors made state of the step (buffers of a module it closes over), so that the step's
    writes into them are the program's outputs."""
    eager = model.forward
    cache_state = torch.nn.Module()
    step = torchlax.jit(lambda args, kwargs: (cache_state, eager(*args, **kwargs))[1])

    def forward(*args, **kwargs):
        cache = next((v for v in kwargs.values() if isinstance(v, transformers.Cache)), None)
        if cache is None or not all(layer.is_initialized for layer in cache.layers):
            return eager(*args, **kwargs)  # the cache makes its tensors in its first call
        tensors = [
            t for layer in cache.layers for t in vars(layer).values() if isinstance(t, torch.Tensor)
        ]
        held = list(cache_state._buffers.values())
        if len(held) != len(tensors) or any(a is not b for a, b in zip(held, tensors)):
            cache_state._buffers.clear()
            for i, t in enumerate(tensors):
                cache_state.register_buffer(f"t{i}", t)
        return step(args, kwargs)

    forward.step = step
    return forward


@pytest.mark.slow
def test_static_cache_generate_under_torchlax_jit_matches_eager_and_stops_compiling():
    model, ids = tiny_gpt2_and_prompt()
    settings = {"max_new_tokens": 6, "do_sample": False}
    reference = model.generate(ids, cache_implementation="static", **settings)

    with torchlax.enable():
        lm = model.to("jax")
        lm.forward = jit_forward(lm)
        # One cache for every generate(): a new one per call would be new state each time.
        cache = transformers.StaticCache(config=lm.config, max_cache_len=16)
        counts = []
        for _ in range(3):
            cache.reset()
            tokens = lm.generate(ids.to("jax"), past_key_values=cache, **settings)
            assert tokens.cpu().tolist() == reference.tolist()
            counts.append(lm.forward.step.compilations)
    # The decoding step (first call: the prefill fills the new cache eagerly), then the
    # prefill; nothing after.
    assert counts == [1, 2, 2]
