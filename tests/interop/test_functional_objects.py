"""functional on Hugging Face defaults: the DynamicCache a causal LM returns (use_cache at its
default) comes out of jax.jit as a pytree of arrays, and goes back in for the next token."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torchlax_core
from torchlax_interop import _object_nodes, functional

transformers = pytest.importorskip("transformers")


def _tiny_gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2,
        n_head=4,
        n_embd=32,
        vocab_size=64,
        n_positions=32,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.GPT2LMHeadModel(config).eval()


def _keys(cache) -> list[np.ndarray]:
    return [np.asarray(layer.keys) for layer in cache.layers]


def test_jax_jit_returns_the_kv_cache_and_takes_it_back():
    model = _tiny_gpt2()
    ids = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(1))
    params, _, fn = functional(model)
    step = jax.jit(fn)

    out = step(params, ids.numpy())  # use_cache at its default: a DynamicCache comes back
    cache = out.past_key_values
    assert type(cache).__name__ == "DynamicCache"
    assert all(isinstance(a, jax.Array) for a in jax.tree_util.tree_leaves(cache))
    with torch.no_grad():
        reference = model(ids)
    np.testing.assert_allclose(np.asarray(out.logits), reference.logits.numpy(), atol=1e-5)
    for ours, theirs in zip(_keys(cache), _keys(reference.past_key_values), strict=True):
        np.testing.assert_allclose(ours, theirs, atol=1e-5)

    # The next token with the cache passed back in, against the same step in PyTorch.
    nxt = torch.randint(0, 64, (2, 1), generator=torch.Generator().manual_seed(2))
    out2 = step(params, nxt.numpy(), past_key_values=cache)
    with torch.no_grad():
        reference2 = model(nxt, past_key_values=reference.past_key_values)
    np.testing.assert_allclose(np.asarray(out2.logits), reference2.logits.numpy(), atol=1e-5)
    assert [k.shape[-2] for k in _keys(out2.past_key_values)] == [7, 7]
    # The cache passed in is not modified (JAX data is immutable; the object was rebuilt).
    assert [k.shape[-2] for k in _keys(cache)] == [6, 6]


def test_a_cache_built_by_the_caller_can_be_passed_in_first():
    model = _tiny_gpt2()
    params, _, fn = functional(model)
    empty = transformers.DynamicCache(config=model.config)
    ids = jnp.arange(4).reshape(1, 4)
    out = jax.jit(fn)(params, ids, past_key_values=empty)
    assert [k.shape for k in _keys(out.past_key_values)] == [(1, 4, 4, 8)] * 2


class _Holder:
    def __init__(self, a, b):
        self.pair = [a, {"b": b}]
        self.name = "x"


def test_any_object_holding_tensors_flattens_and_rebuilds():
    obj = _Holder(jnp.ones(2), jnp.zeros(3))
    _object_nodes.register_class(_Holder)
    leaves, tree = jax.tree_util.tree_flatten(obj)
    assert [leaf.shape for leaf in leaves] == [(2,), (3,)]
    rebuilt = jax.tree_util.tree_unflatten(tree, [jnp.full(2, 5.0), jnp.full(3, 7.0)])
    assert isinstance(rebuilt, _Holder) and rebuilt.name == "x"
    assert float(rebuilt.pair[0][0]) == 5.0 and float(rebuilt.pair[1]["b"][0]) == 7.0
    assert float(obj.pair[0][0]) == 1.0  # the original object is left alone
    other = _Holder(jnp.ones(2), jnp.zeros(3))
    assert jax.tree_util.tree_structure(other) == tree  # same structure: no retrace
    other.name = "y"
    assert jax.tree_util.tree_structure(other) != tree


def test_a_cycle_is_a_clear_error():
    obj = _Holder(jnp.ones(2), jnp.zeros(3))
    obj.pair.append(obj)
    _object_nodes.register_class(_Holder)
    with pytest.raises(torchlax_core.TorchlaxError, match="reference cycle"):
        jax.tree_util.tree_flatten(obj)
