"""Loading an artifact from an untrusted source: it can reach nothing outside itself.

The artifacts here are built with jax.export directly (no torch needed, a few small compiles):
each test saves a valid one, tampers with one part, fixes the checksums up as an attacker
would, and expects ``ArtifactFormatError`` naming what is wrong. No crafted program is ever
run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import struct
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import save_file
from torchlax_export import ArtifactError, ArtifactFormatError, load
from torchlax_export._artifact import FORMAT, FORMAT_VERSION, MANIFEST, PROGRAM, Artifact
from torchlax_export._weights import LEGACY_WEIGHTS, WEIGHTS


def _manifest(inputs, outputs, weights=()) -> dict:
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "platforms": ["cpu"],
        "files": {},
        "dims": {},
        "weights": list(weights),
        "inputs": list(inputs),
        "outputs": list(outputs),
        "output_tree": {"tuple": list(range(len(outputs)))},
        "mutations": [],
    }


def _spec(name, shape, dtype="float32"):
    return {"name": name, "shape": list(shape), "dtype": dtype}


@pytest.fixture(scope="module")
def linear(tmp_path_factory) -> Path:
    """A saved artifact of ``x @ w + 1`` with weight ``w`` (3x2) and input ``x`` (4x3)."""
    exported = jax.export.export(jax.jit(lambda w, x: (x @ w + 1,)))(
        jax.ShapeDtypeStruct((3, 2), jnp.float32), jax.ShapeDtypeStruct((4, 3), jnp.float32)
    )
    manifest = _manifest([_spec("x", (4, 3))], [_spec("output_0", (4, 2))], [_spec("w", (3, 2))])
    weights = {"w": np.arange(6, dtype=np.float32).reshape(3, 2)}
    return Artifact(exported, weights, manifest).save(tmp_path_factory.mktemp("art") / "linear")


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for name in (MANIFEST, PROGRAM, WEIGHTS):
        (dst / name).write_bytes((src / name).read_bytes())
    return dst


def _record(path: Path) -> dict:
    data = path.read_bytes()
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _tamper(path: Path, change) -> Path:
    """Apply ``change`` to the manifest and re-sign every listed file, as an attacker would."""
    manifest = json.loads((path / MANIFEST).read_text())
    change(manifest)
    for name in manifest["files"]:
        if not os.path.isabs(name) and (path / name).exists():
            manifest["files"][name] = _record(path / name)
    (path / MANIFEST).write_text(json.dumps(manifest))
    return path


def test_the_untampered_artifact_loads_and_runs(linear):
    x = np.ones((4, 3), np.float32)
    (out,) = load(linear)(x)
    np.testing.assert_allclose(
        np.asarray(out), x @ np.arange(6, dtype=np.float32).reshape(3, 2) + 1
    )


@pytest.mark.parametrize(
    "name",
    [
        "../outside_secret.txt",
        "sub/../../outside_secret.txt",
        "ABSOLUTE",
        "",
        "weights.safetensors\x00../outside_secret.txt",
    ],
)
def test_file_names_leaving_the_directory_are_refused(linear, tmp_path, name):
    secret = tmp_path / "outside_secret.txt"
    secret.write_text("do not read me")
    art = _copy(linear, tmp_path / "art")
    name = str(secret) if name == "ABSOLUTE" else name
    manifest = json.loads((art / MANIFEST).read_text())
    manifest["files"][name] = _record(secret)  # a matching checksum: only the name is wrong
    (art / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ArtifactFormatError, match="leaves the artifact directory"):
        load(art)


def test_a_symlink_pointing_out_is_refused(linear, tmp_path):
    outside = tmp_path / "elsewhere.safetensors"
    outside.write_bytes((linear / WEIGHTS).read_bytes())  # same bytes, so the checksum matches
    art = _copy(linear, tmp_path / "art")
    (art / WEIGHTS).unlink()
    (art / WEIGHTS).symlink_to(outside)
    with pytest.raises(ArtifactFormatError, match="outside the artifact directory"):
        load(art)


def test_deeply_nested_json_is_an_artifact_error(linear, tmp_path):
    art = _copy(linear, tmp_path / "art")
    text = (art / MANIFEST).read_text()
    depth = 100_000
    (art / MANIFEST).write_text(
        text.replace('"mutations": []', '"mutations": ' + "[" * depth + "]" * depth)
    )
    with pytest.raises(ArtifactFormatError, match="nests its JSON too deeply"):
        load(art)


def test_an_output_tree_nested_too_deeply_is_refused(linear, tmp_path):
    def nest(m):
        tree = 0
        for _ in range(200):  # fine for json, far past any real output structure
            tree = {"tuple": [tree]}
        m["output_tree"] = tree

    art = _tamper(_copy(linear, tmp_path / "art"), nest)
    with pytest.raises(ArtifactFormatError, match="output_tree.* nests deeper than 64 levels"):
        load(art)


@pytest.mark.parametrize(
    "change, field",
    [
        (
            lambda m: m.update(output_tree={"tuple": [7]}),
            r"output_tree.tuple\[0\] refers to output 7",
        ),
        (lambda m: m.update(output_tree={"set": [0]}), r"output_tree has a node 'set'"),
        (lambda m: m.update(output_tree="0"), r"output_tree is '0'"),
        (lambda m: m.update(mutations=[{"buffer": "nope", "output": 1}]), r"mutations\[0\].buffer"),
        (
            lambda m: m.update(mutations=[{"buffer": "w", "output": 9}]),
            r"mutations\[0\].output is 9",
        ),
        (
            lambda m: m.update(mutations=[{"buffer": "w", "output": 1}]),
            r"describes 2 results .* returns 1",
        ),
        (lambda m: m["inputs"][0].update(dtype="garbage"), r"inputs\[0\].dtype is 'garbage'"),
        (lambda m: m["inputs"][0].update(dtype=["float32"]), r"inputs\[0\].dtype"),
        (lambda m: m["outputs"][0].update(shape=[4, -2]), r"outputs\[0\].shape"),
        (lambda m: m["weights"][0].update(shape="3x2"), r"weights\[0\].shape"),
        (lambda m: m.update(dims={"batch": {"min": "one"}}), r"dims\['batch'\]"),
        (
            lambda m: m["inputs"][0].update(dtype="float64"),
            r"inputs\[0\] is float64.*takes float32",
        ),
        (
            lambda m: m["inputs"][0].update(shape=[2**70, 3]),
            r"inputs\[0\] is float32\[1180591620717411303424, 3\].*takes float32\[4, 3\]",
        ),
        (
            lambda m: m.update(dims={"batch": {"min": 5, "max": 2}}),
            r"dims\['batch'\] has min 5 above",
        ),
    ],
)
def test_malformed_manifest_fields_name_the_field(linear, tmp_path, change, field):
    art = _tamper(_copy(linear, tmp_path / "art"), change)
    with pytest.raises(ArtifactFormatError, match=field):
        load(art)


def test_weights_stored_with_another_dtype_are_refused(linear, tmp_path):
    art = _copy(linear, tmp_path / "art")
    # same bytes, reinterpreted as int32
    save_file({"w": np.arange(6, dtype=np.float32).reshape(3, 2).view(np.int32)}, art / WEIGHTS)
    _tamper(art, lambda m: None)
    with pytest.raises(ArtifactFormatError, match=r"'w' is stored as int32\[3, 2\].* says float32"):
        load(art)


def _crafted_weights(header: dict, data: bytes, length: int | None = None) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


_W = {"dtype": "F32", "shape": [3, 2], "data_offsets": [0, 24]}


@pytest.mark.parametrize(
    "weights, problem",
    [
        (_crafted_weights({"w": {**_W, "data_offsets": [0, 48]}}, bytes(24)), "lies at bytes"),
        (_crafted_weights({"w": {**_W, "data_offsets": [8, 24]}}, bytes(24)), "spans 16 bytes"),
        (_crafted_weights({"w": {**_W, "shape": [2, 3]}}, bytes(24)), r"stored as float32\[2, 3\]"),
        (_crafted_weights({"w": {**_W, "dtype": "XX"}}, bytes(24)), "entry of weight 'w'"),
        (_crafted_weights({"w": {**_W, "data_offsets": [-1, 23]}}, bytes(24)), "entry of weight"),
        (_crafted_weights({"w": _W, "v": _W}, bytes(24)), "holds the weights"),
        (_crafted_weights({}, bytes(24)), "holds the weights"),
        (_crafted_weights({"w": _W}, bytes(24), length=1 << 40), "header"),
        (b"\x10\0\0\0\0\0\0\0not json at all!" + bytes(24), "safetensors header"),
        (b"\x02", "too short"),
    ],
    ids=[
        "beyond-the-file",
        "span-short-of-the-shape",
        "shape-unlike-the-manifest",
        "unknown-dtype",
        "negative-offset",
        "an-extra-weight",
        "a-missing-weight",
        "huge-header-length",
        "not-json",
        "too-short",
    ],
)
def test_crafted_safetensors_headers_are_refused_before_mapping(linear, tmp_path, weights, problem):
    art = _copy(linear, tmp_path / "art")
    (art / WEIGHTS).write_bytes(weights)
    _tamper(art, lambda m: None)
    with pytest.raises(ArtifactFormatError, match=problem):
        load(art)


def test_overlapping_weights_are_refused(tmp_path):
    exported = jax.export.export(jax.jit(lambda a, b, x: (x + a + b,)))(
        *[jax.ShapeDtypeStruct((2,), jnp.float32)] * 3
    )
    manifest = _manifest(
        [_spec("x", (2,))], [_spec("output_0", (2,))], [_spec("a", (2,)), _spec("b", (2,))]
    )
    two = np.ones(2, np.float32)
    art = Artifact(exported, {"a": two, "b": two}, manifest).save(tmp_path / "art")
    entry = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    (art / WEIGHTS).write_bytes(_crafted_weights({"a": entry, "b": entry}, bytes(8)))
    _tamper(art, lambda m: None)
    with pytest.raises(ArtifactFormatError, match="'a' and 'b' share bytes"):
        load(art)


def test_no_pickle_on_the_load_path(linear, tmp_path):
    """Version-1 artifacts (weights.npz) are still read: never with pickle."""
    marker = tmp_path / "pickle_ran"

    art = _copy(linear, tmp_path / "art")
    payload = np.empty((3, 2), dtype=object)
    payload[0, 0] = _Payload(str(marker))
    with open(art / LEGACY_WEIGHTS, "wb") as f:
        np.savez(f, w0=payload)  # an object array: stored as a pickle

    def as_version_1(manifest):
        manifest["format_version"] = 1
        manifest["files"] = {PROGRAM: {}, LEGACY_WEIGHTS: {}}

    _tamper(art, as_version_1)
    with pytest.raises(ArtifactFormatError, match="could not be read .*allow_pickle=False"):
        load(art)
    assert not marker.exists()  # the payload never ran
    sources = Path(__import__("torchlax_export").__file__).parent
    for module in ("_artifact.py", "_weights.py"):
        loader = (sources / module).read_text()
        assert "import pickle" not in loader and "allow_pickle=True" not in loader


class _Payload:
    """Unpickling this would create ``path``: what a malicious artifact would do instead."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


