"""Every private JAX API torchlax uses is listed (docs/architecture.md, "Private JAX APIs") and
still where torchlax looks for it: a JAX upgrade that moves one fails here, by name, instead of
torchlax silently taking a slower fallback path (or failing at import)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import jax
import pytest

ROOT = Path(__file__).resolve().parents[2]

# Dotted path -> the files that use it. Keep in step with docs/architecture.md.
_CORE = "core/src/torchlax_core/"
PRIVATE = {
    "jax._src.config.enable_x64": [_CORE + "_x64.py"],
    "jax._src.core.ShapedArray": [_CORE + "_host_put.py"],
    "jax._src.interpreters.pxla.get_default_device": [_CORE + "_host_put.py"],
    "jax._src.lib.xla_client.batched_device_put": [_CORE + "_host_put.py"],
    "jax._src.array.ArrayImpl": [_CORE + "_opcache.py"],
    "jax._src.core.trace_ctx": [_CORE + "_program.py"],
    "jax._src.core.EvalTrace": [_CORE + "_program.py"],
    "jax._src.xla_bridge.backends_are_initialized": [_CORE + "_privateuse1.py"],
    "jax._src.lib._jax.dlpack_managed_tensor_to_buffer": ["dynamo/src/torchlax_dynamo/_dlpack.py"],
    "jax._src.lib._jax.buffer_to_dlpack_managed_tensor": ["dynamo/src/torchlax_dynamo/_dlpack.py"],
    "jax._src.lib.jaxlib_extension_version": ["dynamo/src/torchlax_dynamo/_dlpack.py"],
    "jax._src.interpreters.mlir.make_ir_context": ["export/src/torchlax_export/_artifact.py"],
    "jax._src.lib.mlir.ir": ["export/src/torchlax_export/_artifact.py"],
    "jax._src.interpreters.partial_eval.DynamicJaxprTracer": ["ops/src/torchlax_ops/_recompute.py"],
}


def _resolve(path: str):
    """``path``'s object: the longest importable module prefix, then attributes."""
    parts = path.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            found = getattr(found, name)
        return found
    raise ImportError(path)


@pytest.mark.parametrize("path", sorted(PRIVATE))
def test_each_private_jax_api_is_still_there(path):
    try:
        found = _resolve(path)
    except (ImportError, AttributeError) as exc:
        pytest.fail(
            f"jax {jax.__version__} moved {path} ({exc!r}), which "
            f"{', '.join(PRIVATE[path])} use(s): switch to the public alternative "
            "docs/architecture.md lists for it, or find where this JAX keeps it."
        )
    assert found is not None


def test_compiled_keeps_its_cpp_launcher():
    # ``jax.stages.Compiled._call`` (private attribute): the op cache and compiled programs
    # launch through it (_opcache.cpp_launcher); without it every launch takes the slower path.
    from torchlax_core._opcache import cpp_launcher

    compiled = jax.jit(lambda x: x + 1).lower(jax.numpy.ones(2)).compile()
    compiled(jax.numpy.ones(2))
    assert callable(cpp_launcher(compiled)), (
        f"jax {jax.__version__}: jax.stages.Compiled no longer keeps its C++ launcher as "
        "_call; see docs/architecture.md, 'Private JAX APIs'."
    )


def test_every_use_of_jax_src_is_listed():
    unlisted = []
    for path in sorted((ROOT / "packages").glob("*/src/**/*.py")):
        where = path.relative_to(ROOT / "packages").as_posix()
        for module, names in re.findall(
            r"from (jax\._src[\w.]*) import ([^\n#]+)", path.read_text()
        ):
            for name in names.replace("(", "").replace(")", "").split(","):
                used = f"{module}.{name.split(' as ')[0].strip()}"
                listed = [p for p in PRIVATE if p == used or p.startswith(used + ".")]
                if not any(where in PRIVATE[p] for p in listed):
                    unlisted.append(f"{used} in {where}")
    assert not unlisted, (
        "private JAX APIs used but not listed in this test and docs/architecture.md: "
        + "; ".join(unlisted)
    )
    docs = (ROOT / "docs" / "architecture.md").read_text()
    for path in PRIVATE:
        assert f"`{path}`" in docs, f"{path} is missing from docs/architecture.md's list"
