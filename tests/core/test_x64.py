"""JAX's 64-bit mode is switched in one place: ``torchlax_core._x64`` (``internal.x64``).

The helper itself (nested, thread-local, restored on errors, the process-wide switch) and a
grep over packages/*/src that fails, naming the file and line, where anything else names
JAX's flag.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
import torchlax_core.internal
from torchlax_core._x64 import set_x64_globally, x64, x64_flag

_ROOT = Path(__file__).resolve().parents[2]
_SWITCH = re.compile(r"\b(?:jax_)?(?:en|dis)able_x64\b")
# Files that may name the flag, each with its reason.
_ALLOWED = {
    "packages/core/src/torchlax_core/_x64.py": "the helper",
    "packages/export/src/torchlax_export/_artifact.py": (
        "loads and runs artifacts with jax and numpy only, without torch or torchlax-core"
    ),
}


def switches(source: str, filename: str) -> list[str]:
    return [
        f"{filename}:{number}: {line.strip()}"
        for number, line in enumerate(source.splitlines(), 1)
        if _SWITCH.search(line)
    ]


def test_only_the_helper_switches_64_bit_mode():
    files = [p for p in sorted(_ROOT.glob("packages/*/src/**/*.py")) if ".venv" not in p.parts]
    assert len(files) > 50  # the walk found the packages
    found = [
        line
        for path in files
        if (name := str(path.relative_to(_ROOT))) not in _ALLOWED
        for line in switches(path.read_text(), name)
    ]
    assert not found, (
        "switch JAX's 64-bit mode with torchlax_core.internal.x64() (core modules: ._x64):\n"
        + "\n".join(found)
    )


def test_the_grep_finds_each_spelling():
    source = "\n".join(
        [
            "with jax.enable_x64(True):",
            "from jax._src.config import enable_x64",
            "jax.config.update('jax_enable_x64', True)",
            "jax.config.jax_enable_x64",
            "with jax.experimental.disable_x64():",
            "with config.enable_x64(True):",
            "with x64():  # fine",
            "x64_flag.value",
        ]
    )
    assert [line.split(":")[1] for line in switches(source, "bad.py")] == list("123456")


def test_internal_re_exports_the_helper():
    assert torchlax_core.internal.x64 is x64
    assert torchlax_core.internal.x64_flag is x64_flag


def test_nested_blocks_restore_the_setting_before_them():
    outside = x64_flag.value
    with x64():
        assert x64_flag.value
        assert jnp.asarray(1, jnp.int64).dtype == jnp.int64  # JAX keeps 64-bit dtypes
        with x64():
            assert x64_flag.value
        assert x64_flag.value  # the inner block left the outer one's setting
        with jax.enable_x64(False):  # user code may turn it off inside
            with x64():
                assert x64_flag.value
            assert not x64_flag.value
        assert x64_flag.value
    assert x64_flag.value == outside
    with pytest.raises(RuntimeError), x64():
        raise RuntimeError("an error inside the block")
    assert x64_flag.value == outside


def test_the_mode_is_per_thread():
    # JAX keeps the setting of its context managers per thread: a block in one thread leaves
    # every other thread as it was.
    with jax.enable_x64(False):
        inside, entered, leave = [], threading.Event(), threading.Event()

        def worker():
            with x64():
                inside.append(x64_flag.value)
                entered.set()
                leave.wait(10)

        thread = threading.Thread(target=worker)
        thread.start()
        assert entered.wait(10)
        assert not x64_flag.value  # the worker's block is not this thread's
        leave.set()
        thread.join(10)
        assert inside == [True]

        with x64():
            seen = []
            other = threading.Thread(target=lambda: seen.append(x64_flag.value))
            other.start()
            other.join(10)
            assert seen == [False]  # nor this thread's block the worker's


def test_the_process_wide_switch_returns_the_default_before_it():
    before = set_x64_globally(True)
    try:
        with jax.enable_x64(False):  # a thread's own setting wins over the default
            assert not x64_flag.value
        seen = []
        other = threading.Thread(target=lambda: seen.append(x64_flag.value))
        other.start()
        other.join(10)
        assert seen == [True]
        assert set_x64_globally(False) is True
        with x64():  # a block stays on whatever the default
            assert x64_flag.value
    finally:
        set_x64_globally(before)