# -- custom calls ------------------------------------------------------------------------------


def _program_with(text: str, template: jax.export.Exported) -> jax.export.Exported:
    """``template`` with its program replaced by the StableHLO ``text`` (never compiled here)."""
    from jax._src.export._export import _module_to_bytecode
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir

    with mlir.make_ir_context():
        module = ir.Module.parse(text)
        serialized = _module_to_bytecode(module)
    return dataclasses.replace(template, mlir_module_serialized=serialized)


def _getrf_line(n: int) -> str:
    exported = jax.export.export(jax.jit(lambda a: jax.scipy.linalg.lu_factor(a)[0]))(
        jax.ShapeDtypeStruct((n, n), jnp.float32)
    )
    line = next(ln for ln in exported.mlir_module().splitlines() if "@lapack_sgetrf_ffi" in ln)
    return re.sub(
        r", sdy\.sharding_rule = #sdy\.op_sharding_rule<.*?custom>",
        "",
        line.strip().split(" loc(")[0],
    )


def _crafted_artifact(path: Path, n: int, pivots: int, target: str = "lapack_sgetrf_ffi") -> Path:
    call = _getrf_line(n).replace(f"tensor<{n}xi32>", f"tensor<{pivots}xi32>")
    call = call.replace("@lapack_sgetrf_ffi", f"@{target}")
    text = f"""
    module @jit_f attributes {{mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32}} {{
      func.func public @main(%arg0: tensor<{n}x{n}xf32>) -> (tensor<{n}x{n}xf32>) {{
        {call}
        return %0#0 : tensor<{n}x{n}xf32>
      }}
    }}"""
    template = jax.export.export(jax.jit(lambda a: a * 2))(
        jax.ShapeDtypeStruct((n, n), jnp.float32)
    )
    exported = _program_with(text, template)
    manifest = _manifest([_spec("a", (n, n))], [_spec("output_0", (n, n))])
    manifest["output_tree"] = 0
    return Artifact(exported, {}, manifest).save(path)


