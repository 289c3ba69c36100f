"""Each layer is a separately built wheel; torchlax-core installs and works alone."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = [
    "torchlax-core",
    "torchlax-ops",
    "torchlax-interop",
    "torchlax-dynamo",
    "torchlax-export",
    "torchlax",
]

pytestmark = pytest.mark.skipif(shutil.which("uv") is None, reason="needs the uv command")


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    built = {}
    for package in PACKAGES:
        subprocess.run(
            ["uv", "build", "--package", package, "--wheel", "--out-dir", str(out)],
            cwd=ROOT,
            check=True,
            capture_output=True,
            timeout=300,
        )
        name = package.replace("-", "_")
        (wheel,) = out.glob(f"{name}-0.1.0-*.whl")
        built[package] = wheel
    return built


def metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return zf.read(name).decode()


def test_every_layer_builds_a_typed_wheel_with_its_own_dependencies(wheels):
    requires = {
        p: [
            line.split(":", 1)[1].strip()
            for line in metadata(w).splitlines()
            if line.startswith("Requires-Dist:")
        ]
        for p, w in wheels.items()
    }
    assert not any(r.startswith("torchlax") for r in requires["torchlax-core"])
    assert "pluggy<2,>=1.5" in requires["torchlax-core"]
    for layer in ("torchlax-ops", "torchlax-interop"):
        assert "torchlax-core<0.2,>=0.1" in requires[layer]
    # A serving machine loads artifacts with jax and numpy alone; exporting is an extra.
    assert not any(
        r.startswith(("torch", "torchlax"))
        for r in requires["torchlax-export"]
        if "extra ==" not in r
    )
    assert "torchlax-core<0.2,>=0.1; extra == 'export'" in requires["torchlax-export"]
    assert "torchlax-interop<0.2,>=0.1" in requires["torchlax-dynamo"]
    assert {f"{p}<0.2,>=0.1" for p in PACKAGES[:-2]} <= set(requires["torchlax"])
    assert "torchlax-export[export]<0.2,>=0.1" in requires["torchlax"]
    for package, wheel in wheels.items():
        with zipfile.ZipFile(wheel) as zf:
            assert any(n.endswith("/py.typed") for n in zf.namelist()), package
    # The torch-free base exception that torchlax-export's errors share ships with the core.
    with zipfile.ZipFile(wheels["torchlax-core"]) as zf:
        assert "_torchlax_errors/__init__.py" in zf.namelist()


@pytest.mark.slow
def test_core_installs_alone_and_asks_for_torchlax_ops(wheels, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run(
        ["uv", "venv", str(venv), "--python", sys.executable],
        check=True,
        capture_output=True,
        timeout=120,
    )
    python = venv / "bin" / "python"
    subprocess.run(
        ["uv", "pip", "install", "--python", str(python), str(wheels["torchlax-core"])],
        check=True,
        capture_output=True,
        timeout=900,
    )
    code = textwrap.dedent("""
        import importlib.util, jax.numpy as jnp, torchlax_core
        assert importlib.util.find_spec("torchlax_ops") is None
        t = torchlax_core.wrap(jnp.arange(3.0))
        print(t.tolist())
        try:
            t + t
        except torchlax_core.OpNotLoweredError as e:
            print("ERROR:", e)
    """)
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "[0.0, 1.0, 2.0]" in out.stdout
    assert "ERROR: torchlax has no JAX lowering for aten.add.Tensor." in out.stdout
    assert "pip install torchlax-ops" in out.stdout
