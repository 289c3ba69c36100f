"""Helpers of the export tests: run a saved artifact in a Python where torch cannot import."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

# Runs in a fresh interpreter: `import torch` (and torchlax_core, which needs torch) raise
# ImportError there, so loading and calling must get by with jax and numpy.
_TORCH_FREE = textwrap.dedent(
    """
    import sys
    sys.modules["torch"] = None
    sys.modules["torchlax_core"] = None
    import numpy as np
    from torchlax_export import load

    program = load(sys.argv[1])
    data = np.load(sys.argv[2])
    sets = sorted({k.split("_")[0] for k in data.files})

    def flatten(tree):
        if isinstance(tree, dict):
            return [leaf for v in tree.values() for leaf in flatten(v)]
        if isinstance(tree, (list, tuple)):
            return [leaf for v in tree for leaf in flatten(v)]
        return [tree]

    result = {}
    for s in sets:
        n = len([k for k in data.files if k.startswith(s + "_")])
        outputs = program(*[data[f"{s}_in{i}"] for i in range(n)])
        for i, leaf in enumerate(flatten(outputs)):
            result[f"{s}_out{i}"] = np.asarray(leaf)
    for name, value in program.weights.items():
        result["weight:" + name] = np.asarray(value)
    leaked = [m for m in ("torch", "torchlax_core") if sys.modules.get(m) is not None]
    assert not leaked, leaked
    np.savez(sys.argv[3], **result)
    """
)


def flatten(tree) -> list:
    if isinstance(tree, dict):
        return [leaf for v in tree.values() for leaf in flatten(v)]
    if isinstance(tree, list | tuple):
        return [leaf for v in tree for leaf in flatten(v)]
    return [tree]


@pytest.fixture
def run_without_torch(tmp_path):
    """``run(artifact_dir, [inputs_call0, inputs_call1, ...]) -> (outputs per call, weights)``.

    Calls the artifact once per input list, in order, in a subprocess where torch is absent.
    """

    def run(artifact_dir: Path, calls: list[list[np.ndarray]]):
        inputs = tmp_path / "inputs.npz"
        outputs = tmp_path / "outputs.npz"
        np.savez(
            inputs,
            **{
                f"c{c:03d}_in{i}": np.asarray(x)
                for c, xs in enumerate(calls)
                for i, x in enumerate(xs)
            },
        )
        env = dict(os.environ, JAX_PLATFORMS="cpu")
        proc = subprocess.run(
            [sys.executable, "-c", _TORCH_FREE, str(artifact_dir), str(inputs), str(outputs)],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        with np.load(outputs) as data:
            per_call = [
                [
                    data[f"c{c:03d}_out{i}"]
                    for i in range(len([k for k in data.files if k.startswith(f"c{c:03d}_out")]))
                ]
                for c in range(len(calls))
            ]
            weights = {k[len("weight:") :]: data[k] for k in data.files if k.startswith("weight:")}
        return per_call, weights

    return run


def assert_matches(got, want, *, rtol=1e-5, atol=1e-5) -> None:
    """``got`` (arrays) equals eager PyTorch's ``want`` in shape, dtype and value."""
    import torch
    import torchlax_core

    got, want = flatten(got), flatten(want)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        w = w.detach() if isinstance(w, torch.Tensor) else torch.as_tensor(w)
        g = np.asarray(g)
        assert g.dtype == np.dtype(torchlax_core.jax_dtype(w.dtype)), (g.dtype, w.dtype)
        assert tuple(g.shape) == tuple(w.shape)
        np.testing.assert_allclose(g.astype(np.float64), w.double().numpy(), rtol=rtol, atol=atol)
