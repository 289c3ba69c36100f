"""Every torchlax exception derives from ``TorchlaxError`` and keeps its built-in base.

``TorchlaxError`` lives torch-free (``_torchlax_errors``) so that torchlax-export's loading errors
share it on a machine where torch cannot be imported.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
import torchlax
import torchlax_core
import torchlax_export

PACKAGES = (
    "torchlax_core",
    "torchlax_ops",
    "torchlax_interop",
    "torchlax_dynamo",
    "torchlax_export",
    "torchlax",
)

# The built-in base each exception keeps (what PyTorch raises in its place, or raised before).
BUILTIN_BASES = {
    "TorchlaxError": (Exception,),
    "OpNotLoweredError": (NotImplementedError,),
    "UnsupportedDtypeError": (TypeError,),
    "DtypeNotImplementedError": (NotImplementedError,),
    "DeviceMismatchError": (RuntimeError,),
    "PluginError": (RuntimeError,),
    "PluginConflictError": (RuntimeError,),
    # A compiled program that failed while it ran; out of memory as CUDA's OOM in PyTorch.
    "ProgramFailedError": (RuntimeError,),
    "ProgramOutOfMemoryError": (RuntimeError, torch.OutOfMemoryError),
    "JitError": (RuntimeError,),
    "JitArgumentError": (RuntimeError, TypeError),
    "SharedMemoryWriteError": (RuntimeError,),
    "InteropArgumentError": (TypeError,),
    "ObjectPytreeError": (TypeError,),
    "CheckpointError": (RuntimeError,),
    "DataDependentShapeError": (RuntimeError,),
    "ExportError": (RuntimeError,),
    "UnsupportedOpError": (RuntimeError, NotImplementedError),
    "ArtifactError": (ValueError,),
    "ArtifactFormatError": (ValueError,),
    "InputMismatchError": (ValueError, TypeError),
}

# Control-flow signals caught inside torchlax, never raised to a caller.
INTERNAL_SIGNALS = {
    "NotCacheable",
    "_Unverifiable",
    "_ShapeUnknown",
    "_ForeignTensor",
    "CpuStateError",  # torchlax.jit: switch to the CPU-state path, caught in _Jitted.__call__
    # torchlax.jit: a traced step's backward() toward a plain CPU tensor, stopped before it
    # runs; the trace replaces it with an error naming the tensor (_refused_backward_error)
    "RefusedBackward",
}


def _exception_classes() -> dict[str, type]:
    # Read every module's source and import only those defining a class that derives from an
    # exception (named ...Error/Exception/Warning, or from a class found so), which is fast.
    sources = {}
    for package_name in PACKAGES:  # found, not imported: importing all of them takes seconds
        root = Path(importlib.util.find_spec(package_name).origin).parent
        for path in root.rglob("*.py"):
            parts = (package_name, *path.relative_to(root).with_suffix("").parts)
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            sources[name] = ast.parse(path.read_text())
    exception_names = {"Exception", "BaseException"}
    modules: set[str] = set()
    while True:
        before = (len(exception_names), len(modules))
        for module_name, tree in sources.items():
            for node in ast.walk(tree):
                bases = {ast.unparse(b).split(".")[-1] for b in getattr(node, "bases", ())}
                if isinstance(node, ast.ClassDef) and any(
                    b in exception_names or b.endswith(("Error", "Exception", "Warning"))
                    for b in bases
                ):
                    exception_names.add(node.name)
                    modules.add(module_name)
        if (len(exception_names), len(modules)) == before:
            break
    found = {}
    for module_name in sorted(modules) + ["_torchlax_errors"]:
        for name, value in vars(importlib.import_module(module_name)).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and (value.__module__ == module_name)
            ):
                found[name] = value
    return found


def test_every_torchlax_exception_is_a_torchlax_error_and_keeps_its_builtin_base():
    classes = _exception_classes()
    assert INTERNAL_SIGNALS <= set(classes), "an internal signal was renamed: update the list"
    public = {name: cls for name, cls in classes.items() if name not in INTERNAL_SIGNALS}
    assert set(public) == set(BUILTIN_BASES), "a new exception: give it its built-in base here"
    for name, cls in public.items():
        assert issubclass(cls, torchlax.TorchlaxError), name
        for base in BUILTIN_BASES[name]:
            assert issubclass(cls, base), (name, base)


def test_one_base_class_everywhere():
    assert torchlax.TorchlaxError is torchlax_core.TorchlaxError is torchlax_export.TorchlaxError
    try:
        raise torchlax_export.ArtifactFormatError("bad artifact")
    except torchlax.TorchlaxError as caught:
        assert isinstance(caught, ValueError)


_WITHOUT_TORCH = """
    import sys
    sys.modules["torch"] = None
    sys.modules["torchlax_core"] = None
    {block}
    import torchlax_export
    from torchlax_export import ArtifactError, InputMismatchError, TorchlaxError
    assert issubclass(ArtifactError, TorchlaxError) and issubclass(InputMismatchError, TypeError)
    print(TorchlaxError.__module__)
"""


def test_export_errors_share_the_base_without_torch_and_without_torchlax_core():
    # With torchlax-core installed the base is the shared one; with torchlax-export alone (the
    # shared module missing) export defines its own, and its errors are still TorchlaxErrors.
    modules = []
    for block in ("", 'sys.modules["_torchlax_errors"] = None'):
        code = textwrap.dedent(_WITHOUT_TORCH.format(block=block))
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-2000:]
        modules.append(done.stdout.strip())
    assert modules == ["_torchlax_errors", "torchlax_export._errors"]
