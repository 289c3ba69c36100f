"""Random ops: PyTorch's shapes, dtypes and distributions; seeded by torch.manual_seed."""

from __future__ import annotations

import os
import sys

import jax
import pytest
import torch
import torchlax_core

sys.path.insert(0, os.path.dirname(__file__))
from _compare_cpu import run_jit  # noqa: E402

N = 20000

SAMPLERS = {
    "rand": lambda: torch.rand(N, device="jax"),
    "randn": lambda: torch.randn(N, device="jax"),
    "randn_float64": lambda: torch.randn(N, dtype=torch.float64, device="jax"),
    "randint": lambda: torch.randint(3, 9, (N,), device="jax"),
    "randint_int32": lambda: torch.randint(5, (N,), dtype=torch.int32, device="jax"),
    "randperm": lambda: torch.randperm(50, device="jax"),
    "uniform_": lambda: torch.empty(N, device="jax").uniform_(-2, 3),
    "normal_": lambda: torch.empty(N, device="jax").normal_(5, 2),
    "normal_tensor_mean": lambda: torch.normal(torch.full((N,), 3.0, device="jax"), 0.5),
    "normal_float_float": lambda: torch.normal(1.0, 2.0, (N,), device="jax"),
    "bernoulli_p": lambda: torch.empty(N, device="jax").bernoulli_(0.3),
    "bernoulli_tensor": lambda: torch.bernoulli(torch.full((N,), 0.7, device="jax")),
    "exponential_": lambda: torch.empty(N, device="jax").exponential_(2.0),
    "geometric_": lambda: torch.empty(N, device="jax").geometric_(0.25),
    "log_normal_": lambda: torch.empty(N, dtype=torch.float64, device="jax").log_normal_(0.0, 0.5),
    "cauchy_": lambda: torch.empty(N, device="jax").cauchy_(1.0, 2.0),
    "random_to": lambda: torch.empty(N, dtype=torch.int64, device="jax").random_(10),
    "random_from_to": lambda: torch.empty(N, device="jax").random_(-5, 5),
    "poisson": lambda: torch.poisson(torch.full((N,), 4.0, device="jax")),
    "rand_like": lambda: torch.rand_like(torch.zeros(N, dtype=torch.float64, device="jax")),
    "randn_like": lambda: torch.randn_like(torch.zeros(N, device="jax")),
    "randint_like": lambda: torch.randint_like(torch.zeros(N, device="jax"), 2, 6),
}

# (dtype, mean, std) that PyTorch's distribution has; None: not checked.
MOMENTS = {
    "rand": (torch.float32, 0.5, (1 / 12) ** 0.5),
    "randn": (torch.float32, 0.0, 1.0),
    "randn_float64": (torch.float64, 0.0, 1.0),
    "randint": (torch.int64, 5.5, None),
    "randint_int32": (torch.int32, 2.0, None),
    "randperm": (torch.int64, 24.5, None),
    "uniform_": (torch.float32, 0.5, 5 / 12**0.5),
    "normal_": (torch.float32, 5.0, 2.0),
    "normal_tensor_mean": (torch.float32, 3.0, 0.5),
    "normal_float_float": (torch.float32, 1.0, 2.0),
    "bernoulli_p": (torch.float32, 0.3, None),
    "bernoulli_tensor": (torch.float32, 0.7, None),
    "exponential_": (torch.float32, 0.5, 0.5),
    "geometric_": (torch.float32, 4.0, None),
    "log_normal_": (torch.float64, float(torch.tensor(0.125).exp()), None),
    "cauchy_": (torch.float32, None, None),
    "random_to": (torch.int64, 4.5, None),
    "random_from_to": (torch.float32, -0.5, None),
    "poisson": (torch.float32, 4.0, 2.0),
    "rand_like": (torch.float64, 0.5, None),
    "randn_like": (torch.float32, 0.0, 1.0),
    "randint_like": (torch.float32, 3.5, None),
}


