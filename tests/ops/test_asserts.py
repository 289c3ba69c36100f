"""torch._assert_async on torchlax Tensors: raises as PyTorch does eagerly."""

import pytest
import torch
import torchlax_core


@pytest.mark.parametrize(
    "args",
    [
        (torch.tensor(False),),
        (torch.tensor(0.0),),
        (torch.tensor(False), "x must be positive"),
        (torch.tensor([True, True]),),
        (torch.tensor([]),),
    ],
    ids=["false", "zero", "message", "two-values", "empty"],
)
def test_failing_assert_raises_what_pytorch_raises(args):
    with pytest.raises(RuntimeError) as expected:
        torch._assert_async(*args)
    with torchlax_core.enable():
        jax_args = (args[0].to("jax"),) + args[1:]
        with pytest.raises(RuntimeError) as actual:
            torch._assert_async(*jax_args)
    assert str(actual.value) == str(expected.value)


def test_passing_assert_returns_none():
    with torchlax_core.enable():
        x = torch.tensor([1.0, 2.0], device="jax")
        assert torch._assert_async((x > 0).all()) is None
        assert torch._assert_async(x.sum(), "{braces} kept") is None
        with pytest.raises(RuntimeError, match=r"^\{braces\} kept$"):
            torch._assert_async(x.sum() * 0, "{braces} kept")
