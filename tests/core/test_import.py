"""``import torchlax`` loads Dynamo, export and distributed code only when they are used.

Each check runs in a fresh interpreter: the test process itself has imported everything.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# Imported by torch itself (``import torch``), so not torchlax's doing.
_TORCH_OWN = ("torch.export", "torch.distributed")


def run(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_import_torchlax_defers_dynamo_export_and_distributed():
    out = run("""
        import sys
        import torchlax
        lazy = ("torch._dynamo", "torchlax_dynamo", "torchlax_export", "torchlax.distributed",
                "torchlax_interop.distributed")
        print(sorted(m for m in lazy if m in sys.modules))
        assert callable(torchlax.call_jax) and callable(torchlax.jit)
        print(callable(torchlax.export.export), "torchlax_export" in sys.modules)
    """)
    loaded, export = out.splitlines()
    assert loaded == "[]"
    assert export == "True True"  # torchlax.export loads on first use


def test_call_jax_on_torchlax_tensors_works_without_dynamo():
    # (On CPU tensors the first call imports Dynamo anyway: PyTorch's custom-op kernels
    # wrap themselves in torch._dynamo.disable on first use.)
    out = run("""
        import sys
        import jax.numpy as jnp
        import torch
        import torchlax
        with torchlax.enable():
            x = torch.arange(4.0, device="jax")
            y = torchlax.call_jax(jnp.sin, x)
            assert torch.allclose(y.cpu(), torch.sin(torch.arange(4.0)))
        print("torch._dynamo" in sys.modules)
    """)
    assert out.strip() == "False"


@pytest.mark.slow
def test_torch_compile_finds_the_backend_without_import_torchlax():
    out = run("""
        import sys
        import torch
        def f(x):
            return torch.sin(x) * 2 + 1
        x = torch.randn(8)
        compiled = torch.compile(f, backend="torchlax")
        torch.testing.assert_close(compiled(x), f(x))
        print("torchlax" in sys.modules, "torchlax_dynamo" in sys.modules)
    """)
    assert out.strip() == "False True"


# -- the core reads bottom-up -------------------------------------------------------------------

_CORE = Path(__file__).resolve().parents[2] / "packages" / "core" / "src" / "torchlax_core"
# Imports of a higher core module from inside a function, each with its reason. Nothing else
# may import lazily: a new one would hide an import cycle from the graph below.
_LAZY_IMPORTS = {
    ("_current", "_environment"): "default_env creates the default Environment, once",
}


def _core_imports(path: Path) -> tuple[set[str], set[str]]:
    """The core modules ``path`` imports when it is imported, and those it imports lazily."""
    at_import, lazy = set(), set()

    def names(node) -> list[str]:
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                return [node.module.split(".")[0]]
            if node.level == 1:
                return [a.name for a in node.names]
            if node.module and node.module.startswith("torchlax_core."):
                return [node.module.split(".")[1]]
        if isinstance(node, ast.Import):
            return [a.name.split(".")[1] for a in node.names if a.name.startswith("torchlax_core.")]
        return []

    def visit(node, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue  # annotations only
            inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            (lazy if in_function else at_import).update(names(child))
            visit(child, inner)

    visit(ast.parse(path.read_text()), False)
    return at_import, lazy


def test_core_modules_import_each_other_without_a_cycle():
    modules = sorted(p.stem for p in _CORE.glob("*.py") if p.stem != "__init__")
    graph = {}
    for m in modules:
        at_import, lazy = _core_imports(_CORE / f"{m}.py")
        graph[m] = at_import
        for target in lazy - at_import:
            assert (m, target) in _LAZY_IMPORTS, (
                f"torchlax_core.{m} imports {target} inside a function: import it at the top "
                "(if that makes a cycle, move what both need into a lower module)"
            )
    assert graph["_x64"] == set() and graph["_current"] == {"_x64"}  # the bottom
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def walk(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph.get(m, ())):
            assert state.get(n) != 1, f"import cycle among core modules: {' -> '.join(path + [n])}"
            if n not in state:
                walk(n, path + [n])
        state[m] = 2

    for m in modules:
        if m not in state:
            walk(m, [m])


def test_each_core_module_imports_alone():
    # One fresh interpreter; before each module, every torchlax_core module is forgotten and
    # the package's __init__ (which imports them all in its own order) is replaced by an
    # empty package, so a module that leans on another being imported first fails here.
    out = run(f"""
        import importlib, sys, types
        path = {str(_CORE)!r}
        names = {sorted(p.stem for p in _CORE.glob("*.py") if p.stem != "__init__")!r}
        for name in names:
            for m in [m for m in sys.modules if m == "torchlax_core" or m.startswith("torchlax_core.")]:
                del sys.modules[m]
            package = types.ModuleType("torchlax_core")
            package.__path__ = [path]
            sys.modules["torchlax_core"] = package
            importlib.import_module("torchlax_core." + name)
        print(len(names))
    """)
    assert int(out) >= 15
