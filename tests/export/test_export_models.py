"""Export, save, load without torch, run: outputs equal eager PyTorch."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torchlax_export
from conftest import assert_matches
from torch import nn
from torch.export import Dim
from torchlax_export import InputMismatchError


def _roundtrip(model, inputs, tmp_path, run_without_torch, calls=None, **export_kwargs):
    artifact = torchlax_export.export(model, tuple(inputs), **export_kwargs)
    artifact.save(tmp_path / "artifact")
    calls = calls or [[x.numpy() for x in inputs]]
    return artifact, run_without_torch(tmp_path / "artifact", calls)


def test_mlp(tmp_path, run_without_torch):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3)).eval()
    x = torch.randn(4, 6)
    artifact, (outputs, weights) = _roundtrip(model, [x], tmp_path, run_without_torch)
    assert_matches(outputs[0], [model(x)])
    assert_matches(artifact(x.numpy()), model(x))
    # Weights are inputs of the program, not constants baked into it.
    assert sorted(weights) == sorted(name for name, _ in model.named_parameters())
    assert [w["kind"] for w in artifact.manifest["weights"]] == ["parameter"] * 4
    assert "func.func public @main" in artifact.stablehlo()


class _ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        return self.head(y.mean(dim=(2, 3)))


def _trained_convnet():
    torch.manual_seed(0)
    model = _ConvNet()
    with torch.no_grad():  # non-trivial running statistics
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    return model


@pytest.mark.slow
def test_cnn_batchnorm_eval(tmp_path, run_without_torch):
    model = _trained_convnet().eval()
    x, y = torch.randn(2, 3, 8, 8), torch.randn(5, 3, 8, 8)
    # With a dynamic batch: batch norm's registry entry may be torch-level, which cannot run on
    # symbolic shapes, so export decomposes it in the graph instead.
    artifact, (outputs, _) = _roundtrip(
        model,
        [x],
        tmp_path,
        run_without_torch,
        calls=[[x.numpy()], [y.numpy()]],
        dynamic_shapes={"x": {0: Dim("batch", min=1, max=16)}},
    )
    assert_matches(outputs[0], [model(x)], atol=1e-4)
    assert_matches(outputs[1], [model(y)], atol=1e-4)
    assert artifact.mutated_buffers == []


@pytest.mark.slow
def test_cnn_batchnorm_train_returns_mutated_buffers(tmp_path, run_without_torch):
    model = _trained_convnet().train()
    eager = copy.deepcopy(model)
    x1, x2 = torch.randn(4, 3, 8, 8), torch.randn(4, 3, 8, 8)
    artifact = torchlax_export.export(model, (x1,))
    assert artifact.mutated_buffers == [
        "bn.running_mean",
        "bn.running_var",
        "bn.num_batches_tracked",
    ]
    artifact.save(tmp_path / "artifact")
    # Functional form: the new buffers come back, the artifact's weights stay as they were.
    _, new_buffers = artifact.run(x1.numpy())
    assert set(new_buffers) == set(artifact.mutated_buffers)
    np.testing.assert_array_equal(artifact.weights["bn.num_batches_tracked"], 0)

    outputs, weights = run_without_torch(tmp_path / "artifact", [[x1.numpy()], [x2.numpy()]])
    assert_matches(outputs[0], [eager(x1)], atol=1e-4)
    assert_matches(outputs[1], [eager(x2)], atol=1e-4)  # ran with the updated statistics
    for name in artifact.mutated_buffers:
        assert_matches([weights[name]], [eager.get_buffer(name)], atol=1e-5)
    assert int(weights["bn.num_batches_tracked"]) == 2
    assert_matches([new_buffers["bn.running_mean"]], [_after_one_step(model, x1)], atol=1e-5)


def _after_one_step(model, x):
    fresh = copy.deepcopy(model)
    fresh(x)
    return fresh.bn.running_mean


@pytest.mark.slow
def test_transformer_encoder_layer(tmp_path, run_without_torch):
    torch.manual_seed(0)
    model = nn.TransformerEncoderLayer(
        d_model=16, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True
    ).eval()
    x = torch.randn(2, 5, 16)
    _, (outputs, _) = _roundtrip(model, [x], tmp_path, run_without_torch)
    with torch.no_grad():
        want = model(x)
    assert_matches(outputs[0], [want], atol=1e-4)


class _Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(4, 4)

    def forward(self, x):
        def positive(x):
            return self.up(x).relu()

        def negative(x):
            return x.cos() * 2

        return torch.cond(x.sum() > 0, positive, negative, (x,))


@pytest.mark.slow
def test_cond_takes_both_branches(tmp_path, run_without_torch):
    torch.manual_seed(0)
    model = _Branchy().eval()
    x = torch.rand(3, 4) + 0.1
    calls = [[x.numpy()], [(-x).numpy()]]
    artifact, (outputs, _) = _roundtrip(model, [x], tmp_path, run_without_torch, calls=calls)
    assert "stablehlo.case" in artifact.stablehlo() or "stablehlo.if" in artifact.stablehlo()
    assert_matches(outputs[0], [model(x)])
    assert_matches(outputs[1], [model(-x)])


@pytest.mark.slow
def test_dynamic_batch_one_artifact_two_sizes(tmp_path, run_without_torch):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 2)).eval()
    batch = Dim("batch", min=2, max=64)
    x = torch.randn(4, 5)
    artifact = torchlax_export.export(model, (x,), dynamic_shapes={"input": {0: batch}})
    assert artifact.inputs == [{"name": "input", "shape": ["batch", 5], "dtype": "float32"}]
    assert artifact.manifest["dims"] == {"batch": {"min": 2, "max": 64}}
    artifact.save(tmp_path / "artifact")
    small, large = torch.randn(3, 5), torch.randn(17, 5)
    outputs, _ = run_without_torch(tmp_path / "artifact", [[small.numpy()], [large.numpy()]])
    assert_matches(outputs[0], [model(small)])
    assert_matches(outputs[1], [model(large)])
    loaded = torchlax_export.load(tmp_path / "artifact")
    with pytest.raises(InputMismatchError, match="outside the exported range"):
        loaded(np.zeros((65, 5), np.float32))
    with pytest.raises(InputMismatchError, match="dim 1"):
        loaded(np.zeros((3, 6), np.float32))


def test_while_loop_scan_map():
    from torch._higher_order_ops.map import map as torch_map
    from torch._higher_order_ops.scan import scan
    from torch._higher_order_ops.while_loop import while_loop

    def program(x, w):
        def keep_going(i, v):
            return i < 3

        def step(i, v):
            return i + 1, v * 2 + 1

        count, doubled = while_loop(keep_going, step, (torch.zeros((), dtype=torch.int64), x))

        def combine(carry, row):
            return carry + row, carry * row

        total, products = scan(combine, torch.zeros(x.shape[1]), doubled)
        scaled = torch_map(lambda row, w: row * w, doubled, w)
        return count, total, products, scaled

    x, w = torch.randn(4, 3), torch.randn(3)
    artifact = torchlax_export.export(program, (x, w))
    assert_matches(artifact(x.numpy(), w.numpy()), program(x, w))


def test_random_ops_take_a_key_input():
    def noisy(x):
        return x + torch.rand_like(x), torch.nn.functional.dropout(x, 0.5, training=True)

    x = np.ones((64, 32), np.float32)
    artifact = torchlax_export.export(noisy, (torch.from_numpy(x),))
    assert artifact.inputs[-1]["role"] == "rng"  # randomness is an input, never a baked key
    first, second = artifact(x)[0], artifact(x)[0]
    assert not np.array_equal(np.asarray(first), np.asarray(second))  # fresh per call
    for noise in (np.asarray(first) - 1, np.asarray(second) - 1):
        assert noise.min() >= 0 and noise.max() < 1 and abs(noise.mean() - 0.5) < 0.05
    key = np.array([0, 7], np.uint32)
    a, b = artifact(x, rng_key=key)[1], artifact(x, rng_key=key)[1]
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # reproducible with one key
    assert set(np.unique(np.asarray(a))) <= {0.0, 2.0}
    assert abs(float(np.mean(np.asarray(a) == 0)) - 0.5) < 0.1


class _TinyGPTBlock(nn.Module):
    def __init__(self, d=16, heads=2, vocab=50, context=32):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.head, self.heads = nn.Linear(d, vocab), heads

    def forward(self, ids):
        b, t = ids.shape
        x = self.tokens(ids) + self.positions(torch.arange(t))
        q, k, v = self.qkv(self.ln1(x)).split(x.shape[-1], dim=-1)
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        attended = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(b, t, -1))
        return self.head(x + self.mlp(self.ln2(x)))


@pytest.mark.slow
def test_tiny_gpt_block_dynamic_batch(tmp_path, run_without_torch):
    torch.manual_seed(0)
    model = _TinyGPTBlock().eval()
    ids, more = torch.randint(0, 50, (2, 8)), torch.randint(0, 50, (5, 8))
    _, (outputs, _) = _roundtrip(
        model,
        [ids],
        tmp_path,
        run_without_torch,
        calls=[[ids.numpy()], [more.numpy()]],
        dynamic_shapes={"ids": {0: Dim("batch", max=16)}},
    )
    with torch.no_grad():
        assert_matches(outputs[0], [model(ids)], atol=1e-4)
        assert_matches(outputs[1], [model(more)], atol=1e-4)


@pytest.mark.slow
def test_cond_on_a_symbolic_size():
    def pick(x):
        return torch.cond(x.shape[0] > 4, lambda x: x.sin(), lambda x: x.cos() * 3, (x,))

    artifact = torchlax_export.export(
        pick, (torch.randn(3, 2),), dynamic_shapes={"x": {0: Dim("batch", min=2, max=10)}}
    )
    for rows in (3, 7):  # one branch each, decided at run time from the batch size
        x = torch.randn(rows, 2)
        assert_matches(artifact(x.numpy()), pick(x))
