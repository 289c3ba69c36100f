"""Random keys under torch.compile(backend="torchlax"), decided as torchlax.jit and export do.

Whether a program draws keys is learned by tracing it (a plugin's lowering of an op PyTorch
does not tag as random counts), and a program that draws gets a fresh key from torch's
generator on every call: different numbers each call, the same ones under the same seed.
"""

import jax
import pytest
import torch
import torchlax_core
import torchlax_dynamo

counters = torchlax_dynamo.counters

_lib = torch.library.Library("torchlax_dynamo_test", "DEF")
_lib.define("jitter(Tensor x) -> Tensor")  # random, but PyTorch does not know (no tag)
_lib.impl("jitter", lambda x: x + torch.rand_like(x), "CompositeExplicitAutograd")
_lib.impl("jitter", lambda x: torch.empty_like(x), "Meta")
_lib.define("jitter_long(Tensor x) -> Tensor")  # random for more than 4 elements only
_lib.impl("jitter_long", lambda x: x + torch.rand_like(x), "CompositeExplicitAutograd")
_lib.impl("jitter_long", lambda x: torch.empty_like(x), "Meta")


class _JitterLowering:
    @torchlax_core.hookimpl
    def torchlax_register_lowerings(self, registry):
        def jitter(x):
            key = torchlax_core.current_env().next_prng_key()
            return x + jax.random.uniform(key, x.shape, x.dtype)

        registry.register_lowering(torch.ops.torchlax_dynamo_test.jitter.default, jitter)

        def jitter_long(x):
            if x.shape[0] <= 4:
                return x
            key = torchlax_core.current_env().next_prng_key()
            return x + jax.random.uniform(key, x.shape, x.dtype)

        registry.register_lowering(torch.ops.torchlax_dynamo_test.jitter_long.default, jitter_long)


@pytest.fixture
def jitter_plugin():
    env = torchlax_core.default_env()
    name = env.register_plugin(_JitterLowering(), "dynamo-test-jitter")
    yield
    env.unregister_plugin(name)


@pytest.mark.parametrize("on_jax", [False, True], ids=["cpu", "torchlax"])
def test_plugin_lowering_drawing_keys_gets_a_fresh_key_per_call(jitter_plugin, on_jax):
    fn = torch.compile(lambda x: torch.ops.torchlax_dynamo_test.jitter(x) * 2, backend="torchlax")
    x = torch.zeros(64)
    if on_jax:
        x = x.to("jax")
    torch.manual_seed(0)
    first, second = fn(x).cpu(), fn(x).cpu()
    assert not torch.equal(first, second)  # not a constant baked in at trace time
    assert 0 <= first.min() and first.max() < 2
    torch.manual_seed(0)
    torch.testing.assert_close(fn(x).cpu(), first, rtol=0, atol=0)  # reproducible under a seed
    assert counters["xla_traces"] == 1  # learning that it draws keys costs no second trace


def test_whether_a_program_draws_keys_is_learned_per_signature(jitter_plugin):
    """One Dynamo graph (dynamic shapes), one XLA program per length: the short one draws no
    key (nothing taken from torch's generator), the long one a fresh key per call."""
    fn = torch.compile(
        lambda x: torch.ops.torchlax_dynamo_test.jitter_long(x) * 2,
        backend="torchlax",
        dynamic=True,
    )
    short, long = torch.zeros(3), torch.zeros(8)
    fn(short)
    first, second = fn(long), fn(long)
    assert not torch.equal(first, second)
    state = torch.get_rng_state()
    assert torch.equal(fn(short), short)
    assert torch.equal(torch.get_rng_state(), state)
    assert counters["graphs"] == 1 and counters["xla_traces"] == 2


def test_deterministic_program_draws_nothing_from_torchs_generator():
    fn = torch.compile(lambda x: x.sin() + 1, backend="torchlax")
    x = torch.randn(8)
    fn(x)
    state = torch.get_rng_state()
    fn(x)
    assert torch.equal(torch.get_rng_state(), state)


def test_dropout_fresh_each_call_and_reproducible():
    fn = torch.compile(lambda x: torch.nn.functional.dropout(x, 0.5), backend="torchlax")
    x = torch.ones(256)
    torch.manual_seed(3)
    a, b = fn(x), fn(x)
    assert not torch.equal(a, b)
    assert set(a.unique().tolist()) <= {0.0, 2.0}
    torch.manual_seed(3)
    torch.testing.assert_close(fn(x), a, rtol=0, atol=0)


def test_next_prng_key_raises_while_jax_traces_without_a_key_scope(jitter_plugin):
    with torchlax_core.enable():
        x = torch.zeros(4).to("jax")

    def traced(a):
        return torch.ops.torchlax_dynamo_test.jitter(torchlax_core.Tensor(a))._value()

    with pytest.raises(RuntimeError, match="outside any key scope"):
        jax.jit(traced)(x._value())


def test_backward_uses_the_forwards_dropout_mask():
    """The partitioner may recompute cheap ops in the backward, never a random one."""
    fn = torch.compile(lambda x: torch.nn.functional.dropout(x * 1.5, 0.5), backend="torchlax")
    x = torch.ones(1000, requires_grad=True)
    out = fn(x)
    out.sum().backward()
    torch.testing.assert_close(x.grad, (out.detach() != 0) * 3.0, rtol=0, atol=0)
