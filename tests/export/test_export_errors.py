"""Bad artifacts, bad calls and unsupported programs fail with clear errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torchlax_core
import torchlax_export
from torchlax_export import (
    ArtifactError,
    ArtifactFormatError,
    ExportError,
    InputMismatchError,
    UnsupportedOpError,
)


class _Affine(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5]))
        self.register_buffer("shift", torch.arange(3, dtype=torch.float32))

    def forward(self, x, step):
        return x * self.scale + self.shift, step * 2


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One small artifact, exported and saved once for this module; copy it before damaging it."""
    model = _Affine()
    artifact = torchlax_export.export(model, (torch.randn(2, 3), torch.tensor(3)))
    path = artifact.save(tmp_path_factory.mktemp("export") / "affine")
    return model, path


@pytest.fixture
def copy_of(saved, tmp_path):
    shutil.copytree(saved[1], tmp_path / "copy")
    return tmp_path / "copy"


def test_roundtrip_in_process(saved):
    model, path = saved
    program = torchlax_export.load(path)
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    y, doubled = program(x, np.int64(3))
    want_y, want_doubled = model(torch.from_numpy(x), torch.tensor(3))
    np.testing.assert_allclose(np.asarray(y), want_y.detach().numpy(), rtol=1e-6)
    assert doubled.dtype == jnp.int64 and int(doubled) == 6
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["format_version"] == 2
    assert manifest["inputs"] == [
        {"name": "x", "shape": [2, 3], "dtype": "float32"},
        {"name": "step", "shape": [], "dtype": "int64"},
    ]
    assert [w["name"] for w in manifest["weights"]] == ["scale", "shift"]
    # Inputs by name work too.
    y2, _ = program(step=np.int64(3), x=x)
    np.testing.assert_array_equal(np.asarray(y2), np.asarray(y))


def test_truncated_program(copy_of):
    program = copy_of / "program.jaxexport"
    program.write_bytes(program.read_bytes()[:100])
    with pytest.raises(ArtifactFormatError, match="truncated"):
        torchlax_export.load(copy_of)


def test_corrupt_weights(copy_of):
    weights = copy_of / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ArtifactFormatError, match="checksum"):
        torchlax_export.load(copy_of)


def test_missing_file(copy_of):
    (copy_of / "weights.safetensors").unlink()
    with pytest.raises(ArtifactFormatError, match="missing"):
        torchlax_export.load(copy_of)


def test_truncated_manifest(copy_of):
    manifest = copy_of / "manifest.json"
    manifest.write_text(manifest.read_text()[:50])
    with pytest.raises(ArtifactFormatError, match="not valid JSON"):
        torchlax_export.load(copy_of)


@pytest.mark.parametrize("version, advice", [(3, "Upgrade"), (0, "Export the model again")])
def test_wrong_format_version(copy_of, version, advice):
    manifest = json.loads((copy_of / "manifest.json").read_text())
    manifest["format_version"] = version
    (copy_of / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactFormatError, match=f"format version {version}.*{advice}"):
        torchlax_export.load(copy_of)


def test_not_an_artifact(tmp_path):
    with pytest.raises(ArtifactFormatError, match="no manifest.json"):
        torchlax_export.load(tmp_path)


def test_wrong_inputs(saved):
    program = torchlax_export.load(saved[1])
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(InputMismatchError, match=r"dtype float64.*float32"):
        program(x.astype(np.float64), np.int64(1))
    with pytest.raises(InputMismatchError, match=r"dtype int32.*int64"):
        program(x, np.int32(1))
    with pytest.raises(InputMismatchError, match=r"shape \(3, 3\)"):
        program(np.zeros((3, 3), np.float32), np.int64(1))
    with pytest.raises(InputMismatchError, match=r"\(1 dims\)"):
        program(np.zeros(3, np.float32), np.int64(1))
    with pytest.raises(InputMismatchError, match="Missing input"):
        program(x)
    with pytest.raises(InputMismatchError, match="takes 2 input"):
        program(x, np.int64(1), x)
    with pytest.raises(InputMismatchError, match="no input named 'y'"):
        program(x, y=np.int64(1))


