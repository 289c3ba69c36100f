"""aten._grouped_mm (mixture-of-experts products) against PyTorch's CPU kernel, and a tiny
Hugging Face Mixtral model (its MoE layers call it) eagerly and under torchlax.jit."""

import copy

import pytest
import torch
import torchlax
import torchlax_core
from _compare_cpu import check, grads_match

I32 = torch.int32


def _grouped(a, b, offs=None):
    return torch._grouped_mm(a, b, offs)


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "offs"),
    [
        ((10, 8), (3, 8, 8), [2, 5, 10]),  # rows grouped (one expert per token block)
        ((10, 8), (3, 8, 8), [0, 0, 10]),  # empty groups
        ((8, 16), (16, 8), [4, 9, 16]),  # contraction grouped: (G, M, N)
        ((3, 8, 8), (8, 16), [4, 9, 16]),  # columns grouped
        ((3, 6, 8), (3, 8, 8), None),  # batched
    ],
)
def test_grouped_mm_matches_cpu(a_shape, b_shape, offs):
    a, b = torch.randn(a_shape), torch.randn(b_shape)
    args = (a, b) if offs is None else (a, b, torch.tensor(offs, dtype=I32))
    check(_grouped, *args)


def test_grouped_mm_bfloat16_accumulates_in_float32():
    a, b = torch.randn(10, 8, dtype=torch.bfloat16), torch.randn(3, 8, 8, dtype=torch.bfloat16)
    check(_grouped, a, b, torch.tensor([2, 5, 10], dtype=I32), atol=1e-2, rtol=1e-2)


def test_grouped_mm_rows_past_the_last_offset_are_zero():
    # PyTorch leaves them uninitialised; torchlax writes 0 (what transformers' fallback writes).
    a, b = torch.randn(10, 8), torch.randn(3, 8, 8)
    offs = torch.tensor([2, 2, 7], dtype=I32)
    check(lambda a, b, o: _grouped(a, b, o)[:7], a, b, offs)
    with torchlax_core.enable():
        tail = _grouped(a.to("jax"), b.to("jax"), offs.to("jax"))[7:]
        assert torch.equal(tail.cpu(), torch.zeros(3, 8))


def test_grouped_mm_gradients_match_cpu_formula():
    # PyTorch's CPU backward of the row-grouped form fails on expanded gradients, so compare
    # with the same gradients written per group.
    a, b = torch.randn(10, 8, requires_grad=True), torch.randn(3, 8, 8, requires_grad=True)
    offs = torch.tensor([2, 5, 10], dtype=I32)
    weight = torch.randn(10, 8)
    with torchlax_core.enable():
        ja = a.detach().to("jax").requires_grad_()
        jb = b.detach().to("jax").requires_grad_()
        (_grouped(ja, jb, offs.to("jax")) * weight.to("jax")).sum().backward()
    per_group = torch.cat([a[s:e] @ b[g] for g, (s, e) in enumerate([(0, 2), (2, 5), (5, 10)])])
    (per_group * weight).sum().backward()
    assert ja.grad is not None and jb.grad is not None
    torch.testing.assert_close(ja.grad.cpu(), a.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(jb.grad.cpu(), b.grad, atol=1e-5, rtol=1e-5)
    grads_match(
        lambda x, y: _grouped(x, y).pow(2).sum(), [torch.randn(3, 4, 8), torch.randn(3, 8, 8)]
    )


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (
            lambda: (
                torch.randn(10, 8).double(),
                torch.randn(3, 8, 8).double(),
                torch.tensor([2, 5, 10], dtype=I32),
            ),
            "Float32, BFloat16 or Float16|float32, bfloat16",
        ),
        (lambda: (torch.randn(10, 8), torch.randn(3, 8, 8), torch.tensor([2, 5, 10])), "int32"),
        (lambda: (torch.randn(10, 8), torch.randn(3, 8, 8)), "offs|offsets"),
    ],
)
def test_grouped_mm_errors_as_cpu(args, match):
    cpu_args = args()
    with pytest.raises(RuntimeError, match=match):
        _grouped(*cpu_args)
    with torchlax_core.enable():
        jax_args = [x.to("jax") for x in cpu_args]
        with pytest.raises(RuntimeError, match=match):
            _grouped(*jax_args)


def _tiny_mixtral(transformers):
    """A one-layer Mixtral of 4 experts (random weights, seed 0), in eval mode."""
    torch.manual_seed(0)
    config = transformers.MixtralConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=64,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=64,
    )
    model = transformers.MixtralForCausalLM(config).eval()
    return model


@pytest.mark.slow
def test_tiny_mixtral_eager_and_jit():
    transformers = pytest.importorskip("transformers")
    model = _tiny_mixtral(transformers)
    ids = torch.randint(0, 64, (2, 6))
    with torch.no_grad():
        expected = model(ids).logits
        with torchlax.enable():
            jax_model, jax_ids = copy.deepcopy(model).to("jax"), ids.to("jax")
            eager = jax_model(jax_ids).logits
            jitted = torchlax.jit(lambda x: jax_model(x).logits)(jax_ids)
    for got in (eager, jitted):
        torch.testing.assert_close(got.cpu(), expected, atol=1e-5, rtol=1e-5)


def test_grouped_mm_exports_and_the_artifact_matches_cpu():
    # (bfloat16: torch.export traces with PyTorch's meta kernel, which refuses float32 on CPU.)
    import jax.numpy as jnp
    import numpy as np

    class Experts(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(3, 8, 8, dtype=torch.bfloat16))

        def forward(self, a, offs):
            return torch._grouped_mm(a, self.w, offs)

    torch.manual_seed(0)
    model = Experts().eval()
    a, offs = torch.randn(16, 8, dtype=torch.bfloat16), torch.tensor([2, 5, 16], dtype=I32)
    artifact = torchlax.export.export(model, (a, offs))
    got = artifact(jnp.asarray(a.float().numpy(), dtype=jnp.bfloat16), offs.numpy())
    got = got[0] if isinstance(got, list | tuple) else got
    with torch.no_grad():
        expected = model(a, offs).float()
    torch.testing.assert_close(torch.from_numpy(np.asarray(got, dtype=np.float32)), expected)


@pytest.mark.slow
def test_tiny_mixtral_exports_and_the_artifact_matches_cpu():
    # The experts' products run transformers::grouped_mm_fallback, which the ops plugin
    # implements by name (as the eager path and torchlax.jit run it); export's check refused
    # it as an op nothing lowers.
    transformers = pytest.importorskip("transformers")
    import numpy as np

    model = _tiny_mixtral(transformers)
    ids = torch.randint(0, 64, (2, 6))

    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model(x, use_cache=False).logits

    with torch.no_grad():
        expected = Logits()(ids)
    artifact = torchlax.export.export(Logits(), (ids,))
    got = artifact(ids.numpy())
    got = got[0] if isinstance(got, list | tuple) else got
    torch.testing.assert_close(torch.from_numpy(np.asarray(got)), expected, atol=1e-5, rtol=1e-5)
