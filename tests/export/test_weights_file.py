"""weights.safetensors: every dtype round-trips bit for bit, other safetensors readers read it,
loading maps it instead of copying, and version-1 artifacts (weights.npz) still load and run.

Built with jax.export directly (no torch, one tiny export per test).
"""

from __future__ import annotations

import json
import mmap
import shutil

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors.flax import load_file as load_flax_file
from safetensors.numpy import load_file
from torchlax_export import load
from torchlax_export._artifact import FORMAT, MANIFEST, PROGRAM, Artifact, _file_record
from torchlax_export._weights import LEGACY_WEIGHTS, WEIGHTS

# (name, dtype, shape): natively stored dtypes, ones safetensors cannot name (stored as raw
# bytes), a 0-d and an empty weight.
_WEIGHTS = [
    ("f32", np.float32, (3, 2)),
    ("bf16", ml_dtypes.bfloat16, (4,)),
    ("f8", ml_dtypes.float8_e4m3fn, (2, 2)),
    ("f8_b11", ml_dtypes.float8_e4m3b11fnuz, (3,)),
    ("c128", np.complex128, (2,)),
    ("i4", ml_dtypes.int4, (5,)),
    ("flag", np.bool_, ()),
    ("empty", np.int64, (0, 3)),
]


def _values() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    values = {}
    for name, dtype, shape in _WEIGHTS:
        raw = rng.integers(0, 256, (*shape, np.dtype(dtype).itemsize), dtype=np.uint8)
        if dtype is ml_dtypes.int4:  # one value per byte, in range
            raw = rng.integers(-8, 8, shape, dtype=np.int8).view(np.uint8)
        if dtype is np.bool_:
            raw = raw % 2
        values[name] = raw.reshape(-1).view(dtype).reshape(shape)
    return values


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """An artifact returning ``x + 1`` that takes every weight of ``_WEIGHTS``."""
    with jax.enable_x64(True):
        exported = jax.export.export(jax.jit(lambda *args: (args[-1] + 1,)))(
            *[jax.ShapeDtypeStruct(shape, dtype) for _, dtype, shape in _WEIGHTS],
            jax.ShapeDtypeStruct((2,), jnp.float32),
        )
    manifest = {
        "format": FORMAT,
        "format_version": 2,
        "platforms": ["cpu"],
        "files": {},
        "dims": {},
        "weights": [
            {"name": name, "shape": list(shape), "dtype": np.dtype(dtype).name}
            for name, dtype, shape in _WEIGHTS
        ],
        "inputs": [{"name": "x", "shape": [2], "dtype": "float32"}],
        "outputs": [{"name": "output_0", "shape": [2], "dtype": "float32"}],
        "output_tree": {"tuple": [0]},
        "mutations": [],
    }
    values = _values()
    path = Artifact(exported, values, manifest).save(tmp_path_factory.mktemp("w") / "art")
    return path, values


def _assert_bitwise_equal(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(
        np.asarray(got).reshape(-1).view(np.uint8), np.asarray(want).reshape(-1).view(np.uint8)
    )


def test_every_dtype_round_trips_bit_for_bit_and_the_artifact_runs(saved):
    path, values = saved
    artifact = load(path)
    for name, want in values.items():
        _assert_bitwise_equal(artifact.weights[name], want)
    (out,) = artifact(np.array([1.0, 2.0], np.float32))
    np.testing.assert_array_equal(np.asarray(out), [2.0, 3.0])


def test_loaded_weights_map_the_file_read_only(saved):
    weights = load(saved[0]).weights
    for name in ("f32", "bf16", "c128"):
        array, bases = weights[name], []
        while array is not None:
            bases.append(array)
            array = getattr(array, "base", None)
        assert any(isinstance(b, mmap.mmap) for b in bases), name  # a view of the mapped file
        assert not weights[name].flags.writeable


def test_safetensors_readers_get_the_weights_by_name(saved):
    path, values = saved
    stored = load_file(path / WEIGHTS)  # safetensors' own numpy reader: a state dict
    assert sorted(stored) == sorted(name for name, _, _ in _WEIGHTS)
    for name in ("f32", "bf16", "flag", "empty"):  # dtypes that reader reads
        _assert_bitwise_equal(stored[name], values[name])
    # Any other dtype is its raw bytes, one trailing axis per element.
    assert stored["c128"].dtype == np.uint8 and stored["c128"].shape == (2, 16)
    assert stored["f8"].dtype == np.uint8 and stored["f8"].shape == (2, 2, 1)
    on_device = load_flax_file(path / WEIGHTS)  # and safetensors' JAX reader
    _assert_bitwise_equal(np.asarray(on_device["bf16"]), values["bf16"])
    assert json.loads((path / MANIFEST).read_text())["format_version"] == 2


def test_saving_over_the_directory_it_was_loaded_from(saved, tmp_path):
    path, values = saved
    copy = shutil.copytree(path, tmp_path / "copy")
    artifact = load(copy)  # its weights map copy/weights.safetensors
    artifact.save(copy)  # written aside and renamed: the mapped file is never truncated
    for name, want in values.items():
        _assert_bitwise_equal(artifact.weights[name], want)
        _assert_bitwise_equal(load(copy).weights[name], want)


def test_a_version_1_artifact_still_loads_runs_and_re_saves_as_version_2(saved, tmp_path):
    path, values = saved
    old = tmp_path / "old"
    old.mkdir()
    shutil.copy(path / PROGRAM, old / PROGRAM)
    manifest = json.loads((path / MANIFEST).read_text())
    # Version 1, as torchlax-export wrote it before safetensors: arrays w0, w1, ... in
    # manifest order, dtypes numpy cannot name as raw unsigned integers of their width.
    raw = {1: np.uint8, 2: np.uint16}
    stored = {}
    for i, spec in enumerate(manifest["weights"]):
        value = values[spec["name"]]
        if value.dtype.type.__module__ != "numpy":
            value = value.view(raw[value.dtype.itemsize])
        stored[f"w{i}"] = value
    np.savez(old / LEGACY_WEIGHTS, **stored)
    manifest["format_version"] = 1
    manifest["files"] = {name: _file_record(old / name) for name in (PROGRAM, LEGACY_WEIGHTS)}
    (old / MANIFEST).write_text(json.dumps(manifest))
    artifact = load(old)
    for name, want in values.items():
        _assert_bitwise_equal(artifact.weights[name], want)
    (out,) = artifact(np.array([1.0, 2.0], np.float32))
    np.testing.assert_array_equal(np.asarray(out), [2.0, 3.0])
    artifact.save(old)  # re-saved in the current format
    assert json.loads((old / MANIFEST).read_text())["format_version"] == 2
    assert set(json.loads((old / MANIFEST).read_text())["files"]) == {PROGRAM, WEIGHTS}
    for name, want in values.items():
        _assert_bitwise_equal(load(old).weights[name], want)
