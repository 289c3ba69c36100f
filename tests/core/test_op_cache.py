"""The eager op cache: compiled executables per op call signature (``torchlax_core._opcache``).

Each test compares with eager PyTorch on the CPU and checks, through ``env.stats()``, that the
cache did what the test is about (a hit, a fresh compile for a new signature, no caching).
"""

from __future__ import annotations

import logging
import types

import jax
import jax.numpy as jnp
import pytest
import torch
import torchlax_core
from torchlax_core import _stats, hookimpl


def stats(env):
    s = env.stats()
    return s["op_cache_hits"], s["op_cache_misses"], s["compilations"]


def jax_tensor(cpu: torch.Tensor) -> torchlax_core.Tensor:
    return cpu.to("jax")


def test_hits_after_the_second_call_and_stays_correct(env):
    a_cpu, b_cpu = torch.randn(7), torch.randn(7)
    a, b = jax_tensor(a_cpu), jax_tensor(b_cpu)
    hits, misses, compiles = stats(env)
    results = [torch.mul(a, b) for _ in range(4)]  # plain, compile, hit, hit
    h, m, c = stats(env)
    assert (h - hits, m - misses, c - compiles) == (2, 2, 1)
    for r in results:
        assert isinstance(r, torchlax_core.Tensor) and r.dtype == torch.float32
        torch.testing.assert_close(r.cpu(), a_cpu * b_cpu)


def test_new_shape_and_new_dtype_redispatch(env):
    for shape, dtype in (
        ((5,), torch.float32),
        ((2, 3), torch.float32),
        ((5,), torch.float64),
        ((5,), torch.int64),
        ((5,), torch.float32),
    ):
        a_cpu = (torch.randn(shape) * 10).to(dtype)
        b_cpu = (torch.randn(shape) * 10).to(dtype)
        a, b = jax_tensor(a_cpu), jax_tensor(b_cpu)
        for _ in range(3):
            out = torch.sub(a, b)
            assert out.dtype == dtype and out.shape == shape
            torch.testing.assert_close(out.cpu(), a_cpu - b_cpu)
    cached = [k for k in env._op_cache.entries if k[0].func is torch.ops.aten.sub.Tensor]
    assert len(cached) >= 4  # one executable per shape and dtype


def test_python_scalars_and_weak_typed_arrays_are_part_of_the_signature(env):
    i_cpu = torch.arange(6)
    i = jax_tensor(i_cpu)
    for _ in range(3):
        for scalar in (2, 2.5, True, -0.0):
            out = i * scalar
            expected = i_cpu * scalar
            assert out.dtype == expected.dtype, scalar
            torch.testing.assert_close(out.cpu(), expected)
    # A weak-typed 0-d array (as jnp makes from a Python scalar) keys apart from a strong one.
    f = jax_tensor(torch.linspace(0, 1, 4))
    weak = torchlax_core.wrap(jnp.asarray(3.0))  # weak float64 (64-bit mode is on here)
    strong = torchlax_core.wrap(jnp.array(3.0, dtype=jnp.float64))
    assert weak.jax().weak_type and not strong.jax().weak_type
    for _ in range(3):
        for s in (weak, strong):
            out = torch.add(f, s)
            assert out.dtype == torch.float32  # a 0-d tensor does not promote a float32 one
            torch.testing.assert_close(out.cpu(), torch.linspace(0, 1, 4) + 3.0)
    keys = [
        k
        for k in env._op_cache.entries
        if k[0].func is torch.ops.aten.add.Tensor
        and k[1] == f.jax().aval
        and isinstance(k[2], jax.core.ShapedArray)
        and k[2].shape == ()
    ]  # other tests' too
    assert {k[2].weak_type for k in keys} == {True, False}


