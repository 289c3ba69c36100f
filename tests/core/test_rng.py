"""Randomness on torchlax follows torch's generators: manual_seed, Generator arguments, dropout.

JAX keys are drawn eagerly from torch's generator (``Environment.next_prng_key``), so values
differ from PyTorch's CPU stream but reproduce exactly under the same seed.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import torchlax_core
from eager_compare import to_jax


@pytest.fixture(autouse=True)
def _enabled():
    with torchlax_core.enable():
        yield


def _cpu(t):
    assert isinstance(t, torchlax_core.Tensor)
    return t.cpu()


def test_manual_seed_repeats_and_steps_differ():
    torch.manual_seed(123)
    a, b = _cpu(torch.randn(50, device="jax")), _cpu(torch.randn(50, device="jax"))
    torch.manual_seed(123)
    a2, b2 = _cpu(torch.randn(50, device="jax")), _cpu(torch.randn(50, device="jax"))
    assert torch.equal(a, a2) and torch.equal(b, b2)
    assert not torch.equal(a, b)
    assert a.dtype == torch.float32 and a.shape == (50,)


def test_generator_argument_is_used_and_leaves_global_stream_alone():
    torch.manual_seed(0)
    expected_global = _cpu(torch.rand(20, device="jax"))
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(7)
    from_g = _cpu(torch.rand(20, device="jax", generator=g))
    assert torch.equal(_cpu(torch.rand(20, device="jax")), expected_global)
    g2 = torch.Generator().manual_seed(7)
    assert torch.equal(_cpu(torch.rand(20, device="jax", generator=g2)), from_g)
    assert not torch.equal(from_g, expected_global)


def test_inplace_random_ops_follow_seed():
    x = to_jax(torch.zeros(100))
    torch.manual_seed(5)
    first = _cpu(x.uniform_(-1, 1).clone())
    x.normal_()
    torch.manual_seed(5)
    assert torch.equal(_cpu(x.uniform_(-1, 1)), first)
    assert first.min() >= -1 and first.max() <= 1


def test_dropout_train_differs_per_step_and_repeats_under_seed():
    x = to_jax(torch.ones(1000))
    torch.manual_seed(42)
    step1 = _cpu(F.dropout(x, 0.5, training=True))
    step2 = _cpu(F.dropout(x, 0.5, training=True))
    assert not torch.equal(step1, step2)
    torch.manual_seed(42)
    assert torch.equal(_cpu(F.dropout(x, 0.5, training=True)), step1)
    kept = step1 != 0
    assert 350 < int(kept.sum()) < 650
    torch.testing.assert_close(step1[kept], torch.full((int(kept.sum()),), 2.0))
    assert torch.equal(_cpu(F.dropout(x, 0.5, training=False)), torch.ones(1000))


def test_dropout_backward_uses_the_same_mask():
    x = to_jax(torch.ones(200)).requires_grad_()
    torch.manual_seed(3)
    y = F.dropout(x, 0.3, training=True)
    y.sum().backward()
    torch.testing.assert_close(_cpu(x.grad), _cpu(y.detach()))


def test_key_data_made_on_the_host_is_the_keys_own_data():
    # Compiled programs of torchlax.jit take their key as raw data, made on the host from
    # the seed (no JAX dispatch per call): the very bits next_prng_key() gives for that seed.
    import jax
    import numpy as np

    env = torchlax_core.current_env()
    gen = torch.Generator().manual_seed(7)
    for _ in range(3):
        state = gen.get_state()
        data = env.next_prng_key_data(gen)
        assert isinstance(data, np.ndarray) and data.dtype == np.uint32
        gen.set_state(state)
        expected = np.asarray(jax.random.key_data(env.next_prng_key(gen)))
        np.testing.assert_array_equal(data, expected)
    # Another PRNG implementation: its key data comes from JAX itself.
    with jax.default_prng_impl("rbg"):
        state = gen.get_state()
        data = env.next_prng_key_data(gen)
        gen.set_state(state)
        with jax.default_prng_impl("rbg"):
            expected = np.asarray(jax.random.key_data(env.next_prng_key(gen)))
        np.testing.assert_array_equal(np.asarray(data), expected)
        assert data.shape == (4,)