def test_a_crafted_lapack_call_is_refused_without_running_it(tmp_path):
    # A one-element pivot buffer for a 2048x2048 LU: running it writes 2047 ints past the
    # buffer (it segfaults the process). load() must refuse before anything runs.
    art = _crafted_artifact(tmp_path / "crafted", 2048, pivots=1)
    with pytest.raises(
        ArtifactFormatError, match="'lapack_sgetrf_ffi' with operand .* could corrupt memory"
    ):
        load(art)
    loaded = load(art, trust=True)  # the explicit opt-out loads it (and it is not called)
    assert isinstance(loaded, Artifact)


def test_an_unknown_custom_call_target_is_refused_unless_trusted(tmp_path):
    art = _crafted_artifact(tmp_path / "unknown", 8, pivots=8, target="my_native_kernel")
    with pytest.raises(ArtifactError, match="'my_native_kernel', which is not on the list") as info:
        load(art)
    assert "trust=True" in str(info.value)
    assert isinstance(load(art, trust=True), Artifact)


def test_a_genuine_lapack_call_loads_and_runs(tmp_path):
    n = 16
    fn = jax.jit(lambda a: (jax.scipy.linalg.lu_factor(a)[0],))
    exported = jax.export.export(fn)(jax.ShapeDtypeStruct((n, n), jnp.float32))
    manifest = _manifest([_spec("a", (n, n))], [_spec("output_0", (n, n))])
    art = Artifact(exported, {}, manifest).save(tmp_path / "lu")
    a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    (got,) = load(art)(a)
    np.testing.assert_allclose(np.asarray(got), np.asarray(fn(a)[0]), rtol=1e-6)