def test_plugin_override_after_the_cache_filled_invalidates_it(env):
    # ``a + b`` is served by the Tensor's fast method (_fast_methods), ``torch.add`` through
    # PyTorch's dispatcher: both hit the same cache, and both must see the override.
    a_cpu, b_cpu = torch.randn(4), torch.randn(4)
    a, b = jax_tensor(a_cpu), jax_tensor(b_cpu)
    for _ in range(3):
        torch.testing.assert_close((a + b).cpu(), a_cpu + b_cpu)
        torch.testing.assert_close(torch.add(a, b).cpu(), a_cpu + b_cpu)
    assert env.stats()["op_cache_size"] > 0

    plugin = types.SimpleNamespace()

    @hookimpl
    def torchlax_register_lowerings(registry):
        registry.register_lowering(
            torch.ops.aten.add.Tensor, lambda x, y, alpha=1: x * 10 + y, override=True
        )

    plugin.torchlax_register_lowerings = torchlax_register_lowerings
    name = env.register_plugin(plugin, "test-op-cache-override")
    try:
        assert env.stats()["op_cache_size"] == 0
        for _ in range(3):
            torch.testing.assert_close((a + b).cpu(), a_cpu * 10 + b_cpu)
            torch.testing.assert_close(torch.add(a, b).cpu(), a_cpu * 10 + b_cpu)
    finally:
        env.unregister_plugin(name)
    for _ in range(3):
        torch.testing.assert_close((a + b).cpu(), a_cpu + b_cpu)


def test_random_ops_draw_fresh_values_every_call(env):
    x = jax_tensor(torch.ones(64))
    torch.manual_seed(0)
    drawn = [torch.nn.functional.dropout(x, 0.5).cpu() for _ in range(4)]
    drawn += [torch.rand_like(x).cpu() for _ in range(4)]
    for i, d in enumerate(drawn):
        for e in drawn[i + 1 :]:
            assert not torch.equal(d, e)
    torch.manual_seed(0)
    again = [torch.nn.functional.dropout(x, 0.5).cpu() for _ in range(4)]
    again += [torch.rand_like(x).cpu() for _ in range(4)]
    for d, e in zip(drawn, again, strict=True):
        assert torch.equal(d, e)


@pytest.mark.parametrize("min_calls", [1, 2])
def test_a_random_op_reseeded_draws_the_same_values_from_its_first_call(env, min_calls):
    # With op_cache_min_calls=1 the first call runs the op plainly, then tries to compile it
    # (refused: it draws keys); it must answer with that first run, not run the op again
    # (a second draw: values other than the reseeded calls' after it).
    env.config.op_cache_min_calls = min_calls
    x = jax_tensor(torch.ones(10))
    drawn = []
    for _ in range(3):
        torch.manual_seed(1)
        drawn.append((torch.rand_like(x).cpu(), torch.randn(4, device="jax").cpu()))
    for uniform, normal in drawn[1:]:
        assert torch.equal(uniform, drawn[0][0]) and torch.equal(normal, drawn[0][1])


def test_a_seeded_op_that_draws_nothing_is_cached_with_its_python_results(env):
    # PyTorch tags the jax device's attention op nondeterministic_seeded (for dropout); with
    # dropout_p=0 it draws nothing and is cached. It also returns Python ints (max_q, max_k),
    # which the executable cannot return: they come back as ints, not tensors.
    op = torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default
    q_cpu, k_cpu, v_cpu = (torch.randn(2, 3, 5, 4) for _ in range(3))
    q, k, v = (jax_tensor(t) for t in (q_cpu, k_cpu, v_cpu))
    expected = torch.nn.functional.scaled_dot_product_attention(q_cpu, k_cpu, v_cpu)
    hits, _, _ = stats(env)
    for _ in range(3):
        out = op(q, k, v)
        torch.testing.assert_close(out[0].cpu(), expected)
        assert (out[4], out[5]) == (5, 5) and type(out[4]) is int
        assert out[2] is None and out[8] is None
    assert stats(env)[0] - hits >= 1
    assert op not in env._op_cache.uncacheable
    # With dropout it draws: fresh values on every call, and that signature is never compiled.
    ones = jax_tensor(torch.ones(2, 3, 5, 4))
    drawn = [op(q, k, ones, None, 0.5)[0].cpu() for _ in range(4)]
    assert len({tuple(d.flatten().tolist()) for d in drawn}) == 4
    assert "draws PRNG keys" in env._op_cache.uncacheable.get(op, "")
    # Without dropout (a model in eval after training) it is still served by its executable.
    hits = stats(env)[0]
    for _ in range(2):
        torch.testing.assert_close(op(q, k, v)[0].cpu(), expected)
    assert stats(env)[0] - hits == 2


