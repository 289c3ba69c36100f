"""Unlowered ops, call_jax inside compiled code, compiled code inside JAX, other backends."""

import textwrap
import warnings

import fresh_python
import jax
import jax.numpy as jnp
import pytest
import torch
import torchlax_core
import torchlax_dynamo
import torchlax_interop
from dynamo_helpers import assert_same, to_jax

counters = torchlax_dynamo.counters


@torch.library.custom_op("torchlax_dynamo_test::unlowered", mutates_args=())
def unlowered(x: torch.Tensor) -> torch.Tensor:
    return x * 3 + 1


@unlowered.register_fake
def _(x):
    return torch.empty_like(x)


def with_unlowered_op(x, y):
    a = torch.sin(x) * y
    b = unlowered(a)
    return b.exp() - x


@pytest.mark.parametrize("on_jax", [False, True], ids=["cpu", "torchlax"])
def test_unlowered_op_runs_eagerly_between_xla_programs(on_jax):
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    compiled = torch.compile(with_unlowered_op, backend="torchlax", fullgraph=True)
    args = (to_jax(x), to_jax(y)) if on_jax else (x, y)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = compiled(*args)
        compiled(*args)
    named = [w for w in caught if "torchlax_dynamo_test.unlowered" in str(w.message)]
    if not on_jax:  # warned once per process: the torchlax run compiles the same op again
        assert len(named) == 1, [str(w.message) for w in caught]
    assert type(out) is (torchlax_core.Tensor if on_jax else torch.Tensor)
    assert_same(out, with_unlowered_op(x, y))
    assert counters["eager_nodes"] == 1
    assert counters["xla_programs"] == 2  # before and after the eager op


def test_data_moving_to_cpu_inside_the_graph():
    def f(x):
        return (x * 2).cpu() + 1

    x = torch.randn(3)
    out = torch.compile(f, backend="torchlax")(to_jax(x))
    assert type(out) is torch.Tensor and out.device.type == "cpu"
    assert_same(out, f(x))


def jax_gelu_sum(a, b):
    return jax.nn.gelu(a) @ b, jnp.sum(b)


@pytest.mark.parametrize("on_jax", [False, True], ids=["cpu", "torchlax"])
def test_call_jax_in_fullgraph_is_part_of_the_xla_program(on_jax):
    def f(x, w):
        h, s = torchlax_interop.call_jax(jax_gelu_sum, x * 2, w)
        return torch.relu(h) + s

    def expected(x, w):
        return torch.relu(torch.nn.functional.gelu(x * 2, approximate="tanh") @ w) + w.sum()

    x, w = torch.randn(4, 3), torch.randn(3, 5)
    compiled = torch.compile(f, backend="torchlax", fullgraph=True)
    args = (to_jax(x), to_jax(w)) if on_jax else (x, w)
    assert_same(compiled(*args), expected(x, w), rtol=1e-5, atol=1e-5)
    assert counters["xla_programs"] == 1 and counters["eager_nodes"] == 0


def test_call_jax_training_through_compiled_code():
    def f(x, w):
        (h, _) = torchlax_interop.call_jax(jax_gelu_sum, x, w)
        return h.square().mean()

    x = torch.randn(4, 3)
    w = torch.randn(3, 5, requires_grad=True)
    w_eager = w.detach().clone().requires_grad_(True)
    torch.compile(f, backend="torchlax", fullgraph=True)(x, w).backward()
    (torch.nn.functional.gelu(x, approximate="tanh") @ w_eager).square().mean().backward()
    assert_same(w.grad, w_eager.grad, rtol=1e-5, atol=1e-6)
    assert counters["eager_nodes"] == 0


def test_compiled_torch_function_inside_call_torch_under_jax_jit():
    compiled = torch.compile(lambda x, y: torch.tanh(x) * y + 1, backend="torchlax")

    @jax.jit
    def g(a, b):
        return torchlax_interop.call_torch(compiled, a, b) * 2

    a, b = jnp.arange(6.0).reshape(2, 3), jnp.ones((2, 3))
    out = g(a, b)
    expected = (torch.tanh(torch.arange(6.0).reshape(2, 3)) + 1) * 2
    assert_same(torch.from_dlpack(out), expected)
    # the compiled program was inlined into g's trace; a second call runs g's executable
    traces = counters["xla_traces"]
    assert traces == 1
    g(a + 1, b)
    assert counters["xla_traces"] == traces


def test_other_backends_still_work_in_the_same_process():
    code = textwrap.dedent("""
        import torch
        import torchlax, torchlax_dynamo  # noqa: F401
        def f(x):
            return torch.sin(x) * 2 + x.cos()
        x = torch.randn(8)
        for backend in ("inductor", "aot_eager", "eager", "torchlax"):
            torch._dynamo.reset()
            out = torch.compile(f, backend=backend)(x)
            assert type(out) is torch.Tensor, backend
            torch.testing.assert_close(out, f(x))
        print("ok")
    """)
    result = fresh_python.run(["-c", code], timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")
