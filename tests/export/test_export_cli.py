"""``python -m torchlax_export MODULE:FACTORY --example-shapes ... -o DIR``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import torchlax_export
from torchlax_export._cli import main

_FACTORY = textwrap.dedent(
    """
    import torch
    from torch import nn

    def make_mlp():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2))

    def make_pair():
        class Pair(nn.Module):
            def forward(self, a, b):
                return a * 2, b + 1
        return Pair()

    def not_a_module():
        return 42
    """
)


@pytest.fixture
def factory_dir(tmp_path, monkeypatch):
    (tmp_path / "cli_models.py").write_text(_FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    sys.modules.pop("cli_models", None)


def test_cli_exports_with_progress(factory_dir, capsys):
    assert (
        main(
            [
                "cli_models:make_mlp",
                "--example-shapes",
                "4x3",
                "-o",
                "out",
                "--dynamic-batch",
                "1:32",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    for step in ("torch.export", "lowering to StableHLO", "serializing"):
        assert f"torchlax-export: {step} done in" in captured.err
    assert "wrote out" in captured.out
    program = torchlax_export.load(factory_dir / "out")
    assert program.inputs[0]["shape"] == ["batch", 3]
    import cli_models

    model = cli_models.make_mlp().eval()
    x = torch.randn(7, 3)
    np.testing.assert_allclose(
        np.asarray(program(x.numpy())), model(x).detach().numpy(), rtol=1e-5, atol=1e-6
    )


def test_cli_several_inputs_and_dtype(factory_dir, capsys):
    assert (
        main(
            ["cli_models:make_pair", "--example-shapes", "2x3,4", "--dtype", "int64", "-o", "pair"]
        )
        == 0
    )
    program = torchlax_export.load(factory_dir / "pair")
    assert [(i["shape"], i["dtype"]) for i in program.inputs] == [([2, 3], "int64"), ([4], "int64")]
    a, b = program(np.ones((2, 3), np.int64), np.arange(4))
    np.testing.assert_array_equal(np.asarray(a), 2)
    np.testing.assert_array_equal(np.asarray(b), np.arange(4) + 1)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["cli_models:make_mlp", "--example-shapes", "4xa", "-o", "o"], "bad shape"),
        (["cli_models:nope", "--example-shapes", "4x3", "-o", "o"], "has no attribute 'nope'"),
        (["no_such_module:f", "--example-shapes", "4x3", "-o", "o"], "cannot import module"),
        (
            ["cli_models:not_a_module", "--example-shapes", "4x3", "-o", "o"],
            "not a torch.nn.Module",
        ),
        (
            ["cli_models:make_mlp", "--example-shapes", "4x3", "--dtype", "floaty", "-o", "o"],
            "unknown dtype",
        ),
    ],
)
def test_cli_errors(factory_dir, capsys, argv, message):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code != 0
    assert message in (str(info.value.code) + capsys.readouterr().err)


@pytest.mark.slow
def test_python_dash_m(factory_dir):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchlax_export",
            "cli_models:make_pair",
            "--example-shapes",
            "2x3,4",
            "-o",
            "viam",
        ],
        capture_output=True,
        text=True,
        cwd=factory_dir,
        timeout=600,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
    )
    assert proc.returncode == 0, proc.stderr
    assert "torchlax-export: torch.export done in" in proc.stderr
    assert (factory_dir / "viam" / "manifest.json").is_file()