def test_a_lowering_that_draws_keys_is_never_cached(env):
    """Found by tracing, not by the op's tags: a plugin's lowering of a deterministic op."""
    plugin = types.SimpleNamespace()

    @hookimpl
    def torchlax_register_lowerings(registry):
        def noisy_sin(x):
            key = torchlax_core.current_env().next_prng_key()
            return jnp.sin(x) + jax.random.uniform(key, x.shape, x.dtype)

        registry.register_lowering(torch.ops.aten.sin.default, noisy_sin, override=True)

    plugin.torchlax_register_lowerings = torchlax_register_lowerings
    name = env.register_plugin(plugin, "test-op-cache-random")
    try:
        x = jax_tensor(torch.zeros(32))
        outs = [torch.sin(x).cpu() for _ in range(4)]
        for i, o in enumerate(outs):
            for p in outs[i + 1 :]:
                assert not torch.equal(o, p)
        assert "aten.sin.default" in env.stats()["op_cache_uncacheable"]
    finally:
        env.unregister_plugin(name)


def test_ops_that_read_values_on_the_host_are_not_cached(env):
    for data in ([0, 3, 0, 1], [1, 1, 0, 0], [0, 0, 0, 5]):
        x_cpu = torch.tensor(data)
        x = jax_tensor(x_cpu)
        for _ in range(2):
            torch.testing.assert_close(torch.nonzero(x).cpu(), torch.nonzero(x_cpu))
            torch.testing.assert_close(x[x > 0].cpu(), x_cpu[x_cpu > 0])
    uncacheable = env.stats()["op_cache_uncacheable"]
    assert "aten.nonzero.default" in uncacheable


def test_a_signature_that_reads_on_the_host_leaves_the_other_signatures_cached(env):
    """``x[mask]`` reads the mask's count on the host; ``x[indices]`` (the same op,
    ``index.Tensor``) does not, and stays compiled: refusals are per signature, so one boolean
    mask does not leave every gather of the process uncompiled."""
    x_cpu = torch.randn(6)
    x, mask = jax_tensor(x_cpu), jax_tensor(x_cpu > 0)
    for _ in range(3):
        torch.testing.assert_close(x[mask].cpu(), x_cpu[x_cpu > 0])
    assert "aten.index.Tensor" in env.stats()["op_cache_uncacheable"]
    indices_cpu = torch.tensor([0, 2, 5])
    indices = jax_tensor(indices_cpu)
    hits, _, compiles = stats(env)
    for _ in range(4):  # plain, compile, hit, hit
        torch.testing.assert_close(x[indices].cpu(), x_cpu[indices_cpu])
    h, _, c = stats(env)
    assert (h - hits, c - compiles) == (2, 1)
    # The refused signature still runs plainly, correctly, and compiles nothing.
    torch.testing.assert_close(x[mask].cpu(), x_cpu[x_cpu > 0])
    assert stats(env)[2] == c


def test_value_checks_still_raise_after_the_signature_is_cached(env):
    """A lowering that checks values eagerly (an index out of range) is not compiled away."""
    src = jax_tensor(torch.arange(5.0))
    good, bad = jax_tensor(torch.tensor([0, 4])), jax_tensor(torch.tensor([0, 5]))
    for _ in range(3):
        torch.testing.assert_close(torch.index_select(src, 0, good).cpu(), torch.tensor([0.0, 4.0]))
    with pytest.raises(IndexError):
        torch.index_select(src, 0, bad)


def test_inside_a_jax_trace_the_lowering_just_runs(env):
    hits, misses, _ = stats(env)

    @jax.jit
    def f(x):
        t = torchlax_core.wrap(x)
        return torchlax_core.unwrap(t * 2 + 1)

    x = jnp.arange(3.0)
    for _ in range(3):
        assert jnp.array_equal(f(x), x * 2 + 1)
        assert jnp.array_equal(f(x + 1), (x + 1) * 2 + 1)
    assert stats(env)[:2] == (hits, misses)  # tracers never reach the cache


