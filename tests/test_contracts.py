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
    with pytest.raises(TypeError, match=r"shard_shapes\(\) takes a torchlax Tensor.*tensor.to\('jax'\)"):
        D.shard_shapes(torch.ones(2))
