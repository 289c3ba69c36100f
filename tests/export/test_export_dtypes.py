"""Weights and inputs of every kind of dtype survive save/load; keyword inputs, dict outputs."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch
import torchlax_export
from conftest import assert_matches


class _Mixed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 3).to(torch.bfloat16)
        self.register_buffer("offsets", torch.tensor([1, -2, 3], dtype=torch.int64))

    def forward(self, x, *, index):
        y = self.proj(x)
        return {"y": y, "picked": self.offsets[index] * 2, "mask": y > 0}


def test_bfloat16_weights_int_buffers_kwargs_and_dict_outputs(tmp_path):
    torch.manual_seed(0)
    model = _Mixed()
    x, index = torch.randn(2, 4, dtype=torch.bfloat16), torch.tensor([2, 0])
    artifact = torchlax_export.export(model, (x,), {"index": index})
    assert [(w["name"], w["dtype"]) for w in artifact.manifest["weights"]] == [
        ("proj.weight", "bfloat16"),
        ("proj.bias", "bfloat16"),
        ("offsets", "int64"),
    ]
    program = torchlax_export.load(artifact.save(tmp_path / "mixed"))
    stored = program.weights["proj.weight"]
    assert stored.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(
        stored.view(np.uint16), model.proj.weight.detach().view(torch.int16).numpy().view(np.uint16)
    )
    x_np = x.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    out = program(x_np, index=index.numpy())
    want = model(x, index=index)
    assert list(out) == ["y", "picked", "mask"]
    assert_matches([out["picked"], out["mask"]], [want["picked"], want["mask"]])
    assert_matches(
        [np.asarray(out["y"]).astype(np.float32)], [want["y"].float()], rtol=2e-2, atol=2e-2
    )
