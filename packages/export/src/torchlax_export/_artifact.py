"""The artifact: a ``jax.export.Exported`` plus the weights it takes, saved as a directory.

This module imports only ``jax`` and ``numpy`` (never torch, never torchlax-core), so that
``torchlax_export.load`` works where PyTorch is not installed.

Layout of a saved artifact (``Artifact.save(path)``)::

    path/
      manifest.json     what the program takes and returns (below)
      program.jaxexport the serialized StableHLO program: ``jax.export.Exported.serialize()``
      weights.safetensors
                        parameters, buffers and constants, keyed by their names (``_weights.py``
                        says how; format version 1 had ``weights.npz`` instead, still read)

``manifest.json`` holds ``format`` (``"torchlax-export"``), ``format_version`` (2), the versions
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
from ._weights import LEGACY_WEIGHTS, WEIGHTS, load_legacy_weights, load_weights, save_weights

FORMAT = "torchlax-export"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)  # 1: weights in weights.npz
MANIFEST = "manifest.json"
PROGRAM = "program.jaxexport"


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
                raise InputMismatchError(
                    f"The exported program rejected the inputs: {exc}"
                ) from exc
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
                _check_array(
                    f"weight '{spec['name']}'",
                    spec,
                    np.shape(value),
                    _dtype_of(value),
                    {},
                    self.manifest["dims"],
                )
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
                values[i] = np.random.default_rng().integers(
                    0, 2**32, spec["shape"], dtype=np.uint32
                )
        missing = [n for n, v in zip(names, values, strict=True) if v is _MISSING]
        if missing:
            raise InputMismatchError(f"Missing input(s): {', '.join(missing)}.")
        bound: dict[str, tuple[int, str]] = {}
        arrays = []
        for spec, value in zip(specs, values, strict=True):
            if not isinstance(value, jax.Array):
                value = np.asarray(value)
            _check_array(
                f"input '{spec['name']}'",
                spec,
                tuple(value.shape),
                value.dtype,
                bound,
                self.manifest["dims"],
            )
            arrays.append(value)
        return arrays

    # -- saving -------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> Path:
        """Write the artifact into directory ``path`` (created if needed); returns the path."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        program = bytes(self.exported.serialize())
        (path / PROGRAM).write_bytes(program)
        save_weights(path / WEIGHTS, self.manifest["weights"], self.weights)
        manifest = dict(self.manifest)
        manifest["format_version"] = FORMAT_VERSION  # also when a version-1 artifact is re-saved
        manifest["files"] = {name: _file_record(path / name) for name in (PROGRAM, WEIGHTS)}
        manifest["weights"] = [
            {**spec, "shape": list(np.shape(self.weights[spec["name"]]))}
            for spec in self.manifest["weights"]
        ]
        (path / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        return path


def load(path: str | os.PathLike, *, trust: bool = False) -> Artifact:
    """Load an artifact directory written by ``Artifact.save``; needs only jax and numpy.

    Loading is safe on an artifact from anywhere: nothing is unpickled, no file outside the
    directory is read, every manifest field is checked (``ArtifactFormatError`` names the
    field), and the program may call only the custom-call targets torchlax's own exports emit
    (below). ``trust=True`` lifts the custom-call restriction for an artifact whose origin you
    trust (one that calls a LAPACK kernel whose operand sizes torchlax cannot check, for
    example).

    Raises ``ArtifactFormatError`` when the directory is not an artifact, a file is missing,
    truncated or altered, the format version is not one this torchlax-export reads, or the
    manifest or program is malformed or not allowed.
    """
    path = Path(path)
    try:
        return _load(path, trust)
    except OSError as exc:  # a name too long for the file system, a directory unreadable, ...
        raise ArtifactFormatError(
            f"The artifact {str(path)[:200]!r} could not be read ({exc.strerror or exc}). Pass "
            "the directory that Artifact.save wrote, with its files readable."
        ) from exc


def _load(path: Path, trust: bool) -> Artifact:
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise ArtifactFormatError(
            f"{path} is not a torchlax-export artifact: it has no {MANIFEST}. Pass the directory "
            "that Artifact.save (or `python -m torchlax_export ... -o DIR`) wrote."
        )
    _check_inside(path, MANIFEST)
    if manifest_path.stat().st_size > _MAX_MANIFEST_BYTES:
        raise ArtifactFormatError(
            f"{manifest_path} has {manifest_path.stat().st_size} bytes, more than a "
            f"torchlax-export manifest ever needs ({_MAX_MANIFEST_BYTES}): refused unread."
        )
    try:
        manifest = json.loads(manifest_path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactFormatError(
            f"{manifest_path} is not valid JSON ({exc}); the artifact is "
            "corrupt or truncated: export it again."
        ) from None
    except RecursionError:
        raise ArtifactFormatError(
            f"{manifest_path} nests its JSON too deeply to be a "
            "torchlax-export manifest; the artifact is corrupt."
        ) from None
    _check_manifest(manifest, manifest_path)
    for name, record in manifest["files"].items():
        _verify_file(_check_inside(path, name), record)
    exported = _deserialized(path / PROGRAM, manifest)
    n_expected = len(manifest["weights"]) + len(manifest["inputs"])
    if len(exported.in_avals) != n_expected:
        raise ArtifactFormatError(
            f"{path / PROGRAM} takes {len(exported.in_avals)} arrays but {MANIFEST} describes "
            f"{n_expected} (weights and inputs): the files come from different exports."
        )
    _check_against_program(manifest, exported, path / PROGRAM)
    if not trust:
        _check_custom_calls(exported, path / PROGRAM)
    weights_file = path / _weights_file(manifest)
    read = load_weights if manifest["format_version"] == FORMAT_VERSION else load_legacy_weights
    try:
        weights = read(weights_file, manifest["weights"])
    except ArtifactFormatError:
        raise
    except Exception as exc:
        raise ArtifactFormatError(
            f"{weights_file} could not be read ({exc}); the artifact is corrupt: export it again."
        ) from exc
    return Artifact(exported, weights, manifest)


# -- helpers ----------------------------------------------------------------------------------

# A manifest lists a few hundred arrays; anything this big is not one (and is not read).
_MAX_MANIFEST_BYTES = 64 << 20


def _deserialized(program: Path, manifest: dict):
    """The program, deserialized and its StableHLO parsed now: a corrupt one (even re-signed)
    fails here with ``ArtifactFormatError``, not at its first call with XLA's error."""
    try:
        exported = jax.export.deserialize(bytearray(program.read_bytes()))
        exported.mlir_module()  # parses (and verifies) the serialized module
    except Exception as exc:
        raise ArtifactFormatError(
            f"{program} could not be deserialized by jax {jax.__version__} "
            f"({str(exc).strip()[:300]}). It was written with jax {manifest.get('jax_version')}: "
            "load it with a jax at least that recent, or export it again; an artifact altered "
            "after export is corrupt."
        ) from exc
    return exported


_MISSING = object()
_REQUIRED = (
    "format",
    "format_version",
    "files",
    "dims",
    "weights",
    "inputs",
    "outputs",
    "output_tree",
    "mutations",
)


def _check_manifest(manifest: Any, where: Path) -> None:
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArtifactFormatError(
            f"{where} is not a torchlax-export manifest (its 'format' is not '{FORMAT}')."
        )
    version = manifest.get("format_version")
    if not _is_int(version) or version not in READABLE_VERSIONS:
        newer = isinstance(version, int) and version > FORMAT_VERSION
        raise ArtifactFormatError(
            f"{where} has format version {version!r}; this torchlax-export reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}. "
            + ("Upgrade torchlax-export to load it." if newer else "Export the model again.")
        )
    absent = [key for key in _REQUIRED if key not in manifest]
    if absent:
        raise ArtifactFormatError(
            f"{where} lacks the entries {absent}; the artifact is corrupt: export it again."
        )
    files = manifest["files"]
    if not isinstance(files, dict) or not all(isinstance(r, dict) for r in files.values()):
        raise ArtifactFormatError(
            f"{where}: 'files' must map file names to their size and checksum."
        )
    for name in (PROGRAM, _weights_file(manifest)):
        if name not in files:
            raise ArtifactFormatError(f"{where} does not list the file {name}.")
    _check_fields(manifest, where)


def _weights_file(manifest: dict) -> str:
    return WEIGHTS if manifest["format_version"] == FORMAT_VERSION else LEGACY_WEIGHTS


_MAX_TREE_DEPTH = 64  # far deeper than any PyTorch program's outputs nest


def _field_error(where: Path, field: str, problem: str) -> ArtifactFormatError:
    return ArtifactFormatError(
        f"{where}: {field} {problem}; the artifact is corrupt or was not "
        "written by torchlax-export: export it again."
    )


def _check_fields(manifest: dict, where: Path) -> None:
    """Every field ``load`` and calls read, checked for type and range before any is used."""
    _check_dims(manifest["dims"], where)
    for section in ("weights", "inputs", "outputs"):
        specs = manifest[section]
        if not isinstance(specs, list):
            raise _field_error(where, f"'{section}'", "is not a list")
        for i, spec in enumerate(specs):
            _check_spec(spec, section, f"{section}[{i}]", where)
    names = [w["name"] for w in manifest["weights"]]
    if len(set(names)) != len(names):
        raise _field_error(where, "'weights'", "names a weight twice")
    n_outputs = len(manifest["outputs"])
    _check_tree(manifest["output_tree"], n_outputs, where, "output_tree", 0)
    _check_mutations(manifest["mutations"], names, n_outputs, where)


def _check_dims(dims, where: Path) -> None:
    """The symbolic dims' bounds: ``{name: {'min': int, 'max': int|null}}``, min <= max."""
    if not isinstance(dims, dict):
        raise _field_error(where, "'dims'", "is not an object")
    for name, bounds in dims.items():
        if not isinstance(bounds, dict) or not all(
            bounds.get(k) is None or _is_int(bounds.get(k)) for k in ("min", "max")
        ):
            raise _field_error(where, f"dims['{name}']", "is not {'min': int, 'max': int|null}")
        low, high = bounds.get("min"), bounds.get("max")
        if low is not None and high is not None and low > high:
            raise _field_error(where, f"dims['{name}']", f"has min {low} above max {high}")


def _check_spec(spec, section: str, field: str, where: Path) -> None:
    """One weight's, input's or output's spec: a name, a shape of sizes or dim names (a weight's
    all static), a dtype name."""
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise _field_error(where, field, "has no string 'name'")
    shape = spec.get("shape")
    if not isinstance(shape, list) or not all(
        (_is_int(d) and d >= 0) or isinstance(d, str) for d in shape
    ):
        raise _field_error(
            where,
            f"{field}.shape",
            f"is {shape!r}, not a list of sizes (non-negative ints, or names of symbolic dims)",
        )
    if section == "weights" and not all(_is_int(d) for d in shape):
        raise _field_error(
            where, f"{field}.shape", "has a symbolic dim (weights have static shapes)"
        )
    dtype = spec.get("dtype")
    try:
        if not isinstance(dtype, str):
            raise TypeError
        jnp.dtype(dtype)
    except (TypeError, ValueError):
        raise _field_error(
            where, f"{field}.dtype", f"is {dtype!r}, not a dtype name such as 'float32'"
        ) from None


def _check_mutations(mutations, names: list, n_outputs: int, where: Path) -> None:
    """Each mutation names a weight, and its output (if given) is where the program returns it."""
    if not isinstance(mutations, list):
        raise _field_error(where, "'mutations'", "is not a list")
    for j, m in enumerate(mutations):
        if not isinstance(m, dict) or m.get("buffer") not in names:
            raise _field_error(where, f"mutations[{j}].buffer", "names no weight of the artifact")
        if "output" in m and m["output"] != n_outputs + j:
            raise _field_error(
                where,
                f"mutations[{j}].output",
                f"is {m['output']!r}; the program returns buffer {j} as output {n_outputs + j}",
            )


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_tree(tree, n_leaves: int, where: Path, field: str, depth: int) -> None:
    if depth > _MAX_TREE_DEPTH:
        raise _field_error(where, field, f"nests deeper than {_MAX_TREE_DEPTH} levels")
    if tree is None:
        return
    if _is_int(tree):
        if not 0 <= tree < n_leaves:
            raise _field_error(
                where, field, f"refers to output {tree}, but the artifact has {n_leaves} output(s)"
            )
        return
    if not isinstance(tree, dict) or len(tree) != 1:
        raise _field_error(
            where,
            field,
            f"is {str(tree)[:80]!r}, not an output index, null or "
            "a one-key object ('tuple', 'list', 'dict' or 'const')",
        )
    kind, body = next(iter(tree.items()))
    if kind == "const":
        return
    if kind in ("tuple", "list") and isinstance(body, list):
        for k, t in enumerate(body):
            _check_tree(t, n_leaves, where, f"{field}.{kind}[{k}]", depth + 1)
        return
    if (
        kind == "dict"
        and isinstance(body, list)
        and all(isinstance(e, list) and len(e) == 2 for e in body)
    ):
        for key, t in body:
            try:
                hash(key)
            except TypeError:
                raise _field_error(
                    where, f"{field}.dict", f"has an unhashable key {key!r}"
                ) from None
            _check_tree(t, n_leaves, where, f"{field}.dict[{key!r}]", depth + 1)
        return
    raise _field_error(where, field, f"has a node {kind!r} with a malformed body")


def _check_inside(root: Path, name: str) -> Path:
    """``root / name``, refused unless it stays inside ``root`` (symlinks resolved)."""
    if (
        not isinstance(name, str)
        or not name
        or os.path.isabs(name)
        or "\\" in name
        or "\x00" in name
        or any(part in ("..", "") for part in name.split("/"))
    ):
        raise ArtifactFormatError(
            f"The manifest of {root} lists the file {name!r}, a name that leaves the artifact "
            "directory (absolute, '..', empty parts or a NUL byte): refused. An artifact only "
            "reads its own files."
        )
    target = root / name
    base = root.resolve()
    resolved = target.resolve()
    if resolved != base and base not in resolved.parents:
        raise ArtifactFormatError(
            f"The artifact file {target} is a link to {resolved}, outside the artifact "
            "directory: refused. An artifact only reads its own files."
        )
    return target


def _check_against_program(manifest: dict, exported, where: Path) -> None:
    n_weights = len(manifest["weights"])
    for i, (spec, aval) in enumerate(
        zip(manifest["weights"] + manifest["inputs"], exported.in_avals, strict=True)
    ):
        field = f"weights[{i}]" if i < n_weights else f"inputs[{i - n_weights}]"
        static_differs = any(
            _is_int(want) and isinstance(have, int) and want != have
            for want, have in zip(spec["shape"], aval.shape)
        )
        if (
            jnp.dtype(spec["dtype"]) != np.dtype(aval.dtype)
            or len(spec["shape"]) != len(aval.shape)
            or static_differs
        ):
            raise ArtifactFormatError(
                f"{MANIFEST}: {field} is {_describe(spec)}, but {where.name} takes "
                f"{np.dtype(aval.dtype).name}{list(aval.shape)} there: the files come from "
                "different exports."
            )
    n_out = len(manifest["outputs"]) + len(manifest["mutations"])
    if len(exported.out_avals) != n_out:
        raise ArtifactFormatError(
            f"{MANIFEST} describes {n_out} results (outputs and mutated buffers), but "
            f"{where.name} returns {len(exported.out_avals)}: the files come from different "
            "exports."
        )


# Custom calls an artifact may make without trust=True. A custom call runs a native kernel
# that trusts the operand and result sizes written in the program: a crafted program can
# make it read or write past its buffers (a LAPACK LU with a one-element pivot buffer for a
# large matrix corrupts memory). These targets are what torchlax's exports emit: structural
# ones that touch no buffer, and the solver kernels whose result sizes are checked below.
_SAFE_CUSTOM_CALLS = frozenset(
    {
        "Sharding",
        "SPMDFullToShardShape",
        "SPMDShardToFullShape",
        "annotate_device_placement",
        "shape_assertion",
        "cu_threefry2x32_ffi",
        "hip_threefry2x32_ffi",
    }
)


# Each takes the operand types [(shape, element type)] and returns the result types the kernel
# writes, or None when the operands themselves are not what the kernel takes.
def _lu_results(operands):  # getrf: LU factors, pivots (min(m, n) of them), info
    if len(operands) != 1 or len(operands[0][0]) < 2:
        return None
    ((shape, dtype),) = operands
    *batch, m, n = shape
    return [(shape, dtype), ((*batch, min(m, n)), "i32"), (tuple(batch), "i32")]


def _cholesky_results(operands):  # potrf: factor, info
    if len(operands) != 1 or len(operands[0][0]) < 2 or operands[0][0][-1] != operands[0][0][-2]:
        return None
    ((shape, dtype),) = operands
    return [(shape, dtype), (tuple(shape[:-2]), "i32")]


def _qr_results(operands):  # geqrf: factors, tau (min(m, n) of them)
    if len(operands) != 1 or len(operands[0][0]) < 2:
        return None
    ((shape, dtype),) = operands
    *batch, m, n = shape
    return [(shape, dtype), ((*batch, min(m, n)), dtype)]


def _householder_results(operands):  # orgqr/ungqr: Q from the factors and tau
    if len(operands) != 2 or len(operands[0][0]) < 2:
        return None
    (shape, dtype), (tau_shape, tau_dtype) = operands
    *batch, m, n = shape
    if (
        tuple(tau_shape[:-1]) != tuple(batch)
        or not 0 <= tau_shape[-1] <= min(m, n)
        or tau_dtype != dtype
    ):
        return None
    return [(shape, dtype)]


_CHECKED_CUSTOM_CALLS = {
    **{f"lapack_{t}getrf_ffi": _lu_results for t in "sdcz"},
    **{f"lapack_{t}potrf_ffi": _cholesky_results for t in "sdcz"},
    **{f"lapack_{t}geqrf_ffi": _qr_results for t in "sdcz"},
    **{f"lapack_{t}_ffi": _householder_results for t in ("sorgqr", "dorgqr", "cungqr", "zungqr")},
    "cusolver_getrf_ffi": _lu_results,
    "hipsolver_getrf_ffi": _lu_results,
    "cusolver_potrf_ffi": _cholesky_results,
    "hipsolver_potrf_ffi": _cholesky_results,
    "cusolver_geqrf_ffi": _qr_results,
    "hipsolver_geqrf_ffi": _qr_results,
    "cusolver_orgqr_ffi": _householder_results,
    "hipsolver_orgqr_ffi": _householder_results,
}


def _custom_calls(exported) -> list[tuple[str, list, list]]:
    """(target, operand types, result types) of every custom call in the program."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir

    found = []
    with mlir.make_ir_context():
        # The stored bytes are versioned VHLO; mlir_module() gives them back as StableHLO.
        module = ir.Module.parse(exported.mlir_module())

        def types(values):
            out = []
            for v in values:
                try:
                    t = ir.RankedTensorType(v.type)
                    out.append((tuple(t.shape), str(t.element_type)))
                except (ValueError, TypeError):
                    out.append((None, str(v.type)))
            return out

        stack = [module.operation]
        while stack:  # iterative: a deeply nested program cannot exhaust Python's stack
            op = stack.pop()
            if op.name == "stablehlo.custom_call":
                target = ir.StringAttr(op.attributes["call_target_name"]).value
                found.append((target, types(op.operands), types(op.results)))
            for region in op.regions:
                for block in region:
                    stack.extend(o.operation for o in block)
    return found


def _check_custom_calls(exported, where: Path) -> None:
    for target, operands, results in _custom_calls(exported):
        if target in _SAFE_CUSTOM_CALLS:
            continue
        rule = _CHECKED_CUSTOM_CALLS.get(target)
        if rule is None:
            raise ArtifactFormatError(
                f"{where} calls the custom-call target {target!r}, which is not on the list of "
                "targets torchlax's exports emit: a custom call runs native code that trusts "
                "the sizes written in the program, so an artifact from an untrusted source "
                "could corrupt memory. If you trust where this artifact comes from, load it "
                "with torchlax_export.load(path, trust=True)."
            )
        expected = None
        if all(shape is not None and all(d >= 0 for d in shape) for shape, _ in operands):
            expected = rule(operands)  # (a dynamic size is negative here: never accepted)
        if expected is None or results != [(tuple(s), d) for s, d in expected]:
            raise ArtifactFormatError(
                f"{where} calls {target!r} with operand {operands} and results {results}, "
                f"but that kernel writes {expected}: the program is malformed or crafted and "
                "running it could corrupt memory. Refused (load(path, trust=True) skips this "
                "check, for an artifact from a source you trust)."
            )


def _file_record(path: Path) -> dict:
    return {"bytes": path.stat().st_size, "sha256": _sha256(path)}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):  # bounded memory, whatever the size
            digest.update(chunk)
    return digest.hexdigest()


def _verify_file(path: Path, record: dict) -> None:
    if not path.is_file():
        raise ArtifactFormatError(f"The artifact file {path} is missing.")
    size = path.stat().st_size  # before reading: a file of the wrong size is not read at all
    if size != record.get("bytes"):
        raise ArtifactFormatError(
            f"The artifact file {path} has {size} bytes, but the manifest recorded "
            f"{record.get('bytes')}: it is truncated or was overwritten. Export it again."
        )
    if _sha256(path) != record.get("sha256"):
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
    raise ArtifactFormatError(
        f"Unknown output_tree node {kind!r} in the manifest."
    )  # checked at load