def test_a_full_cache_evicts_the_entry_not_hit_since_the_others(env):
    # Least recently used by second chance: a hit marks its entry, a full cache passes over
    # marked entries (unmarking them) and evicts the first unmarked one, not simply the oldest.
    env.config.op_cache_size = 2
    older, newer, third = (jax_tensor(torch.ones(n)) for n in (3, 4, 5))
    for t in (older, newer):
        for _ in range(2):  # plain, then compiled
            torch.neg(t)
    hits = stats(env)[0]
    torch.testing.assert_close(torch.neg(older).cpu(), -torch.ones(3))  # a hit marks it
    assert stats(env)[0] == hits + 1
    for _ in range(2):
        torch.testing.assert_close(torch.neg(third).cpu(), -torch.ones(5))
    cached = sorted(
        k[1].shape for k in env._op_cache.entries if k[0].func is torch.ops.aten.neg.default
    )
    assert cached == [(3,), (5,)]  # `newer`, compiled after `older` but not hit since, went
    hits = stats(env)[0]
    torch.neg(older)
    assert stats(env)[0] == hits + 1


def test_the_cache_is_bounded_and_can_be_turned_off(env):
    env.config.op_cache_size = 2
    for n in (3, 4, 5, 6):
        t = jax_tensor(torch.ones(n))
        for _ in range(2):
            torch.testing.assert_close(torch.neg(t).cpu(), -torch.ones(n))
    assert env.stats()["op_cache_size"] <= 2
    env.config.op_cache_size = 0
    hits, misses, _ = stats(env)
    t = jax_tensor(torch.ones(3))
    for _ in range(3):
        torch.testing.assert_close(torch.neg(t).cpu(), -torch.ones(3))
    assert stats(env)[:2] == (hits, misses)


def test_in_place_ops_use_the_functional_executable(env):
    a_cpu, b_cpu = torch.randn(6), torch.randn(6)
    a, b = jax_tensor(a_cpu.clone()), jax_tensor(b_cpu)
    hits = stats(env)[0]
    for _ in range(4):
        a.add_(b, alpha=0.5)
        a_cpu.add_(b_cpu, alpha=0.5)
    torch.testing.assert_close(a.cpu(), a_cpu)
    assert stats(env)[0] > hits


def test_slow_compilations_are_counted_and_logged_once(env, caplog):
    before = env.stats()
    with caplog.at_level(logging.INFO, logger="torchlax"):
        _stats.record_compile("my_program", 3.5, env)
        _stats.record_compile("my_program", 4.0, env)
        _stats.record_compile("fast_program", 0.01, env)
    after = env.stats()
    assert after["compilations"] == before["compilations"] + 3
    assert after["compile_seconds"] == pytest.approx(before["compile_seconds"] + 7.51)
    slow = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(slow) == 1 and "my_program" in slow[0] and "3.5 s" in slow[0]


def test_value_checks_are_compiled_in_and_raise_from_the_executable(env):
    """gather's index check is part of the cached program: hits, and still PyTorch's error."""
    src_cpu = torch.randn(6, 4)
    src = jax_tensor(src_cpu)
    for data in ([[0], [3], [1], [2], [0], [3]], [[1], [1], [0], [2], [3], [0]]):
        index_cpu = torch.tensor(data)
        index = jax_tensor(index_cpu)
        for _ in range(3):
            r = torch.gather(src, 1, index)
            torch.testing.assert_close(r.cpu(), torch.gather(src_cpu, 1, index_cpu))
    assert "aten.gather.default" not in env.stats()["op_cache_uncacheable"]
    hits = stats(env)[0]
    bad_cpu = torch.tensor([[0], [4], [1], [2], [0], [3]])
    with pytest.raises(RuntimeError) as expected:
        torch.gather(src_cpu, 1, bad_cpu)
    with pytest.raises(RuntimeError) as got:
        torch.gather(src, 1, jax_tensor(bad_cpu))
    assert str(got.value) == str(expected.value)
    assert stats(env)[0] == hits + 1  # the executable answered, and raised


