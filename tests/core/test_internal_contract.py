"""Sibling packages use the core only through ``torchlax_core`` and ``torchlax_core.internal``.

Every module of torchlax-ops, -interop, -dynamo, -export and the ``torchlax`` umbrella is parsed
(no import): a private core module or name imported, or a private attribute of a core object
read (``t._value()``, ``env._tables``), fails the test with its file and line. What a sibling
needs goes into ``torchlax_core.internal`` instead.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import torchlax_core.internal

_ROOT = Path(__file__).resolve().parents[2]
_CORE = _ROOT / "packages" / "core" / "src" / "torchlax_core"
_SIBLINGS = ("ops", "interop", "dynamo", "export", "torchlax")
_ALLOWED_MODULES = ("torchlax_core", "torchlax_core.internal", "torchlax_core.hookspecs")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.endswith("__")


@functools.cache
def core_private_attributes() -> frozenset[str]:
    """The private attributes the core's classes define: methods, class-level names and
    ``self._x = ...`` assignments (``Tensor._value``, ``Environment._tables``...)."""
    names = set()
    for path in _CORE.glob("*.py"):
        for cls in ast.walk(ast.parse(path.read_text())):
            if not isinstance(cls, ast.ClassDef):
                continue
            for node in ast.walk(cls):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    names.add(node.name)
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    names.add(node.target.id)
                elif isinstance(node, ast.Assign):
                    names.update(t.id for t in node.targets if isinstance(t, ast.Name))
                elif (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.ctx, ast.Store)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "self"
                ):
                    names.add(node.attr)
    return frozenset(n for n in names if _private(n))


def _root_name(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute | ast.Call | ast.Subscript):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def violations(source: str, filename: str, private_attributes: frozenset[str]) -> list[str]:
    """Where ``source`` reaches past ``torchlax_core`` and ``torchlax_core.internal``."""
    found: list[tuple[int, str]] = []

    def report(node: ast.expr | ast.stmt, what: str) -> None:
        found.append(
            (
                node.lineno,
                f"{filename}:{node.lineno}: {what}; use torchlax_core or torchlax_core.internal "
                "(add what is missing there)",
            )
        )

    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("torchlax_core.") and alias.name not in _ALLOWED_MODULES:
                    report(node, f"imports the core's private module {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            module = node.module
            if module == "torchlax_core" or module.startswith("torchlax_core."):
                if module not in _ALLOWED_MODULES:
                    report(node, f"imports from the core's private module {module}")
                else:
                    for alias in node.names:
                        if _private(alias.name):
                            report(node, f"imports the core's private name {module}.{alias.name}")
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            root = _root_name(node.value)
            if root == "torchlax_core":
                report(node, f"reads the core's private name torchlax_core.{node.attr}")
            elif node.attr in private_attributes and root not in ("self", "cls", "torch"):
                report(node, f"reads {ast.unparse(node)}, a private attribute of a core object")
    return [message for _, message in sorted(found)]


def test_sibling_packages_use_only_the_core_and_its_internal_module():
    private_attributes = core_private_attributes()
    assert {"_value", "_write", "_storage", "_view", "_tables"} <= private_attributes
    files = [
        path
        for package in _SIBLINGS
        for path in sorted((_ROOT / "packages" / package).rglob("*.py"))
        if ".venv" not in path.parts
    ]
    assert len(files) > 50  # the walk found the packages
    found = [
        line
        for path in files
        for line in violations(path.read_text(), str(path.relative_to(_ROOT)), private_attributes)
    ]
    assert not found, "\n".join(found)


def test_the_check_names_each_way_past_the_contract():
    source = "\n".join(
        [
            "import torchlax_core._tensor",
            "from torchlax_core._program import tracing",
            "from torchlax_core import _stats",
            "from torchlax_core.internal import _tensor",
            "x = torchlax_core._dtypes.DTYPES",
            "array = t._value()",
            "tables = env._tables",
            "ok = self._value, torch._C, t.jax()",
            "from torchlax_core import Tensor",
            "from torchlax_core.internal import array_of",
        ]
    )
    found = violations(source, "bad.py", core_private_attributes())
    assert [line.split(":")[1] for line in found] == ["1", "2", "3", "4", "5", "6", "7"]
    assert found[0].startswith("bad.py:1: imports the core's private module torchlax_core._tensor")
    assert "t._value" in found[5] and "env._tables" in found[6]


def test_internal_names_exist():
    for name in torchlax_core.internal.__all__:
        assert getattr(torchlax_core.internal, name, None) is not None, name
