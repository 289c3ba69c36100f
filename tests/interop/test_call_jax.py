"""call_jax: a JAX function called from PyTorch, eagerly, through autograd and torch.compile."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torchlax_core
from torchlax_interop import call_jax, from_torch


def jax_fn(x, y, *, scale):
    return {"scaled": jnp.sin(x) * scale, "pair": (x @ y, jnp.arange(3))}


def torch_fn(x, y, *, scale):
    return {"scaled": torch.sin(x) * scale, "pair": (x @ y, torch.arange(3))}


def test_values_structure_and_dtypes_match_torch():
    x, y = torch.randn(3, 4), torch.randn(4, 2)
    got = call_jax(jax_fn, x, y, scale=3.0)
    want = torch_fn(x, y, scale=3.0)
    assert type(got["scaled"]) is torch.Tensor and isinstance(got["pair"], tuple)
    torch.testing.assert_close(got["scaled"], want["scaled"])
    torch.testing.assert_close(got["pair"][0], want["pair"][0])
    assert got["pair"][1].dtype == torch.int64  # JAX runs with 64-bit types
    torch.testing.assert_close(got["pair"][1], want["pair"][1])


def test_float64_and_int64_inputs_keep_their_dtypes():
    x = torch.arange(5, dtype=torch.int64)
    d = torch.linspace(0, 1, 5, dtype=torch.float64)
    out = call_jax(lambda a, b: (a * 2, b * 2), x, d)
    assert out[0].dtype == torch.int64 and out[1].dtype == torch.float64
    torch.testing.assert_close(out[0], x * 2)


def test_output_never_aliases_an_input():
    x = torch.randn(4)
    out = call_jax(lambda a: a, x)
    assert out.data_ptr() != x.data_ptr()
    torch.testing.assert_close(out, x)


def test_backward_matches_torch_autograd():
    x = torch.randn(3, 4, requires_grad=True)
    y = torch.randn(4, 2, requires_grad=True)
    out = call_jax(jax_fn, x, y, scale=2.0)
    (out["scaled"].sum() + (out["pair"][0] ** 2).sum()).backward()
    xr, yr = x.detach().requires_grad_(), y.detach().requires_grad_()
    ref = torch_fn(xr, yr, scale=2.0)
    (ref["scaled"].sum() + (ref["pair"][0] ** 2).sum()).backward()
    torch.testing.assert_close(x.grad, xr.grad)
    torch.testing.assert_close(y.grad, yr.grad)


def test_backward_with_an_unused_output_and_an_integer_input():
    x = torch.randn(5, requires_grad=True)
    index = torch.tensor([0, 2, 4])
    out, unused = call_jax(lambda a, i: (a[i] * 3.0, jnp.cos(a)), x, index)
    out.sum().backward()
    torch.testing.assert_close(x.grad, torch.tensor([3.0, 0, 3.0, 0, 3.0]))


def test_torchlax_tensors_in_torchlax_tensors_out_with_backward():
    x = from_torch(torch.randn(3, 3)).requires_grad_()
    out = call_jax(jnp.tanh, x)
    assert isinstance(out, torchlax_core.Tensor)
    torch.testing.assert_close(out.cpu(), torch.tanh(x.cpu().detach()))
    seed = torch.ones(3, 3)
    out.backward(from_torch(seed))
    expected = 1 - torch.tanh(x.cpu().detach()) ** 2
    torch.testing.assert_close(x.grad.cpu(), expected)


def test_unhashable_static_argument_is_a_clear_error():
    with pytest.raises(TypeError, match="hashable"):
        call_jax(lambda a, b: a, torch.ones(2), np.ones(3))


# -- torch.compile ---------------------------------------------------------------------------------


def _model(x, w):
    h = torch.relu(x @ w)
    out = call_jax(lambda a, s: {"y": jnp.sin(a) * s}, h, s=2.0)["y"]
    return (out * out).sum()


def test_compile_has_no_graph_break():
    torch._dynamo.reset()
    x, w = torch.randn(4, 3), torch.randn(3, 5)
    explanation = torch._dynamo.explain(_model)(x, w)
    assert explanation.graph_break_count == 0
    assert explanation.graph_count == 1


def test_compile_fullgraph_counting_backend_forward_and_backward():
    torch._dynamo.reset()
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(_model, backend=counting, fullgraph=True)
    x = torch.randn(4, 3)
    w = torch.randn(3, 5, requires_grad=True)
    loss = compiled(x, w)
    assert len(graphs) == 1
    assert any("torchlax_interop.call_jax" in str(node.target) for node in graphs[0].graph.nodes)
    loss.backward()
    w_ref = w.detach().clone().requires_grad_()
    _model(x, w_ref).backward()
    torch.testing.assert_close(loss, _model(x, w_ref.detach()))
    torch.testing.assert_close(w.grad, w_ref.grad)


@pytest.mark.slow
def test_compile_with_inductor_matches_eager_and_backward_works():
    torch._dynamo.reset()
    compiled = torch.compile(_model, fullgraph=True)  # the default backend: inductor
    x = torch.randn(4, 3)
    w = torch.randn(3, 5, requires_grad=True)
    loss = compiled(x, w)
    loss.backward()
    w_ref = w.detach().clone().requires_grad_()
    ref = _model(x, w_ref)
    ref.backward()
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(w.grad, w_ref.grad)


def test_jax_jit_function_works_too():
    fn = jax.jit(lambda a: a * 2 + 1)
    x = torch.arange(4.0, requires_grad=True)
    out = call_jax(fn, x)
    out.sum().backward()
    torch.testing.assert_close(x.grad, torch.full((4,), 2.0))


def test_inside_torchlax_jit_with_backward():
    from torchlax_interop import jit

    fn = jit(lambda x: call_jax(jnp.sin, x) * 2)
    x = from_torch(torch.linspace(0, 1, 5)).requires_grad_()
    out = fn(x)
    torch.testing.assert_close(out.cpu().detach(), torch.sin(torch.linspace(0, 1, 5)) * 2)
    out.backward(from_torch(torch.ones(5)))
    torch.testing.assert_close(x.grad.cpu(), 2 * torch.cos(torch.linspace(0, 1, 5)))


def test_a_function_made_per_call_does_not_pile_up_and_backward_still_runs():
    import gc

    from torchlax_interop import _call_jax

    x = torch.randn(4, requires_grad=True)
    outs = [call_jax(lambda a, k=k: jnp.sin(a) * k, x) for k in range(1, 4)]
    gc.collect()
    before = len(_call_jax._ENTRIES)
    for k in range(20):
        call_jax(lambda a, k=k: a * k, x.detach())
    gc.collect()
    assert len(_call_jax._ENTRIES) <= before + 1
    sum(o.sum() for o in outs).backward()  # the lambdas live as long as the graph needs them
    torch.testing.assert_close(x.grad, 6 * torch.cos(x.detach()))