def test_nll_loss_is_cached_and_checks_its_targets(env):
    x_cpu = torch.randn(5, 3, requires_grad=True)
    target_cpu = torch.tensor([0, 2, 1, 2, 0])
    loss_cpu = torch.nn.functional.nll_loss(x_cpu, target_cpu)
    (grad_cpu,) = torch.autograd.grad(loss_cpu, x_cpu)
    x = jax_tensor(x_cpu.detach()).requires_grad_()
    target = jax_tensor(target_cpu)
    for _ in range(3):
        loss = torch.nn.functional.nll_loss(x, target)
        (grad,) = torch.autograd.grad(loss, x)
        torch.testing.assert_close(loss.cpu(), loss_cpu)
        torch.testing.assert_close(grad.cpu(), grad_cpu)
    uncacheable = env.stats()["op_cache_uncacheable"]
    assert "aten.nll_loss_forward.default" not in uncacheable
    assert "aten.nll_loss_backward.default" not in uncacheable
    with pytest.raises(IndexError, match="Target 3 is out of bounds"):
        torch.nn.functional.nll_loss(x, jax_tensor(torch.tensor([0, 3, 1, 2, 0])))


def test_factories_without_array_inputs_are_cached_per_value_and_dtype(env):
    hits = stats(env)[0]
    for value, dtype in ((0.0, None), (1.5, None), (0.0, None), (3, torch.int64), (-0.0, None)):
        for _ in range(3):
            r = torch.full((2, 3), value, dtype=dtype, device="jax")
            expected = torch.full((2, 3), value, dtype=dtype)
            assert r.dtype == expected.dtype
            torch.testing.assert_close(r.cpu(), expected)
            assert torch.equal(r.cpu().signbit(), expected.signbit())
    assert stats(env)[0] > hits
    draws = [torch.rand(4, device="jax").cpu() for _ in range(4)]
    assert len({tuple(d.tolist()) for d in draws}) == 4


def test_a_transpose_is_a_deferred_view_folded_into_the_next_cached_op(env):
    """``w.t()`` copies nothing: addmm's executable takes ``w`` and transposes inside."""
    w_cpu, x_cpu, b_cpu = torch.randn(6, 4), torch.randn(3, 4), torch.randn(6)
    w, x, b = jax_tensor(w_cpu), jax_tensor(x_cpu), jax_tensor(b_cpu)
    for _ in range(3):
        wt = w.t()
        assert wt._base is w and wt.shape == (4, 6) and wt.stride() == w_cpu.t().stride()
        assert wt.storage_offset() == 0
        r = torch.addmm(b, x, wt)
        torch.testing.assert_close(r.cpu(), torch.addmm(b_cpu, x_cpu, w_cpu.t()))
    hits = stats(env)[0]
    torch.addmm(b, x, w.t())  # a new view of the same signature: a hit
    assert stats(env)[0] == hits + 1
    r = torch.addmm(b, x, w.transpose(1, 0))
    torch.testing.assert_close(r.cpu(), torch.addmm(b_cpu, x_cpu, w_cpu.transpose(1, 0)))
    torch.testing.assert_close(w.transpose(-1, 0).cpu(), w_cpu.transpose(-1, 0))
    # Writes reach a deferred view, and go through it, as through any view.
    root = w.clone()
    view = root.t()
    root.add_(1)
    torch.testing.assert_close(view.cpu(), (w_cpu + 1).t())
    root = w.clone()
    view = root.t()
    view.mul_(2)
    torch.testing.assert_close(root.cpu(), w_cpu * 2)
    with pytest.raises(IndexError):
        w.transpose(0, 2)


@pytest.mark.parametrize(
    "split",
    [
        lambda t: t.split(2, dim=1),
        lambda t: t.split([1, 3, 2], dim=1),
        lambda t: t.unbind(0),
    ],
    ids=["split", "split_with_sizes", "unbind"],
)
def test_split_results_are_deferred_views_folded_into_the_next_cached_op(env, split):
    """``q, k, v = qkv.split(...)``: each result is a view of the root computed in its consumer."""
    x_cpu = torch.randn(3, 6)
    x = jax_tensor(x_cpu)
    for _ in range(3):
        parts, expected = split(x), split(x_cpu)
        assert len(parts) == len(expected)
        for part, want in zip(parts, expected, strict=True):
            assert part._base is x and part.shape == want.shape
            assert part.stride() == want.stride()
            assert part.storage_offset() == want.storage_offset()
            assert part._view.seen is None  # not computed yet
            torch.testing.assert_close((part * 2).cpu(), want * 2)
    hits = stats(env)[0]
    last = split(x)[-1] * 2  # a new view of the same signature: a hit, the right slice
    assert stats(env)[0] == hits + 1
    torch.testing.assert_close(last.cpu(), split(x_cpu)[-1] * 2)
    torch.testing.assert_close(split(x)[1].cpu(), split(x_cpu)[1])  # read directly
    # Writes go through a deferred result into the root, and reach its siblings.
    root_cpu, root = x_cpu.clone(), x.clone()
    first, second = split(root)[:2]
    first.mul_(3)
    split(root_cpu)[0].mul_(3)
    torch.testing.assert_close(root.cpu(), root_cpu)
    torch.testing.assert_close(second.cpu(), split(root_cpu)[1])


