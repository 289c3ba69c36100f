"""What a user installs: the packages' dependencies hold no development tool."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement.strip(), maxsplit=1)[0].lower()


# Extras whose library the dev group installs too, for their tests.
_USER_EXTRAS = {"checkpoint": ("orbax-checkpoint",)}


def test_no_development_tool_is_a_dependency_of_a_package():
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())
    dev = {_name(r) for r in root["dependency-groups"]["dev"]}
    dev = {n for n in dev if not n.startswith("torchlax")}
    assert {"pytest", "ruff", "basedpyright", "transformers"} <= dev
    found = []
    for path in sorted((ROOT / "packages").glob("*/pyproject.toml")):
        project = tomllib.loads(path.read_text())["project"]
        requirements = list(project.get("dependencies", []))
        for name, extra in project.get("optional-dependencies", {}).items():
            # (an extra that exists for users, as `checkpoint` for orbax-checkpoint, is also in
            # the dev group so that its tests run: that library is no development tool)
            requirements += [r for r in extra if _name(r) not in _USER_EXTRAS.get(name, ())]
        found += [f"{path.parent.name}: {r}" for r in requirements if _name(r) in dev]
    assert not found, f"development tools in what users install: {found}"