@pytest.mark.parametrize("name", SAMPLERS)
def test_distribution_dtype_moments_and_seeding(name):
    with torchlax_core.enable():
        torch.manual_seed(7)
        first = SAMPLERS[name]().cpu()
        torch.manual_seed(7)
        again = SAMPLERS[name]().cpu()
        following = SAMPLERS[name]().cpu()
    dtype, mean, std = MOMENTS[name]
    assert first.dtype == dtype
    assert torch.equal(first, again), "torch.manual_seed must make draws repeatable"
    assert not torch.equal(first, following), "successive draws must differ"
    values = first.double()
    if mean is not None:
        assert abs(values.mean().item() - mean) < 0.05 * max(1.0, abs(mean)) + 0.02, values.mean()
    if std is not None:
        assert abs(values.std().item() - std) < 0.05 * std, values.std()


def test_bounds():
    with torchlax_core.enable():
        u = torch.empty(N, device="jax").uniform_(-2, 3).cpu()
        ints = torch.randint(3, 9, (N,), device="jax").cpu()
        perm = torch.randperm(50, device="jax").cpu()
        geometric = torch.empty(N, device="jax").geometric_(0.25).cpu()
        bits = torch.empty(N, dtype=torch.bool, device="jax").random_().cpu()
        bytes_ = torch.empty(N, dtype=torch.uint8, device="jax").random_().cpu()
    assert u.min() >= -2 and u.max() < 3
    assert set(ints.unique().tolist()) == set(range(3, 9))
    assert torch.equal(perm.sort().values, torch.arange(50))
    assert geometric.min() >= 1 and torch.equal(geometric, geometric.round())
    assert set(bits.unique().tolist()) == {False, True}
    assert bytes_.max() > 200 and bytes_.min() < 50


def test_generator_argument_is_used():
    with torchlax_core.enable():
        a = torch.randn(5, device="jax", generator=torch.Generator().manual_seed(3)).cpu()
        b = torch.randn(5, device="jax", generator=torch.Generator().manual_seed(3)).cpu()
        c = torch.randn(5, device="jax", generator=torch.Generator().manual_seed(4)).cpu()
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_multinomial():
    probs = torch.tensor([[0.1, 0.0, 0.6, 0.3], [0.25, 0.25, 0.25, 0.25]])
    with torchlax_core.enable():
        p = probs.to("jax")
        without = torch.multinomial(p, 3).cpu()
        many = torch.multinomial(p, 4000, replacement=True).cpu()
    assert without.dtype == torch.int64 and without.shape == (2, 3)
    for row in without:
        assert len(set(row.tolist())) == 3
    assert 1 not in without[0].tolist()
    frequencies = torch.stack([torch.bincount(r, minlength=4) for r in many]).double() / 4000
    torch.testing.assert_close(frequencies, probs.double(), atol=0.03, rtol=0)


def test_multinomial_without_replacement_too_many_samples():
    with torchlax_core.enable(), pytest.raises(RuntimeError, match="without replacement"):
        torch.multinomial(torch.ones(3, device="jax"), 4)


def test_random_ops_inside_jit_draw_from_the_key_passed_in():
    def fn(x):
        return x + torch.randn_like(x), torch.rand(3, device=x.device)

    with torchlax_core.enable():
        env = torchlax_core.current_env()
        x = torch.zeros(1000).to("jax")

        @jax.jit
        def program(key, array):
            with env.prng_key_scope(key):
                noisy, uniform = fn(torchlax_core.wrap(array))
            return noisy.jax(), uniform.jax()

        noisy, uniform = program(jax.random.key(1), x.jax())
        again, _ = program(jax.random.key(1), x.jax())
        other, _ = program(jax.random.key(2), x.jax())
    assert abs(float(noisy.std()) - 1) < 0.1
    assert uniform.shape == (3,) and uniform.dtype == jax.numpy.float32
    assert bool((noisy == again).all()) and not bool((noisy == other).all())


def test_random_op_under_a_bare_jax_jit_raises_instead_of_baking_in_a_key():
    def fn(x):
        return x + torch.randn_like(x)

    with torchlax_core.enable(), pytest.raises(RuntimeError, match="prng_key_scope"):
        run_jit(fn, torch.zeros(10).to("jax"))


def test_complex_randn_has_unit_variance():
    with torchlax_core.enable():
        z = torch.randn(N, dtype=torch.complex64, device="jax").cpu()
    assert z.dtype == torch.complex64
    assert abs(z.abs().pow(2).mean().item() - 1) < 0.05
