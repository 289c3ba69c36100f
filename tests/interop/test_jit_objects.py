"""jit: returned objects that are not pytree nodes (a transformers cache, a user's class) come
back with the tensors the program computed, a fresh object per call, as eagerly."""

import functools

import pytest
import torch
import torchlax_core
from torchlax_interop import from_torch, jit


class Holder:
    """A plain object, not a pytree node: a list of tensors and an int."""

    def __init__(self, tensors, count):
        self.tensors = tensors
        self.count = count


def _holding(x):
    return x.sum(), Holder([x * 2, torch.sin(x)], 7)


def test_object_holding_tensors_matches_eager_and_is_fresh_per_call():
    x = torch.randn(3, 4)
    _, expected = _holding(x)
    fn = jit(_holding)
    _, first = fn(from_torch(x))
    _, second = fn(from_torch(x + 1))
    assert type(first) is Holder and first.count == 7
    assert first is not second and first.tensors is not second.tensors
    for got, want in zip(first.tensors, expected.tensors, strict=True):
        assert isinstance(got, torchlax_core.Tensor)
        torch.testing.assert_close(got.cpu(), want)
    # the second call did not write into the first call's object
    torch.testing.assert_close(first.tensors[0].cpu(), x * 2)
    torch.testing.assert_close(second.tensors[1].cpu(), torch.sin(x + 1))
    third = fn(from_torch(x))[1]  # the cached program's template holds no tracer, no tensor
    assert all(isinstance(t, torchlax_core.Tensor) for t in third.tensors)
    torch.testing.assert_close(third.tensors[1].cpu(), torch.sin(x))
    assert fn.compilations == 1  # pyright: ignore[reportFunctionMemberAccess]  (jit returns a Callable)


def test_object_holding_an_input_and_a_parameter():
    linear = torch.nn.Linear(3, 2).to("jax")

    def fn(x):
        return Holder([linear(x), x, linear.weight], 0)

    x = torch.randn(4, 3)
    with torch.no_grad():
        got = jit(fn)(from_torch(x))
    # the parameter is state: the same object, as eagerly; the input comes back as the jit
    # returns inputs (a tensor of its value)
    assert got.tensors[2] is linear.weight
    torch.testing.assert_close(got.tensors[1].cpu(), x)
    expected = torch.nn.functional.linear(x, linear.weight.cpu(), linear.bias.cpu())
    torch.testing.assert_close(got.tensors[0].cpu(), expected)


def test_backward_through_a_tensor_of_a_returned_object():
    torch.manual_seed(0)
    linear = torch.nn.Linear(3, 2)
    x = torch.randn(4, 3)
    (linear(x) ** 2).sum().backward()
    expected = linear.weight.grad
    assert expected is not None
    linear.weight.grad = None
    linear.to("jax")
    got = jit(lambda x: Holder({"y": linear(x)}, 0))(from_torch(x))
    (got.tensors["y"] ** 2).sum().backward()
    grad = linear.weight.grad
    assert grad is not None
    torch.testing.assert_close(grad.cpu(), expected)


def test_object_output_with_cpu_tensors_in_and_out():
    x = torch.randn(5)
    _, got = jit(_holding)(x)
    assert all(type(t) is torch.Tensor for t in got.tensors)
    torch.testing.assert_close(got.tensors[1], torch.sin(x))


class _Uncopyable(Holder):
    def __copy__(self):
        raise TypeError("this object cannot be copied")


class _Cyclic(Holder):
    def __init__(self, tensors):
        super().__init__(tensors, 0)
        self.me = self


def _closing_over(value):
    return lambda: value


class _Twice(Holder):
    """A tensor in a list (where it can be put back) and in a set (where it cannot)."""

    def __init__(self, tensor):
        super().__init__([tensor], 0)
        self.again = {tensor}


class _Box:
    def __init__(self, tensor):
        self.tensor = tensor


class _TwiceHeld(Holder):
    """An object holding a tensor in a list (where it can be put back) and in a set."""

    def __init__(self, tensor):
        box = _Box(tensor)
        super().__init__([box], 0)
        self.again = {box}


@pytest.mark.parametrize(
    ("returns", "message"),
    [
        (
            lambda x: {"scale": functools.partial(torch.mul, x * 2)},
            r"partial at output\['scale'\] \(inside a partial\) holds a tensor the function "
            r"computed where torchlax cannot put another",
        ),
        (
            lambda x: (x, Holder(lambda: x * 3, 0)),
            r"Holder at output\[1\]\.tensors \(inside a closure\) holds a tensor",
        ),
        (lambda x: _Uncopyable([x + 1], 0), r"_Uncopyable at output cannot be copied"),
        (lambda x: _Cyclic([x + 1]), r"_Cyclic at output\.me reaches the same object"),
        (
            lambda x: (x, Holder([x.jax() * 2], 0)),  # pyright: ignore[reportAttributeAccessIssue]  (a torchlax Tensor)
            r"Holder at output\[1\]\.tensors\[0\] holds a JAX value computed inside",
        ),
        (
            lambda x: (x, Holder({x * 2}, 0)),
            r"Holder at output\[1\]\.tensors \(inside a set\) holds a tensor the function "
            r"computed where torchlax cannot put another",
        ),
        (
            lambda x: {"scale": functools.partial(torch.mul, x.jax() * 2)},  # pyright: ignore[reportAttributeAccessIssue]  (a torchlax Tensor)
            r"partial at output\['scale'\] \(inside a partial\) holds a JAX value computed "
            r"inside the function\.",
        ),
        (
            lambda x: {"f": functools.partial(print, _closing_over(x * 3))},
            r"partial at output\['f'\] \(inside a partial\) \(inside a closure\) holds a "
            r"tensor the function computed",
        ),
        (
            lambda x: (x, _Twice(x * 2)),
            r"_Twice at output\[1\]\.again \(inside a set\) holds a tensor the function",
        ),
        (
            lambda x: (x, _TwiceHeld(x * 2)),
            r"_TwiceHeld at output\[1\]\.again \(inside a set\) holds a tensor the function",
        ),
        (
            # more objects than the search for hidden tensors goes through
            lambda x: (x, Holder({(i,) for i in range(100_001)}, 0)),
            r"Holder at output\[1\]\.tensors \(inside a set\) is too large to search",
        ),
    ],
    ids=[
        "c-field",
        "closure",
        "uncopyable",
        "cycle",
        "jax-value",
        "set",
        "hidden-jax-value",
        "closure-inside-c-field",
        "also-hidden",
        "holder-also-hidden",
        "hidden-too-large",
    ],
)
def test_object_whose_tensors_cannot_be_put_back_raises_naming_it(returns, message):
    with pytest.raises(RuntimeError, match=message + ".*register_pytree_node.*use_cache=False"):
        jit(returns)(from_torch(torch.randn(3)))


def test_gpt2_cache_under_jit_matches_eager():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    torch.manual_seed(0)
    model = transformers.GPT2Model(config).eval()
    ids = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        expected = model(ids)
        with torchlax_core.enable():
            got = jit(model.to("jax"))(ids.to("jax"))
    torch.testing.assert_close(got.last_hidden_state.cpu(), expected.last_hidden_state)
    layers = got.past_key_values.layers
    assert len(layers) == len(expected.past_key_values.layers) == 1
    for layer, want in zip(layers, expected.past_key_values.layers, strict=True):
        torch.testing.assert_close(layer.keys.cpu(), want.keys)
        torch.testing.assert_close(layer.values.cpu(), want.values)