# -- issue 37, item 7 ---------------------------------------------------------------------------


def test_a_byte_flipped_re_signed_program_fails_at_load_not_at_its_first_call(linear, tmp_path):
    data = (linear / PROGRAM).read_bytes()
    x = np.ones((4, 3), np.float32)
    refused = 0
    for n, position in enumerate(range(0, len(data), 29)):
        flipped = bytearray(data)
        flipped[position] ^= 0xFF
        artifact = _copy(linear, tmp_path / f"flip{n}")
        (artifact / PROGRAM).write_bytes(bytes(flipped))
        _tamper(artifact, lambda manifest: None)
        try:
            loaded = load(artifact)
        except ArtifactError:
            refused += 1
            continue
        loaded(x)  # a flip that leaves a valid program (a name, a location): it runs
    assert refused > 0


def test_a_file_of_the_wrong_size_is_refused_unread(linear, tmp_path, monkeypatch):
    artifact = _copy(linear, tmp_path / "big")
    with open(artifact / WEIGHTS, "r+b") as f:
        f.truncate(3 << 30)  # a sparse 3 GiB file: no disk used
    reads = []
    real_open = open

    def watched_open(file, *args, **kwargs):
        reads.append(Path(file).name)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", watched_open)
    monkeypatch.setattr(Path, "read_bytes", lambda self: reads.append(self.name) or b"")
    with pytest.raises(ArtifactError, match="3221225472 bytes, but the manifest recorded"):
        load(artifact)
    assert WEIGHTS not in reads


def test_an_over_long_file_name_is_an_artifact_error(linear, tmp_path):
    artifact = _copy(linear, tmp_path / "long")
    manifest = json.loads((artifact / MANIFEST).read_text())
    manifest["files"]["a" * 300] = {"bytes": 1, "sha256": "0" * 64}
    (artifact / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="could not be read"):
        load(artifact)
    with pytest.raises(ArtifactError, match="could not be read"):
        load(tmp_path / ("b" * 300))
