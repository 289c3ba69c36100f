"""An artifact's weight file: written as safetensors, read back memory-mapped with numpy alone.

``weights.safetensors`` is a standard safetensors file keyed by the weights' names
(``proj.weight``, ...), so any safetensors reader (``safetensors.numpy.load_file``,
``safetensors.flax.load_file``) gets the weights as a state dict. Each weight is stored in its
own dtype where safetensors' numpy reader can read it; any other (float8 kinds, ``int4``,
``complex128``, ...) is stored as its raw bytes, a ``uint8`` array with one more trailing axis
of the dtype's item size; the manifest holds the real dtype and shape.

Reading never copies: the file is mapped read-only (``np.memmap``) and each weight is a view of
its bytes, so loading a large artifact costs no memory until the weights move to the device.
The header is checked here before anything is mapped (sizes, offsets inside the file, no
overlap, dtype and shape as the manifest says): the file may come from anywhere.

Artifacts of format version 1 kept their weights in ``weights.npz`` (arrays ``w0``, ``w1``,
... in manifest order, bfloat16/float8 as raw unsigned integers of their width); they are read
here too (``allow_pickle=False``), not memory-mapped.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np

from ._errors import ArtifactFormatError

WEIGHTS = "weights.safetensors"
LEGACY_WEIGHTS = "weights.npz"  # format version 1

# safetensors' dtype codes for the numpy dtypes stored natively: those safetensors' own numpy
# and flax readers turn back into arrays (they fail on its float8 codes); any other dtype is
# stored as raw bytes, so that those readers read every artifact.
_CODES = {
    "bool": "BOOL",
    "uint8": "U8",
    "int8": "I8",
    "uint16": "U16",
    "int16": "I16",
    "uint32": "U32",
    "int32": "I32",
    "uint64": "U64",
    "int64": "I64",
    "float16": "F16",
    "bfloat16": "BF16",
    "float32": "F32",
    "float64": "F64",
    "complex64": "C64",
}
_DTYPES = {code: name for name, code in _CODES.items()}

# safetensors' own bound on a header; a larger one is refused unread.
_MAX_HEADER_BYTES = 100 << 20


def save_weights(path: Path, specs: list[dict], weights: Mapping[str, Any]) -> None:
    """Write ``weights`` (by the names in ``specs``) into the safetensors file ``path``.

    The file is written beside ``path`` and renamed over it, so an artifact saved over the
    directory it was loaded from (whose weights map the old file) never reads a half-written
    file.
    """
    from safetensors.numpy import save_file

    stored = {spec["name"]: _stored_form(np.asarray(weights[spec["name"]])) for spec in specs}
    fd, tmp = tempfile.mkstemp(prefix=".weights-", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file(stored, tmp, metadata={"format": "torchlax-export"})
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _stored_form(array: np.ndarray) -> np.ndarray:
    if not array.flags.c_contiguous:
        array = array.copy()  # (np.ascontiguousarray would turn a 0-d array 1-d)
    if array.dtype.name in _CODES:
        return array
    # A dtype safetensors cannot name: its bytes, one trailing axis per element.
    return array.reshape(-1).view(np.uint8).reshape(*array.shape, array.dtype.itemsize)


def load_weights(path: Path, specs: list[dict]) -> dict[str, np.ndarray]:
    """The weights of ``specs`` from the safetensors file ``path``, as read-only memory maps."""
    header, data_start = _read_header(path)
    names = [spec["name"] for spec in specs]
    entries = {k: v for k, v in header.items() if k != "__metadata__"}
    if set(entries) != set(names):
        extra, missing = sorted(set(entries) - set(names)), sorted(set(names) - set(entries))
        raise ArtifactFormatError(
            f"{path} holds the weights {extra or 'listed'} but not {missing or 'more'}, unlike "
            "the manifest: the artifact is inconsistent. Export it again."
        )
    data_size = path.stat().st_size - data_start
    spans = []
    for spec in specs:
        begin, end, stored_dtype, stored_shape = _entry(path, spec["name"], entries[spec["name"]])
        if not 0 <= begin <= end <= data_size:
            raise ArtifactFormatError(
                f"{path}: weight '{spec['name']}' lies at bytes [{begin}, {end}) of a "
                f"{data_size}-byte data section: the file is corrupt or crafted."
            )
        want = _expected_storage(spec)
        if (stored_dtype, stored_shape) != want:
            raise ArtifactFormatError(
                f"{path}: weight '{spec['name']}' is stored as {stored_dtype}{stored_shape}, but "
                f"the manifest says {spec['dtype']}{spec['shape']} (stored as "
                f"{want[0]}{want[1]}): the artifact is inconsistent. Export it again."
            )
        if end - begin != np.dtype(stored_dtype).itemsize * int(np.prod(stored_shape)):
            raise ArtifactFormatError(
                f"{path}: weight '{spec['name']}' spans {end - begin} bytes, but "
                f"{stored_dtype}{stored_shape} takes "
                f"{np.dtype(stored_dtype).itemsize * int(np.prod(stored_shape))}: the file is "
                "corrupt or crafted."
            )
        spans.append((begin, end, spec))
    _check_no_overlap(path, spans)
    # np.asarray: plain ndarray views of the map (which stays open while any view lives).
    mapped = (
        np.asarray(np.memmap(path, dtype=np.uint8, mode="r", offset=data_start))
        if data_size > 0
        else np.empty(0, np.uint8)
    )
    return {
        spec["name"]: mapped[begin:end].view(jnp.dtype(spec["dtype"])).reshape(tuple(spec["shape"]))
        for begin, end, spec in spans
    }


def _read_header(path: Path) -> tuple[dict, int]:
    """The safetensors header of ``path`` and where its data section starts."""
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) != 8:
            raise ArtifactFormatError(f"{path} is too short to be a safetensors file.")
        (length,) = struct.unpack("<Q", prefix)
        if length > _MAX_HEADER_BYTES or 8 + length > path.stat().st_size:
            raise ArtifactFormatError(
                f"{path} declares a {length}-byte safetensors header, larger than the file or "
                f"than safetensors allows ({_MAX_HEADER_BYTES}): it is corrupt or crafted."
            )
        raw = f.read(length)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        header = None
    if not isinstance(header, dict):
        raise ArtifactFormatError(
            f"{path} does not start with a safetensors header (a JSON object): it is corrupt. "
            "Export it again."
        )
    return header, 8 + length


def _entry(path: Path, name: str, entry) -> tuple[int, int, str, list[int]]:
    """``(begin, end, numpy dtype name, shape)`` of one header entry, each checked for type."""
    ok = (
        isinstance(entry, dict)
        and entry.get("dtype") in _DTYPES
        and isinstance(entry.get("shape"), list)
        and all(_is_size(d) for d in entry["shape"])
        and isinstance(entry.get("data_offsets"), list)
        and len(entry["data_offsets"]) == 2
        and all(_is_size(o) for o in entry["data_offsets"])
    )
    if not ok:
        raise ArtifactFormatError(
            f"{path}: the safetensors entry of weight '{name}' is {str(entry)[:200]}, not "
            "{dtype, shape, data_offsets} of a dtype torchlax-export writes: the file is "
            "corrupt or crafted."
        )
    begin, end = entry["data_offsets"]
    return begin, end, _DTYPES[entry["dtype"]], list(entry["shape"])


def _expected_storage(spec: dict) -> tuple[str, list[int]]:
    dtype = jnp.dtype(spec["dtype"])
    if dtype.name in _CODES:
        return dtype.name, list(spec["shape"])
    return "uint8", [*spec["shape"], dtype.itemsize]


def _check_no_overlap(path: Path, spans: list) -> None:
    ordered = sorted((begin, end, spec["name"]) for begin, end, spec in spans if end > begin)
    for (_, end, name), (begin, _, other) in zip(ordered, ordered[1:]):
        if begin < end:
            raise ArtifactFormatError(
                f"{path}: weights '{name}' and '{other}' share bytes: the file is corrupt or "
                "crafted."
            )


def _is_size(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def load_legacy_weights(path: Path, specs: list[dict]) -> dict[str, np.ndarray]:
    """The weights of a format-version-1 artifact, from its ``weights.npz``."""
    raw_storage = {1: np.uint8, 2: np.uint16}
    weights = {}
    with np.load(path, allow_pickle=False) as stored:
        for i, spec in enumerate(specs):
            array = stored[f"w{i}"]
            dtype = jnp.dtype(spec["dtype"])
            if array.dtype != dtype:
                if dtype.type.__module__ == "numpy" or array.dtype != raw_storage.get(
                    dtype.itemsize
                ):
                    raise ArtifactFormatError(
                        f"Weight '{spec['name']}' is stored as {array.dtype.name} in {path.name}, "
                        f"but the manifest says {dtype.name}: the artifact is inconsistent "
                        "(torchlax-export never reinterprets one as the other)."
                    )
                array = array.view(dtype)  # bfloat16/float8, stored as raw bytes
            if list(array.shape) != list(spec["shape"]):
                raise ArtifactFormatError(
                    f"Weight '{spec['name']}' in {path.name} has shape {list(array.shape)}, but "
                    f"the manifest says {spec['shape']}: the artifact is inconsistent."
                )
            weights[spec["name"]] = array
    return weights
