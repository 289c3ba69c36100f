"""The tests' fresh processes (tests/fresh_python.py) behave as new interpreters do."""

from __future__ import annotations

import os
import subprocess
import sys

import fresh_python
import pytest


def test_a_child_starts_with_nothing_of_torchlax_and_no_jax_backend(tmp_path):
    code = (
        "import os, sys\n"
        "from jax._src import xla_bridge\n"
        "print(sorted(m for m in sys.modules if m.startswith('torchlax')))\n"
        "print(len(xla_bridge._backends), sys.argv, os.getcwd(), os.environ['TORCHLAX_PROBE'])\n"
    )
    env = {**os.environ, "TORCHLAX_PROBE": "seen"}
    done = fresh_python.run(["-c", code, "an-arg"], env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[]", f"0 ['-c', 'an-arg'] {tmp_path} seen"]
    # What the child imported is its own: the next child starts without it.
    done = fresh_python.run(["-c", "import sys, torchlax_core; print('ok')"])
    again = fresh_python.run(["-c", "import sys; print('torchlax_core' in sys.modules)"])
    assert (done.stdout, again.stdout) == ("ok\n", "False\n")


def test_exit_status_errors_and_timeout_as_subprocess_reports_them():
    failed = fresh_python.run(["-c", "import sys; print('out'); sys.exit(3)"])
    assert (failed.returncode, failed.stdout) == (3, "out\n")
    raised = fresh_python.run(["-c", "raise ValueError('a full sentence')"])
    assert raised.returncode == 1
    assert "ValueError: a full sentence" in raised.stderr
    assert raised.stderr.startswith("Traceback (most recent call last):")
    with pytest.raises(subprocess.TimeoutExpired):
        fresh_python.run(["-c", "import time; time.sleep(60)"], timeout=1)
    assert fresh_python.run(["-c", "print('still serving')"]).stdout == "still serving\n"


def test_a_script_runs_as_main_with_its_directory_on_the_path(tmp_path):
    (tmp_path / "helper_mod.py").write_text("VALUE = 7\n")
    script = tmp_path / "script.py"
    script.write_text(
        "import sys, helper_mod\nif __name__ == '__main__':\n    print(helper_mod.VALUE, sys.argv[1:])\n"
    )
    done = fresh_python.run([str(script), "x"])
    assert (done.returncode, done.stdout) == (0, "7 ['x']\n"), done.stderr
    assert sys.executable in done.args


def test_calls_from_different_tests_share_one_server():
    # pytest sets PYTEST_CURRENT_TEST per test: it must not pick a new server (a new import).
    fresh_python.run(["-c", "pass"])
    servers = dict(fresh_python._servers)
    env = {**os.environ, "PYTEST_CURRENT_TEST": "another test", "TORCHLAX_LOG": "info"}
    fresh_python.run(["-c", "pass"], env=env)
    assert fresh_python._servers == servers


def test_the_least_recently_used_server_stops_past_the_limit(monkeypatch):
    """Servers past ``_MAX_SERVERS`` are stopped, least recently used first (each holds its own
    torch and JAX modules), and a call in a new environment still gets its own server."""
    fresh_python.run(["-c", "pass"])  # the suite's environment: a server, most recently used
    monkeypatch.setattr(fresh_python, "_MAX_SERVERS", len(fresh_python._servers))
    oldest = next(iter(fresh_python._servers.values()))
    before = list(fresh_python._servers.values())
    env = {**os.environ, "JAX_TORCHLAX_SERVER_PROBE": "1"}  # read by no one; a new server's key
    done = fresh_python.run(
        ["-c", "import os; print(os.environ['JAX_TORCHLAX_SERVER_PROBE'])"], env=env
    )
    assert (done.returncode, done.stdout) == (0, "1\n"), done.stderr
    assert oldest.poll() is not None  # stopped: it had finished its calls
    assert list(fresh_python._servers.values()) == [*before[1:], fresh_python._server(env)]
    fresh_python._stop(fresh_python._servers.popitem()[1])  # the probe's server serves no one else