def test_loading_never_imports_torch(saved):
    script = (
        "import sys\n"
        "import torchlax_export\n"
        "from torchlax_export import load, ArtifactError\n"
        f"program = load({str(saved[1])!r})\n"
        "assert 'torch' not in sys.modules and 'torchlax_core' not in sys.modules, "
        "sorted(m for m in sys.modules if m.startswith('torch'))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr


# -- export-time errors -------------------------------------------------------------------------

_lib = torch.library.Library("torchlax_export_test", "DEF")  # noqa: TID251 (kept alive for the module)
_lib.define("scale_rows(Tensor x, float factor) -> Tensor")
_lib.impl("scale_rows", lambda x, factor: x * factor, "CompositeExplicitAutograd")
_lib.impl("scale_rows", lambda x, factor: torch.empty_like(x), "Meta")


def _uses_custom_op(x):
    return torch.ops.torchlax_export_test.scale_rows(x, 3.0)


class _CustomOpLowering:
    @torchlax_core.hookimpl
    def torchlax_register_lowerings(self, registry):
        registry.register_lowering(
            torch.ops.torchlax_export_test.scale_rows.default, lambda x, factor: x * factor
        )


def test_custom_op_without_lowering_names_it():
    with pytest.raises(UnsupportedOpError, match="torchlax_export_test.scale_rows.default") as info:
        torchlax_export.export(_uses_custom_op, (torch.randn(2, 3),))
    message = str(info.value)
    assert "registry.register_lowering(torch.ops.torchlax_export_test.scale_rows.default" in message
    assert info.value.ops == (torch.ops.torchlax_export_test.scale_rows.default,)


def test_custom_op_with_registered_lowering():
    env = torchlax_core.default_env()
    env.register_plugin(_CustomOpLowering(), "export-test-custom-op")
    try:
        x = torch.randn(2, 3)
        artifact = torchlax_export.export(_uses_custom_op, (x,))
        np.testing.assert_allclose(np.asarray(artifact(x.numpy())), (x * 3).numpy(), rtol=1e-6)
        assert [i["name"] for i in artifact.inputs] == ["x"]  # it draws no random key
    finally:
        env.unregister_plugin("export-test-custom-op")


_lib.define("jitter(Tensor x) -> Tensor")  # random, but torch does not know (no tag)
_lib.impl("jitter", lambda x: x + torch.rand_like(x), "CompositeExplicitAutograd")
_lib.impl("jitter", lambda x: torch.empty_like(x), "Meta")


def _jitter_lowering(x):
    key = torchlax_core.current_env().next_prng_key()
    return x + jax.random.uniform(key, x.shape, x.dtype)


class _JitterLowering:
    @torchlax_core.hookimpl
    def torchlax_register_lowerings(self, registry):
        registry.register_lowering(torch.ops.torchlax_export_test.jitter.default, _jitter_lowering)


def test_custom_op_drawing_keys_gets_a_key_input():
    env = torchlax_core.default_env()
    env.register_plugin(_JitterLowering(), "export-test-jitter")
    try:
        artifact = torchlax_export.export(
            lambda x: torch.ops.torchlax_export_test.jitter(x), (torch.zeros(16),)
        )
    finally:
        env.unregister_plugin("export-test-jitter")
    assert artifact.inputs[-1]["role"] == "rng"
    x = np.zeros(16, np.float32)
    first, second = np.asarray(artifact(x)), np.asarray(artifact(x))
    assert not np.array_equal(first, second)
    assert first.min() >= 0 and first.max() < 1


def test_input_mutation_is_refused():
    def add_in_place(x):
        x.add_(1)
        return x * 2

    with pytest.raises(ExportError, match="mutates its input 'x'"):
        torchlax_export.export(add_in_place, (torch.randn(3),))


def test_wrong_platform_is_named(saved, monkeypatch):
    program = torchlax_export.load(saved[1])
    assert program.manifest["platforms"] == ["cpu"]
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    with pytest.raises(ArtifactError, match="lowered for cpu, but JAX runs on gpu"):
        program(np.zeros((2, 3), np.float32), np.int64(1))


@pytest.mark.slow
def test_multi_platform_export(tmp_path):
    model = torch.nn.Sequential(
        torch.nn.Linear(3, 4), torch.nn.GELU(), torch.nn.LayerNorm(4)
    ).eval()
    x = torch.randn(2, 3)
    artifact = torchlax_export.export(model, (x,), platforms=("cpu", "cuda"))
    program = torchlax_export.load(artifact.save(tmp_path / "multi"))
    assert program.exported.platforms == ("cpu", "cuda")
    np.testing.assert_allclose(
        np.asarray(program(x.numpy())), model(x).detach().numpy(), rtol=1e-5, atol=1e-6
    )


def test_torchlax_tensors_must_come_back_to_cpu():
    with torchlax_core.enable():
        x = torch.randn(2, 3).to("jax")
    with pytest.raises(ExportError, match="input 0 is a torchlax Tensor"):
        torchlax_export.export(lambda x: x * 2, (x,))