def test_deferred_views_in_a_list_argument_are_folded_too(env):
    """``cat`` of transposed halves (a KV cache update) takes the views' roots."""
    x_cpu = torch.randn(4, 6)
    x = jax_tensor(x_cpu)
    for _ in range(3):
        halves = x.split(3, dim=1)
        parts = [h.t() for h in halves]
        assert all(p._view.seen is None for p in parts)
        r = torch.cat([parts[0], x.t()[:3], parts[1]])
        expected = torch.cat([h.t() for h in x_cpu.split(3, dim=1)][:1] + [x_cpu.t()[:3]])
        expected = torch.cat([expected, x_cpu.split(3, dim=1)[1].t()])
        torch.testing.assert_close(r.cpu(), expected)
    assert all(p._view.seen is None for p in parts)  # never computed on their own


def test_detach_of_a_deferred_view_stays_deferred(env):
    """Autograd detaches a weight's gradient (often ``grad.t()``) before SGD reads it."""
    w_cpu = torch.randn(3, 5)
    w = jax_tensor(w_cpu)
    view = w.t()
    detached = view.detach()
    assert detached._view.seen is None and not detached.requires_grad
    assert detached.stride() == w_cpu.t().stride()
    assert (detached._base is None) == (w_cpu.t().detach()._base is None)
    torch.testing.assert_close(detached.cpu(), w_cpu.t())
    root = w.clone()
    detached = root.t().detach()
    detached.mul_(2)  # writes reach the root, as through any view
    torch.testing.assert_close(root.cpu(), w_cpu * 2)


def test_a_cached_op_leaves_exclusivity_while_plain_runs_and_hand_outs_clear_it(env):
    """Exclusivity (what a compiled program may donate) is cleared where an array may escape,
    not on every read: a hit's executable returns new buffers, so it keeps the flag."""
    from torchlax_core.internal import is_exclusive, set_exclusive

    a, b = jax_tensor(torch.randn(6)), jax_tensor(torch.randn(6))
    for _ in range(3):
        torch.sub(a, b)  # plain, compile, hit: the signature is cached now
    set_exclusive(a)
    torch.sub(a, b)  # a hit reads a's array into an executable
    assert is_exclusive(a)
    a.t()  # a view shares the storage
    assert is_exclusive(a)
    torch.sub(a, jax_tensor(torch.randn(5, 6)))  # a new signature: the lowering runs plainly
    assert not is_exclusive(a)
    set_exclusive(a)
    held = a.jax()  # handed out
    assert not is_exclusive(a) and not held.is_deleted()
    c = jax_tensor(torch.randn(6))
    set_exclusive(c)
    c.copy_(b)  # c's storage now holds an array someone else may hold
    assert not is_exclusive(c)
    set_exclusive(a)
    assert not is_exclusive(a.t())  # a transposed view is not the storage's whole array


