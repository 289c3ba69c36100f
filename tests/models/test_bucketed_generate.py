"""Eager ``generate()`` of a Hugging Face model on the jax device uses a static KV cache whose
length is a bucket (torchlax_interop._hf_generate): it gives eager CPU PyTorch's tokens and
logits, its decoding steps stop compiling after the first ones, and it can be turned off."""

from __future__ import annotations

import inspect
import sys
import textwrap

import pytest
import torch
import torchlax
from torchlax_interop import _hf_generate

transformers = pytest.importorskip("transformers")

from model_cases import tiny_gpt2_and_prompt  # noqa: E402  (after the skip)


def _padded_batch():
    """Two prompts, the first left-padded: the padding and the bucket's unused positions are
    both masked."""
    ids = torch.randint(1, 64, (2, 5), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    ids[0, :2] = 0
    mask[0, :2] = 0
    return ids, mask


# Every token generated (min_new_tokens: the random model may pick the EOS token), with its
# logits and the cache returned.
SETTINGS = {
    "do_sample": False,
    "output_logits": True,
    "return_dict_in_generate": True,
}


def _count_per_forward(model):
    """Compilations and op-cache misses of each forward call (forward hooks: replacing
    ``model.forward`` would keep transformers' dynamic cache)."""
    env = torchlax.default_env()
    counts, start = [], {}

    def before(module, args):
        stats = env.stats()
        start.update(compilations=stats["compilations"], misses=stats["op_cache_misses"])

    def after(module, args, output):
        stats = env.stats()
        counts.append(
            (
                stats["compilations"] - start["compilations"],
                stats["op_cache_misses"] - start["misses"],
            )
        )

    model.register_forward_pre_hook(before)
    model.register_forward_hook(after)
    return counts


@pytest.mark.slow
def test_eager_generate_on_jax_matches_cpu_and_stops_compiling_within_a_bucket():
    """A padded batch of two, greedy: 8 tokens in the 64-token bucket."""
    model, _ = tiny_gpt2_and_prompt()
    ids, mask = _padded_batch()
    settings = {**SETTINGS, "max_new_tokens": 8, "min_new_tokens": 8}
    reference = model.generate(ids, attention_mask=mask, **settings)
    assert type(reference.cache) is transformers.DynamicCache  # CPU: untouched

    with torchlax.enable():
        lm = model.to("jax")
        counts = _count_per_forward(lm)
        out = lm.generate(ids.to("jax"), attention_mask=mask.to("jax"), **settings)
    assert out.sequences.cpu().tolist() == reference.sequences.tolist()
    assert len(out.logits) == len(reference.logits) == 8
    for got, expected in zip(out.logits, reference.logits):
        torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-5)
    cache = out.cache
    assert isinstance(cache, transformers.StaticCache)
    assert [layer.max_cache_len for layer in cache.layers] == [64]  # 5 + 8: the smallest bucket
    # The prefill and the first steps compile (the op cache's warm-up: a signature runs op by op
    # on its first call and compiles on its second; a product's key gains the matmul precision
    # once its first trace read it); the later steps of the bucket have the same shapes: nothing
    # compiles and every op is served by the cache. (With the dynamic cache every token misses
    # on the ops whose shapes hold the cache's length, issue 38.)
    assert len(counts) == 8
    assert counts[0][1] > 0
    assert counts[5:] == [(0, 0)] * 3, counts

    # docs/training.md's advice: the prompt on the CPU keeps generate()'s own work on the
    # growing token tensor in PyTorch; the model's steps are the same programs as above.
    counts.clear()
    with torchlax.enable():
        out = lm.generate(ids, attention_mask=mask, **settings)
    assert out.sequences.tolist() == reference.sequences.tolist()
    assert counts[3:] == [(0, 0)] * 5, counts


@pytest.mark.slow
def test_generate_buckets_can_be_turned_off_per_call_and_for_all():
    model, ids = tiny_gpt2_and_prompt()
    settings = {**SETTINGS, "max_new_tokens": 2, "min_new_tokens": 2}
    reference = model.generate(ids, **settings).sequences.tolist()
    with torchlax.enable():
        lm = model.to("jax")
        jids = ids.to("jax")
        out = lm.generate(jids, cache_implementation="dynamic", **settings)
        assert type(out.cache) is transformers.DynamicCache
        assert out.sequences.cpu().tolist() == reference
        previous = _hf_generate._minimum
        torchlax.set_generate_buckets(None)
        try:
            out = lm.generate(jids, **settings)
        finally:
            _hf_generate._minimum = previous
        assert type(out.cache) is transformers.DynamicCache
        assert out.sequences.cpu().tolist() == reference


def test_bucket_lengths_are_powers_of_two_from_the_minimum():
    assert [_hf_generate.bucket_length(n, 64) for n in (1, 12, 64, 65, 100, 129)] == [
        64,
        64,
        64,
        128,
        128,
        256,
    ]
    assert _hf_generate.bucket_length(5, 4) == 8
    with pytest.raises(ValueError, match="at least 1 token"):
        torchlax.set_generate_buckets(0)
    with pytest.raises(TypeError, match="number of tokens or None"):
        torchlax.set_generate_buckets(64.0)  # pyright: ignore[reportArgumentType]


def test_environment_variable_sets_the_minimum_or_turns_buckets_off(monkeypatch):
    for value, minimum in [("", 64), ("0", None), ("off", None), ("1", 1), ("128", 128), ("x", 64)]:
        monkeypatch.setenv("TORCHLAX_GENERATE_BUCKETS", value)
        assert _hf_generate._minimum_from_environment() == minimum


def test_transformers_generate_is_wrapped():
    """The locked transformers' ``_prepare_cache_for_generation`` takes the arguments the
    wrapper reads (another signature would leave generate() to transformers, silently)."""
    prepare = transformers.GenerationMixin._prepare_cache_for_generation
    assert getattr(prepare, "__torchlax_wrapped__", None) is not None, (
        "transformers.GenerationMixin._prepare_cache_for_generation is not wrapped: its "
        f"arguments {list(inspect.signature(prepare).parameters)} lack {_hf_generate._NEEDED}"
    )


def test_a_module_imported_after_torchlax_is_wrapped_by_the_import_hook(tmp_path, monkeypatch):
    """The one-shot import hook (how a transformers imported after torchlax gets wrapped), on
    a stand-in package: it wraps the module once loaded, then leaves ``sys.meta_path``."""
    package = tmp_path / "standin_transformers"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "utils.py").write_text(
        textwrap.dedent(
            """
            class GenerationMixin:
                def _prepare_cache_for_generation(
                    self, generation_config, model_kwargs, generation_mode, batch_size,
                    max_cache_length,
                ):
                    return max_cache_length
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(_hf_generate, "_TARGET", "standin_transformers.utils")
    _hf_generate.activate()
    assert _hf_generate._hook in sys.meta_path
    try:
        from standin_transformers import utils  # pyright: ignore[reportMissingImports]
    finally:
        _hf_generate._remove_hook()
        for name in ("standin_transformers", "standin_transformers.utils"):
            sys.modules.pop(name, None)
    assert _hf_generate._hook not in sys.meta_path
    prepare = utils.GenerationMixin._prepare_cache_for_generation
    assert getattr(prepare, "__torchlax_wrapped__", None) is not None
    # A model that is not on the jax device gets the original's answer.
    assert utils.GenerationMixin()._prepare_cache_for_generation(None, {}, "sample", 1, 12) == 12
