"""Where the type hints (checked by basedpyright in CI) promise users something, it holds."""

import jax.numpy as jnp
import pytest
import torch
import torchlax
import torchlax_core
from torchlax_interop import distributed as D


def test_shard_shapes_takes_a_torchlax_tensor_or_a_jax_array_and_names_the_fix_otherwise():
    with torchlax_core.enable():
        t = torch.ones(4, 3, device="jax")
        assert isinstance(t, torchlax.Tensor)
        assert D.shard_shapes(t) == [(4, 3)]
    assert D.shard_shapes(jnp.ones((2, 5))) == [(2, 5)]
    with pytest.raises(
        TypeError, match=r"shard_shapes\(\) takes a torchlax Tensor.*tensor.to\('jax'\)"
    ):
        D.shard_shapes(torch.ones(2))


def test_functions_typed_for_torch_tensors_take_what_torch_ops_are_typed_to_return():
    # torch's stubs type every op's result as torch.Tensor, so these take torch.Tensor.
    cpu = torch.ones(2)
    assert torchlax.to_torch(cpu) is cpu  # returned as is, as its docstring says
    with pytest.raises(TypeError, match="torchlax.unwrap expects a torchlax.Tensor"):
        torchlax.unwrap(cpu)
    t = torchlax.wrap(jnp.arange(3.0))
    assert torchlax.unwrap(t * 2).tolist() == [0.0, 2.0, 4.0]


def test_materialize_reports_an_initializer_that_drops_a_buffer():
    # The message names the module and the buffer (building it used to fail on None.device).
    class Drops(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("running", torch.empty(3, device="meta"))

        def reset_parameters(self):
            self.running = None

    mesh = D.make_mesh((1,), ("data",))
    with pytest.raises(
        TypeError, match=r"Drops\.running is a NoneType on no device, not a torchlax"
    ):
        D.materialize(Drops(), mesh)
