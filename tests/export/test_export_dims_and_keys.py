"""Unbounded dynamic dims, and a key input only for programs that draw random numbers."""

from __future__ import annotations

import numpy as np
import torch
import torchlax_export
from conftest import assert_matches
from torch import nn
from torch.export import Dim


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 2)).eval()


def test_an_unbounded_dim_serves_any_batch(tmp_path, run_without_torch):
    model = _mlp()
    artifact = torchlax_export.export(
        model, (torch.randn(4, 5),), dynamic_shapes={"input": {0: Dim("batch")}}
    )
    assert artifact.inputs == [{"name": "input", "shape": ["batch", 5], "dtype": "float32"}]
    assert artifact.manifest["dims"]["batch"]["max"] is None
    artifact.save(tmp_path / "artifact")
    small, large = torch.randn(1, 5), torch.randn(1000, 5)
    outputs, _ = run_without_torch(tmp_path / "artifact", [[small.numpy()], [large.numpy()]])
    assert_matches(outputs[0], [model(small)])
    assert_matches(outputs[1], [model(large)])


def test_cli_dynamic_batch_without_a_range(tmp_path, monkeypatch):
    from torchlax_export._cli import main

    (tmp_path / "unbounded_models.py").write_text(
        "import torch\n"
        "def make():\n"
        "    torch.manual_seed(0)\n"
        "    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert (
        main(["unbounded_models:make", "--example-shapes", "4x3", "-o", "out", "--dynamic-batch"])
        == 0
    )
    program = torchlax_export.load(tmp_path / "out")
    assert program.inputs[0]["shape"] == ["batch", 3]
    import unbounded_models

    x = torch.randn(300, 3)
    np.testing.assert_allclose(
        np.asarray(program(x.numpy())),
        unbounded_models.make()(x).detach().numpy(),
        # XLA's CPU dot sums the 3 products in another order than PyTorch's sgemm (with fused
        # multiply-adds): ~1 in 4 outputs differ by an ulp or two, under DEFAULT and HIGHEST
        # precision alike (the artifact's dot is HIGHEST), so an output near 0 (a sum that
        # cancels) differs by ~3e-8 absolute, which rtol alone cannot allow
        rtol=1e-6,
        atol=1e-7,
    )


class _Attention(nn.Module):
    """Eval mode: its dropout and attention ops are tagged random by PyTorch but draw nothing."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x):
        q, k, v = self.qkv(x).view(x.shape[0], x.shape[1], 3, 2, 4).unbind(2)
        out = nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            dropout_p=0.1 if self.training else 0.0,
        )
        return self.dropout(out)


def test_a_deterministic_program_takes_no_key(tmp_path):
    torch.manual_seed(0)
    model = _Attention().eval()
    x = torch.randn(2, 5, 8)
    artifact = torchlax_export.export(model, (x,))
    assert [i["name"] for i in artifact.inputs] == ["x"]
    artifact.save(tmp_path / "artifact")
    program = torchlax_export.load(tmp_path / "artifact")
    assert [i["name"] for i in program.inputs] == ["x"]
    with torch.no_grad():
        assert_matches([program(x.numpy())], [model(x)], atol=1e-6)


def test_the_same_program_in_train_mode_takes_a_key():
    torch.manual_seed(0)
    model = _Attention().train()
    x = torch.ones(2, 5, 8)
    artifact = torchlax_export.export(model, (x,))
    assert artifact.inputs[-1]["role"] == "rng"
    a = np.asarray(artifact(x.numpy(), rng_key=np.array([0, 1], np.uint32)))
    b = np.asarray(artifact(x.numpy(), rng_key=np.array([0, 2], np.uint32)))
    assert not np.array_equal(a, b)
