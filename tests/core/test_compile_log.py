"""What torchlax says about tracing and compiling: TORCH_LOGS, recompile reasons, progress."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import threading

import fresh_python
import jax
import jax.numpy as jnp
import pytest
import torch
import torchlax
from torchlax_core import _compile_log

_SCRIPT = (
    "import torch, torchlax\n"
    "with torchlax.enable():\n"
    "    f = torchlax.jit(lambda x: x * 2)\n"
    "    f(torch.ones(3, device='jax'))\n"
    "    f(torch.ones(4, device='jax'))\n"
)


def _run(torch_logs: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHLAX_LOG", "TORCH_LOGS")}
    env["TORCH_LOGS"] = torch_logs
    env["TORCHLAX_COMPILE_PROGRESS"] = "off"
    if "torchlax" in torch_logs:
        # torch imports the module a setting names while it is imported itself (to find the
        # module's loggers): a fresh_python server (which imports torch) would start JAX.
        done = subprocess.run(
            [sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=300
        )
    else:
        done = fresh_python.run(["-c", _SCRIPT], env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


@pytest.mark.slow
def test_torch_logs_recompiles_says_which_input_changed():
    stderr = _run("recompiles")
    assert "torchlax recompiling torchlax.jit(<lambda>): input 0: float32[3] -> float32[4]" in (
        stderr
    )
    assert "XLA compiled" not in stderr  # only the artifact asked for


@pytest.mark.slow
def test_torch_logs_torchlax_shows_traces_and_compiles():
    stderr = _run("torchlax")
    assert "traced torchlax.jit(<lambda>) in" in stderr
    assert "traced torchlax.jit(<lambda>) again (signature 2)" in stderr
    # (The test run's shared persistent cache may hold what another test compiled.)
    compiled = stderr.count("XLA compiled torchlax.jit(<lambda>) in")
    loaded = stderr.count("loaded torchlax.jit(<lambda>) from the persistent compilation cache")
    assert compiled + loaded == 2, stderr
    assert "plugin 'ops' loaded" in stderr


def test_traces_and_compiles_are_logged_with_the_reason(caplog):
    with caplog.at_level(logging.INFO, logger="torchlax"), torchlax.enable():
        f = torchlax.jit(lambda x, y: x + y)
        f(torch.ones(2, 3, device="jax"), torch.ones(3, device="jax"))
        f(torch.ones(2, 3, device="jax"), torch.ones(3, device="jax"))
        f(torch.ones(2, 3, device="jax"), torch.ones(1, 3, device="jax"))
    messages = [r.getMessage() for r in caplog.records if r.name == "torchlax"]
    traces = [m for m in messages if m.startswith("traced torchlax.jit")]
    assert len(traces) == 2, messages
    assert traces[1].endswith("input 1: float32[3] -> float32[1,3]"), traces
    compiles = [m for m in messages if m.startswith("XLA compiled torchlax.jit")]
    assert len(compiles) == 2 or any("persistent compilation cache" in m for m in messages)


def test_signature_change_names_each_changed_input():
    a = jax.ShapeDtypeStruct((2,), jnp.float32)
    b = jax.ShapeDtypeStruct((3,), jnp.float32)
    c = jax.ShapeDtypeStruct((2,), jnp.int32)
    assert _compile_log.signature_change((a, a), (a, b)) == "input 1: float32[2] -> float32[3]"
    assert _compile_log.signature_change((a,), (a, c)) == (
        "the number of array inputs changed from 1 to 2"
    )
    assert "static part" in _compile_log.signature_change((a,), (a,))
    many = _compile_log.signature_change((a,) * 10, (b,) * 10)
    assert many.endswith("and 2 more")


class _Terminal(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty
        self.written = threading.Event()

    def isatty(self) -> bool:
        return self.tty

    def write(self, s: str) -> int:
        self.written.set()
        return super().write(s)


def test_progress_line_on_a_terminal_while_a_compilation_runs():
    stream = _Terminal(tty=True)
    with _compile_log.compiling("slow program", stream=stream, progress_after=0.0):
        # The compilation stands in for one that runs until the line has shown.
        assert stream.written.wait(60)
    text = stream.getvalue()
    assert text.startswith("\r[torchlax] compiling slow program ... ")
    assert "\r[torchlax] compiled slow program in " in text and text.endswith("\n")


def test_no_progress_line_off_a_terminal_or_when_turned_off():
    for stream, after in ((_Terminal(tty=False), 0.0), (_Terminal(tty=True), None)):
        with _compile_log.compiling("program", stream=stream, progress_after=after):
            pass
        assert stream.getvalue() == ""
    assert _compile_log._progress_after("off") is None
    assert _compile_log._progress_after("2.5") == 2.5
    assert _compile_log._progress_after("") == 5.0


def test_graph_break_is_logged(caplog):
    with caplog.at_level(logging.INFO, logger="torchlax"):
        _compile_log.graph_break("graph_0", "aten.foo has no lowering")
    assert "graph_0 runs eagerly: aten.foo has no lowering" in caplog.text
