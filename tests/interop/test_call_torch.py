"""call_torch: PyTorch code as a JAX function under jax.jit, jax.grad, jax.vmap."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torchlax_core
from torchlax_interop import call_torch


def torch_fn(x, w, b):
    return torch.tanh(x @ w.t() + b) * x.sum()


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    w = rng.standard_normal((5, 3)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    return x, w, b


def _torch(*arrays, requires_grad=False):
    return [torch.tensor(np.asarray(a), requires_grad=requires_grad) for a in arrays]


def test_values_match_eager_torch():
    x, w, b = _inputs()
    out = call_torch(torch_fn, jnp.asarray(x), jnp.asarray(w), jnp.asarray(b))
    assert isinstance(out, jax.Array) and out.dtype == jnp.float32
    np.testing.assert_allclose(
        np.asarray(out), torch_fn(*_torch(x, w, b)).numpy(), rtol=1e-5, atol=1e-5
    )


def test_pytrees_in_and_out():
    def fn(d, scale):
        return {"sum": d["a"] + d["b"], "scaled": [d["a"] * scale]}

    out = call_torch(fn, {"a": jnp.ones(2), "b": jnp.full(2, 2.0)}, 3.0)
    np.testing.assert_allclose(np.asarray(out["sum"]), [3.0, 3.0])
    np.testing.assert_allclose(np.asarray(out["scaled"][0]), [3.0, 3.0])


def test_jit_matches_eager():
    x, w, b = _inputs()
    jitted = jax.jit(functools.partial(call_torch, torch_fn))
    out = jitted(x, w, b)
    np.testing.assert_allclose(
        np.asarray(out), torch_fn(*_torch(x, w, b)).numpy(), rtol=1e-5, atol=1e-5
    )


def test_int64_stays_int64():
    out = call_torch(lambda i: i * 3, np.arange(4, dtype=np.int64))
    assert out.dtype == np.int64
    np.testing.assert_array_equal(np.asarray(out), [0, 3, 6, 9])


@pytest.mark.parametrize("transform", ["grad", "jit_grad"])
def test_grad_matches_torch_autograd(transform):
    x, w, b = _inputs(1)

    def loss(x, w, b):
        return call_torch(lambda *t: torch_fn(*t).sum(), x, w, b)

    grad = jax.grad(loss, argnums=(0, 1, 2))
    if transform == "jit_grad":
        grad = jax.jit(grad)
    got = grad(x, w, b)
    tx, tw, tb = _torch(x, w, b, requires_grad=True)
    want = torch.autograd.grad(torch_fn(tx, tw, tb).sum(), (tx, tw, tb))
    for g, r in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), r.numpy(), rtol=1e-4, atol=1e-5)


def test_value_and_grad():
    x, w, b = _inputs(2)
    value, grad = jax.value_and_grad(lambda w: call_torch(lambda *t: torch_fn(*t).sum(), x, w, b))(
        w
    )
    tx, tw, tb = _torch(x, w, b)
    tw.requires_grad_()
    ref = torch_fn(tx, tw, tb).sum()
    (ref_grad,) = torch.autograd.grad(ref, tw)
    np.testing.assert_allclose(float(value), ref.item(), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(grad), ref_grad.numpy(), rtol=1e-4, atol=1e-5)


def test_vmap_matches_a_loop():
    rng = np.random.default_rng(3)
    xs = rng.standard_normal((6, 4, 3)).astype(np.float32)
    _, w, b = _inputs()
    batched = jax.vmap(lambda x: call_torch(torch_fn, x, w, b))(xs)
    looped = np.stack([torch_fn(*_torch(x, w, b)).numpy() for x in xs])
    assert batched.shape == looped.shape
    np.testing.assert_allclose(np.asarray(batched), looped, rtol=1e-5, atol=1e-5)


def test_random_ops_use_the_key_threaded_in():
    def noisy(x):
        return x + torch.rand(x.shape, device=x.device)

    fn = jax.jit(lambda x, key: call_torch(noisy, x, prng_key=key))
    x = jnp.zeros(8)
    a = fn(x, jax.random.key(0))
    b = fn(x, jax.random.key(1))
    again = fn(x, jax.random.key(0))
    assert not np.allclose(np.asarray(a), np.asarray(b))  # a new key, new numbers, no retrace
    np.testing.assert_array_equal(np.asarray(a), np.asarray(again))
    assert np.all((np.asarray(a) >= 0) & (np.asarray(a) < 1))


def test_torchlax_tensors_are_what_torch_code_sees():
    seen = []

    def fn(x):
        seen.append((type(x), x.device.type))
        return x

    call_torch(fn, jnp.ones(2))
    assert seen == [(torchlax_core.Tensor, "jax")]
