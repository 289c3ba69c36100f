"""Every example runs as a newcomer would run it: `uv run python examples/<name>.py`."""

from __future__ import annotations

import os
from pathlib import Path

import fresh_python
import pytest

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.py"))


@pytest.mark.slow
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs(path):
    env = {**os.environ, "TORCHLAX_BLOCK_PLUGINS": ""}  # as a user, with the example plugin
    out = fresh_python.run([str(path)], timeout=900, env=env, cwd=path.parents[1])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    assert out.stdout.strip(), "an example should say what it showed"
