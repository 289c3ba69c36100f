"""Every ```python block of README.md and docs/*.md runs as written.

The blocks of one file run in order in one fresh Python process (as a reader pastes them into
one session: a later block may use what an earlier one defined), in an empty working
directory. A block that cannot run here is marked on the line before it with
``<!-- no-run: the reason -->``; keep such blocks rare.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import fresh_python
import pytest

ROOT = Path(__file__).resolve().parents[2]
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(\S*)(.*)$")
_NO_RUN = re.compile(r"^<!--\s*no-run:(.*?)-->\s*$")
# docs/distributed.md shows meshes of 8 devices: its blocks run on 8 simulated CPU devices, the
# set-up that page describes for testing without a cluster.
_DEVICES = {"distributed.md": 8}


def python_blocks(path: Path) -> list[tuple[int, str, str | None]]:
    """``(line, code, no_run_reason)`` for each ```python block of ``path``."""
    blocks, lines = [], path.read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        start, language = i, fence.group(1)
        i += 1
        body = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        if language != "python":
            continue
        previous = lines[start - 1] if start > 0 else ""
        marker = _NO_RUN.match(previous.strip())
        blocks.append(
            (start + 1, "\n".join(body) + "\n", marker.group(1).strip() if marker else None)
        )
    return blocks


def test_every_no_run_marker_gives_a_reason():
    for path in FILES:
        for line, _, reason in python_blocks(path):
            assert reason is None or len(reason) > 10, f"{path.name}:{line}: say why it cannot run"


@pytest.mark.slow
@pytest.mark.parametrize(
    "path", [p for p in FILES if python_blocks(p)], ids=lambda p: p.relative_to(ROOT).as_posix()
)
def test_code_blocks_run(path, tmp_path):
    script = []
    for line, code, reason in python_blocks(path):
        if reason is None:
            script.append(f"# --- {path.name}:{line}\n{code}")
    if not script:
        pytest.skip("every block is marked no-run")
    env = dict(os.environ)
    if path.name in _DEVICES:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={_DEVICES[path.name]}"
        env["JAX_PLATFORMS"] = "cpu"
    out = fresh_python.run(["-c", "\n".join(script)], timeout=900, cwd=tmp_path, env=env)
    assert out.returncode == 0, (
        f"a code block of {path.relative_to(ROOT)} failed (the '# --- file:line' comment "
        f"before the failing code says which):\n{out.stderr[-5000:]}"
    )