def test_the_hot_path_keys_a_call_as_the_general_path_does(env):
    # A hit builds its signature from the Tensors directly (_cached_op._make_hit_key); a miss
    # unwraps first (_opcache.signature). Keys that differed would compile every signature
    # again under a second key, and the hot path would never hit.
    from torchlax_core import _cached_op, _opcache, _unwrap

    aten = torch.ops.aten
    a, b = jax_tensor(torch.randn(4, 3)), jax_tensor(torch.randn(4, 3))
    x, w = jax_tensor(torch.randn(2, 3)), jax_tensor(torch.randn(5, 3))
    bias = jax_tensor(torch.randn(5))
    wt = w.t()  # deferred: the executable applies it
    read = a[1:]
    read.cpu()  # a view computed already: its array is the key's
    calls = [
        (aten.add.Tensor, (a, b), {"alpha": 2}),
        (aten.add.Tensor, (read, b[1:]), {}),
        (aten.mul.Scalar, (a, 2.5), {}),
        (aten.mul.Tensor, (a, 2), {}),  # `a * 2`: PyTorch passes the number as it is
        (aten.add.Tensor, (a, 1.5), {"alpha": 2}),
        (aten.sub.Tensor, (a, True), {}),
        (aten.mm.default, (x, wt), {}),
        (aten.addmm.default, (bias, x, wt), {"beta": 0.5}),
        (aten.where.self, (a > 0, a, b), {}),
        (aten.sum.dim_IntList, (a, [1], True), {}),
    ]
    cache = env._op_cache
    for func, args, kwargs in calls:
        op = cache.op(func)
        jargs, jkwargs = _unwrap._make_unwrapper(func, defer_views=True)(args, kwargs)
        general: list = []
        expected = _opcache.signature(op, jargs, jkwargs, general)
        hot: list = []
        assert _cached_op._make_hit_key(func, op)(args, kwargs, hot) == expected, func
        assert [id(leaf) for leaf in hot] == [id(leaf) for leaf in general], func
    # What the hot path leaves to the general one: a list of tensors, a CPU scalar tensor.
    cat = torch.ops.aten.cat.default
    assert _cached_op._make_hit_key(cat, cache.op(cat))(([a, b], 0), {}, []) is None
    add = aten.add.Tensor
    assert _cached_op._make_hit_key(add, cache.op(add))((a, torch.tensor(2.0)), {}, []) is None
    # A pointwise op's layout rule sees views and kwargs first: its root-only hot path refuses.
    roots_only = _cached_op._make_hit_key(add, cache.op(add), roots_only=True)
    assert roots_only((a, b), {}, []) == _cached_op._make_hit_key(add, cache.op(add))(
        (a, b), {}, []
    )
    assert roots_only((read, b[1:]), {}, []) is None
    assert roots_only((a, b), {"alpha": 2}, []) is None


def test_a_repeated_bad_call_leaves_the_op_cacheable(env):
    """Arguments the op refuses raise every time, and say nothing about the op: compiling
    their signature on a repeat used to raise in the trace and mark ``sub`` never cached."""
    a, b = jax_tensor(torch.ones(2)), jax_tensor(torch.ones(3))
    for _ in range(3):
        with pytest.raises(RuntimeError, match="must match the size"):
            torch.sub(a, b)
    assert torch.ops.aten.sub.Tensor not in env._op_cache.uncacheable
    c = jax_tensor(torch.arange(5.0))
    hits = stats(env)[0]
    for _ in range(4):
        torch.testing.assert_close(torch.sub(c, c).cpu(), torch.zeros(5))
    assert stats(env)[0] > hits


def test_an_argument_of_another_layout_is_transposed_inside_the_cached_op(env, monkeypatch):
    """``x.t() + y`` (y row-major) lays its result out as ``x.t()``: ``y`` goes to the cached
    executable as a deferred transpose, applied inside it, not as an eagerly transposed copy
    (one XLA dispatch and a copy of y per call)."""
    from torchlax_core import _layouts

    x_cpu, y_cpu = torch.randn(5, 3), torch.randn(3, 5)
    x, y = jax_tensor(x_cpu), jax_tensor(y_cpu)
    for _ in range(2):  # the second call compiles the signature
        out = x.t() + y
    transposes = []
    real = jax.lax.transpose
    monkeypatch.setattr(
        _layouts.jax.lax, "transpose", lambda *a, **k: transposes.append(a) or real(*a, **k)
    )
    before = stats(env)
    out = x.t() + y
    assert transposes == []
    assert stats(env)[0] == before[0] + 1  # a hit, nothing compiled
    assert stats(env)[2] == before[2]
    expected = x_cpu.t() + y_cpu
    assert out.stride() == expected.stride() == (1, 3)
    torch.testing.assert_close(out.cpu(), expected)
