"""Two local processes train one data-parallel step; it equals one process on the whole batch."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

# Each test starts fresh Python processes (8 simulated devices): seconds, not milliseconds.
pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "multiprocess_data_parallel.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _reference():
    sys.path.insert(0, str(EXAMPLE.parent))
    try:
        import multiprocess_data_parallel as example
    finally:
        sys.path.pop(0)
    return example.reference_step()


def test_two_processes_equal_one_process(tmp_path):
    port = _free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)  # one CPU device per process: the mesh spans both processes
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(EXAMPLE),
                "--num-processes",
                "2",
                "--process-id",
                str(i),
                "--coordinator",
                f"127.0.0.1:{port}",
                "--output",
                str(tmp_path / f"{i}.json"),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    outputs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=600)
            outputs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out[-6000:]

    reference = _reference()
    for i in range(2):
        result = json.loads((tmp_path / f"{i}.json").read_text())
        assert result["devices"] == 2 and result["local_devices"] == 1
        np.testing.assert_allclose(result["loss"], reference["loss"], rtol=1e-6)
        for name, expected in reference["params"].items():
            np.testing.assert_allclose(
                result["params"][name],
                expected,
                rtol=1e-5,
                atol=1e-6,
                err_msg=f"process {i}: {name}",
            )
