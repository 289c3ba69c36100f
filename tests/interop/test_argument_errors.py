"""Values interop cannot take raise ``InteropArgumentError`` naming the argument and what to do
(issue 37, item 8), not an error from deep inside JAX, DLPack or PyTorch."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
import torch
import torchlax
import torchlax_core
from torchlax_interop import InteropArgumentError


@pytest.mark.parametrize(
    ("result", "says"),
    [
        (lambda a: None, "returned None"),
        (lambda a: (a, None), "returned None inside"),
        (lambda a: "s", "returned a str"),
        (lambda a: jax.random.key(0), "jax.random.key_data"),
        (lambda a: jnp.zeros((2,), jax.dtypes.float0), "float0"),
    ],
    ids=["none", "none_inside", "string", "prng_key", "float0"],
)
@pytest.mark.parametrize("device", ["cpu", "jax"])
def test_call_jax_result_that_is_not_an_array(result, says, device):
    with torchlax_core.enable():
        x = torch.ones(3, device=device)
        with pytest.raises(InteropArgumentError, match=says):
            torchlax.call_jax(result, x)


def test_to_torch_of_a_prng_key():
    with pytest.raises(InteropArgumentError, match="jax.random.key_data"):
        torchlax.to_torch(jax.random.key(0))


def test_from_torch_of_a_nested_tensor():
    nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    with pytest.raises(InteropArgumentError, match="nested tensor.*to_padded_tensor"):
        torchlax.from_torch(nested)


@pytest.mark.parametrize(
    ("argument", "says"),
    [
        (lambda: torch.eye(3).to_sparse(), "sparse_coo tensor.*to_dense"),
        (lambda: torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.quint8), "dequantize"),
    ],
    ids=["sparse", "quantized"],
)
def test_jit_of_a_tensor_a_program_cannot_take(argument, says):
    step = torchlax.jit(lambda x: x * 2)
    with pytest.raises(InteropArgumentError, match="argument \\[0\\] is a " + ""):
        step(argument())
    with pytest.raises(InteropArgumentError, match=says):
        step(argument())


@pytest.mark.parametrize("static_argnums", ["a", 1.5, [0, "b"], True])
def test_jit_static_argnums_that_are_not_positions(static_argnums):
    with pytest.raises(InteropArgumentError, match="static_argnums must be an int"):
        torchlax.jit(lambda x: x, static_argnums=static_argnums)


@pytest.mark.parametrize("static_argnames", [1, ["n", 2], 1.5])
def test_jit_static_argnames_that_are_not_names(static_argnames):
    # 1 was Python's "'int' object is not iterable"
    with pytest.raises(InteropArgumentError, match="static_argnames must be a str"):
        torchlax.jit(lambda x: x, static_argnames=static_argnames)


def test_jit_static_argnames_still_take_names():
    f = torchlax.jit(lambda x, *, n: x * n, static_argnames="n")
    assert f(torch.ones(2), n=3).tolist() == [3, 3]
    g = torchlax.jit(lambda x, *, n, m: x * n + m, static_argnames=("n", "m"))
    assert g(torch.ones(2), n=3, m=1).tolist() == [4, 4]
    h = torchlax.jit(lambda x: x * 2, static_argnums=None, static_argnames=None)  # as jax.jit
    assert h(torch.ones(2)).tolist() == [2, 2]


def test_jit_static_argnums_still_take_ints():
    assert torchlax.jit(lambda x, n: x * n, static_argnums=1)(torch.ones(2), 3).tolist() == [3, 3]
