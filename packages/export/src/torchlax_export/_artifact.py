"""The artifact: a ``jax.export.Exported`` plus the weights it takes, saved as a directory.

This module imports only ``jax`` and ``numpy`` (never torch, never torchlax-core), so that
``torchlax_export.load`` works where PyTorch is not installed.

Layout of a saved artifact (``Artifact.save(path)``)::

    path/
      manifest.json     what the program takes and returns (below)
      program.jaxexport the serialized StableHLO program: ``jax.export.Exported.serialize()``
      weights.npz       parameters, buffers and constants; arrays ``w0``, ``w1``, ... in the
                        order of ``manifest["weights"]`` (bfloat16/float8 stored as raw bytes)

``manifest.json`` holds ``format`` (``"torchlax-export"``), ``format_version`` (1), the versions
of torchlax, torch and jax that wrote it, ``files`` (name, size and sha256 of each file, checked
on load), ``dims`` (each symbolic dimension with its ``min``/``max``), ``weights``, ``inputs`` and
``outputs`` (each a ``name``, a ``shape`` whose symbolic dims are strings such as ``"batch"``, and
a ``dtype`` name such as ``"float32"``), ``output_tree`` (how the flat outputs nest into what
the PyTorch program returned) and ``mutations`` (which output is the new value of which buffer).

The program's calling convention is flat: ``exported.call(*weights, *inputs)`` returns the user
outputs followed by the new values of mutated buffers (BatchNorm running statistics in train
mode), in the order of ``manifest["mutations"]``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._errors import ArtifactError, ArtifactFormatError, InputMismatchError

FORMAT = "torchlax-export"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
PROGRAM = "program.jaxexport"
WEIGHTS = "weights.npz"

# numpy cannot name these dtypes natively: they are stored as raw unsigned bytes.
_RAW_STORAGE = {1: np.uint8, 2: np.uint16}


class Artifact:
    """An exported program and its weights: call it, save it, or read its StableHLO.

    ``artifact(*inputs, **named_inputs)`` runs the program on arrays (NumPy or JAX, exactly the
    dtypes of ``artifact.inputs``) and returns ``jax.Array`` outputs nested as the PyTorch
    program returned them. A program that mutates buffers (BatchNorm in train mode) writes their
    new values into ``artifact.weights``, as the PyTorch module updates itself; ``run`` is the
    functional form that returns them instead.
    """

    def __init__(self, exported: jax.export.Exported, weights: Mapping[str, Any], manifest: dict):
        self.exported = exported
        self.manifest = manifest
        self.weights: dict[str, Any] = {w["name"]: weights[w["name"]] for w in manifest["weights"]}
        self._call = jax.jit(exported.call)
        self._device_weights: tuple[tuple[int, ...], list] | None = None

    # -- description ------------------------------------------------------------------------

    @property
    def inputs(self) -> list[dict]:
        """Name, shape (symbolic dims as strings) and dtype of each input, in call order."""
        return self.manifest["inputs"]

    @property
    def outputs(self) -> list[dict]:
        """Name, shape and dtype of each (flat) user output."""
        return self.manifest["outputs"]

    @property
    def mutated_buffers(self) -> list[str]:
        """Names of the buffers each call updates (in ``weights``)."""
        return [m["buffer"] for m in self.manifest["mutations"]]

    def stablehlo(self) -> str:
        """The program as StableHLO MLIR text."""
        return self.exported.mlir_module()

    def __repr__(self) -> str:
        ins = ", ".join(f"{i['name']}: {_describe(i)}" for i in self.inputs)
        outs = ", ".join(_describe(o) for o in self.outputs)
        return f"<torchlax_export.Artifact ({ins}) -> ({outs}), {len(self.weights)} weights>"

    # -- running ------------------------------------------------------------------------------

    def run(self, *inputs, weights: Mapping[str, Any] | None = None, **named_inputs):
        """Run functionally: returns ``(outputs, new_buffers)``.

        ``weights`` replaces some or all of ``self.weights`` for this call (by name).
        ``new_buffers`` maps each mutated buffer's name to its new value (empty when the
        program mutates none). ``self.weights`` is left unchanged.
        """
        arrays = self._check_inputs(inputs, named_inputs)
        self._check_platform()
        with jax.enable_x64(True):
            try:
                flat = self._call(*self._weight_arrays(weights), *arrays)
            except (ValueError, TypeError) as exc:  # e.g. a derived dim such as 2*batch broken
                raise InputMismatchError(f"The exported program rejected the inputs: {exc}") from exc
        n_user = len(self.outputs)
        user, mutated = flat[:n_user], flat[n_user:]
        outputs = _unflatten(self.manifest["output_tree"], user)
        new_buffers = {m["buffer"]: mutated[i] for i, m in enumerate(self.manifest["mutations"])}
        return outputs, new_buffers

    def __call__(self, *inputs, **named_inputs):
        outputs, new_buffers = self.run(*inputs, **named_inputs)
        self.weights.update(new_buffers)
        return outputs

    def _check_platform(self) -> None:
        backend = jax.default_backend()
        here = {"gpu": ("cuda", "rocm")}.get(backend, (backend,))
        if not set(here) & set(self.exported.platforms):
            raise ArtifactError(
                f"This artifact was lowered for {', '.join(self.exported.platforms)}, but JAX runs "
                f"on {backend} here. Export it with platforms=(..., '{here[0]}') (CLI: --platform "
                f"{here[0]}), or run JAX on a lowered platform (e.g. JAX_PLATFORMS=cpu)."
            )

    def _weight_arrays(self, override: Mapping[str, Any] | None) -> list:
        if override:
            unknown = set(override) - set(self.weights)
            if unknown:
                raise InputMismatchError(
                    f"weights= names {sorted(unknown)}, which this artifact does not take; its "
                    f"weights are {list(self.weights)}."
                )
            values = [override.get(name, value) for name, value in self.weights.items()]
            for spec, value in zip(self.manifest["weights"], values, strict=True):
                _check_array(f"weight '{spec['name']}'", spec, np.shape(value), _dtype_of(value), {},
                             self.manifest["dims"])
            return values
        key = tuple(id(v) for v in self.weights.values())
        if self._device_weights is None or self._device_weights[0] != key:
            with jax.enable_x64(True):
                arrays = [jnp.asarray(v) for v in self.weights.values()]
            self._device_weights = (key, arrays)
        return self._device_weights[1]

    def _check_inputs(self, inputs: tuple, named: dict) -> list:
        specs = self.inputs
        names = [s["name"] for s in specs]
        if len(inputs) > len(specs):
            raise InputMismatchError(
                f"This artifact takes {len(specs)} input(s) ({', '.join(names)}), but "
                f"{len(inputs)} were given."
            )
        values: list[Any] = list(inputs) + [_MISSING] * (len(specs) - len(inputs))
        for key, value in named.items():
            if key not in names:
                raise InputMismatchError(
                    f"This artifact has no input named '{key}'; its inputs are {', '.join(names)}."
                )
            index = names.index(key)
            if values[index] is not _MISSING:
                raise InputMismatchError(f"Input '{key}' was given both by position and by name.")
            values[index] = value
        for i, spec in enumerate(specs):
            if values[i] is _MISSING and spec.get("role") == "rng":  # fresh randomness per call
                values[i] = np.random.default_rng().integers(0, 2**32, spec["shape"], dtype=np.uint32)
        missing = [n for n, v in zip(names, values, strict=True) if v is _MISSING]
        if missing:
            raise InputMismatchError(f"Missing input(s): {', '.join(missing)}.")
        bound: dict[str, tuple[int, str]] = {}
        arrays = []
        for spec, value in zip(specs, values, strict=True):
            if not isinstance(value, jax.Array):
                value = np.asarray(value)
            _check_array(f"input '{spec['name']}'", spec, tuple(value.shape), value.dtype, bound,
                         self.manifest["dims"])
            arrays.append(value)
        return arrays

    # -- saving -------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> Path:
        """Write the artifact into directory ``path`` (created if needed); returns the path."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        program = bytes(self.exported.serialize())
        stored = {}
        for i, spec in enumerate(self.manifest["weights"]):
            array = np.asarray(self.weights[spec["name"]])
            if array.dtype.type.__module__ != "numpy":  # an ml_dtypes type (bfloat16, float8)
                array = array.view(_RAW_STORAGE[array.dtype.itemsize])
            stored[f"w{i}"] = array
        (path / PROGRAM).write_bytes(program)
        with open(path / WEIGHTS, "wb") as f:
            np.savez(f, **stored)
        manifest = dict(self.manifest)
        manifest["files"] = {name: _file_record(path / name) for name in (PROGRAM, WEIGHTS)}
        manifest["weights"] = [
            {**spec, "shape": list(np.shape(self.weights[spec["name"]]))}
            for spec in self.manifest["weights"]
        ]
        (path / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        return path


def load(path: str | os.PathLike) -> Artifact:
    """Load an artifact directory written by ``Artifact.save``; needs only jax and numpy.

    Raises ``ArtifactFormatError`` when the directory is not an artifact, a file is missing,
    truncated or altered, or the format version is not one this torchlax-export reads.
    """
    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise ArtifactFormatError(
            f"{path} is not a torchlax-export artifact: it has no {MANIFEST}. Pass the directory "
            "that Artifact.save (or `python -m torchlax_export ... -o DIR`) wrote."
        )
    try:
        manifest = json.loads(manifest_path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactFormatError(f"{manifest_path} is not valid JSON ({exc}); the artifact is "
                                  "corrupt or truncated: export it again.") from None
    _check_manifest(manifest, manifest_path)
    for name, record in manifest["files"].items():
        _verify_file(path / name, record)
    try:
        exported = jax.export.deserialize(bytearray((path / PROGRAM).read_bytes()))
    except Exception as exc:
        raise ArtifactFormatError(
            f"{path / PROGRAM} could not be deserialized by jax {jax.__version__} ({exc}). It "
            f"was written with jax {manifest.get('jax_version')}: load it with a jax at least "
            "that recent, or export it again."
        ) from exc
    n_expected = len(manifest["weights"]) + len(manifest["inputs"])
    if len(exported.in_avals) != n_expected:
        raise ArtifactFormatError(
            f"{path / PROGRAM} takes {len(exported.in_avals)} arrays but {MANIFEST} describes "
            f"{n_expected} (weights and inputs): the files come from different exports."
        )
    try:
        with np.load(path / WEIGHTS, allow_pickle=False) as stored:
            weights = {}
            for i, spec in enumerate(manifest["weights"]):
                array = stored[f"w{i}"]
                dtype = jnp.dtype(spec["dtype"])
                if array.dtype != dtype:
                    array = array.view(dtype)
                if list(array.shape) != list(spec["shape"]):
                    raise ArtifactFormatError(
                        f"Weight '{spec['name']}' in {WEIGHTS} has shape {list(array.shape)}, "
                        f"but {MANIFEST} says {spec['shape']}: the artifact is inconsistent."
                    )
                weights[spec["name"]] = array
    except ArtifactFormatError:
        raise
    except Exception as exc:
        raise ArtifactFormatError(f"{path / WEIGHTS} could not be read ({exc}); the artifact is "
                                  "corrupt: export it again.") from exc
    return Artifact(exported, weights, manifest)


# -- helpers ----------------------------------------------------------------------------------

_MISSING = object()
_REQUIRED = ("format", "format_version", "files", "dims", "weights", "inputs", "outputs",
             "output_tree", "mutations")


def _check_manifest(manifest: Any, where: Path) -> None:
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArtifactFormatError(f"{where} is not a torchlax-export manifest (its 'format' is not "
                                  f"'{FORMAT}').")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        newer = isinstance(version, int) and version > FORMAT_VERSION
        raise ArtifactFormatError(
            f"{where} has format version {version!r}; this torchlax-export reads version "
            f"{FORMAT_VERSION}. "
            + ("Upgrade torchlax-export to load it." if newer else "Export the model again.")
        )
    absent = [key for key in _REQUIRED if key not in manifest]
    if absent:
        raise ArtifactFormatError(f"{where} lacks the entries {absent}; the artifact is corrupt: "
                                  "export it again.")
    for name in (PROGRAM, WEIGHTS):
        if name not in manifest["files"]:
            raise ArtifactFormatError(f"{where} does not list the file {name}.")


def _file_record(path: Path) -> dict:
    data = path.read_bytes()
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _verify_file(path: Path, record: dict) -> None:
    if not path.is_file():
        raise ArtifactFormatError(f"The artifact file {path} is missing.")
    data = path.read_bytes()
    if len(data) != record.get("bytes"):
        raise ArtifactFormatError(
            f"The artifact file {path} has {len(data)} bytes, but the manifest recorded "
            f"{record.get('bytes')}: it is truncated or was overwritten. Export it again."
        )
    if hashlib.sha256(data).hexdigest() != record.get("sha256"):
        raise ArtifactFormatError(
            f"The artifact file {path} does not match the checksum in the manifest: it is "
            "corrupt. Export it again."
        )


def _dtype_of(value) -> np.dtype:
    return value.dtype if hasattr(value, "dtype") else np.asarray(value).dtype


def _describe(spec: dict) -> str:
    return f"{spec['dtype']}[{', '.join(str(d) for d in spec['shape'])}]"


def _check_array(what: str, spec: dict, shape: tuple, dtype, bound: dict, dims: dict) -> None:
    """Raise ``InputMismatchError`` unless ``shape``/``dtype`` fit ``spec``.

    ``bound`` collects the value each symbolic dimension took, so that every input using
    ``batch`` must agree on it.
    """
    expected = jnp.dtype(spec["dtype"])
    if np.dtype(dtype) != expected:
        raise InputMismatchError(
            f"{what} has dtype {np.dtype(dtype).name}, but the artifact was exported for "
            f"{expected.name} (expected {_describe(spec)}). Convert it first, e.g. "
            f"x.astype('{expected.name}'); torchlax-export never casts silently."
        )
    want = spec["shape"]
    if len(shape) != len(want):
        raise InputMismatchError(
            f"{what} has shape {tuple(shape)} ({len(shape)} dims), but the artifact expects "
            f"{_describe(spec)} ({len(want)} dims)."
        )
    for axis, (got, dim) in enumerate(zip(shape, want, strict=True)):
        if isinstance(dim, int):
            if got != dim:
                raise InputMismatchError(
                    f"{what} has shape {tuple(shape)}: size {got} in dim {axis}, but the artifact "
                    f"expects {_describe(spec)}; "
                    "that dim was not exported as dynamic (pass dynamic_shapes to export)."
                )
            continue
        if dim in dims:  # a plain symbolic dimension, e.g. "batch"
            low, high = dims[dim].get("min"), dims[dim].get("max")
            if (low is not None and got < low) or (high is not None and got > high):
                raise InputMismatchError(
                    f"{what} has shape {tuple(shape)}: size {got} in dim {axis} ({dim}) is outside "
                    "the exported range "
                    f"{dim} in [{low}, {high if high is not None else 'inf'}]."
                )
            if dim in bound and bound[dim][0] != got:
                raise InputMismatchError(
                    f"{what} has {dim} = {got} in dim {axis}, but {bound[dim][1]} has {dim} = "
                    f"{bound[dim][0]}; inputs must agree on each symbolic dimension."
                )
            bound.setdefault(dim, (got, what))


def _unflatten(tree, leaves):
    if tree is None:
        return None
    if isinstance(tree, int):
        return leaves[tree]
    kind, body = next(iter(tree.items()))
    if kind == "tuple":
        return tuple(_unflatten(t, leaves) for t in body)
    if kind == "list":
        return [_unflatten(t, leaves) for t in body]
    if kind == "dict":
        return {key: _unflatten(t, leaves) for key, t in body}
    if kind == "const":
        return body
    raise ArtifactFormatError(f"Unknown output_tree node {kind!r} in the manifest.")
