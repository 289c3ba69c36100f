"""JAX's persistent compilation cache: on by default in torchlax's directory, never over the
user's own JAX configuration; a second process running the same step compiles nothing."""

from __future__ import annotations

import json
import os

import fresh_python
import pytest
from torchlax_core import _compilation_cache

# A training step under torchlax.jit; prints how many XLA compilations the process ran and
# how many of them JAX's persistent cache served (jax.monitoring's public events).
_STEP = r"""
import json, jax.monitoring
events = {"compiles": 0, "hits": 0}
def count(event, duration=None, **_):
    if event == "/jax/core/compile/backend_compile_duration":
        events["compiles"] += 1
def hit(event, **_):
    if event == "/jax/compilation_cache/cache_hits":
        events["hits"] += 1
jax.monitoring.register_event_duration_secs_listener(count)
jax.monitoring.register_event_listener(hit)

import torch, torchlax
torch.manual_seed(0)
with torchlax.enable():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    model = model.to("jax")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    def step(x, y):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss
    step = torchlax.jit(step)
    x, y = torch.randn(4, 8, device="jax"), torch.randn(4, 1, device="jax")
    losses = [float(step(x, y)) for _ in range(3)]
print(json.dumps({"dir": torchlax.compilation_cache_dir(), "losses": losses, **events}))
"""


_IMPORT = r"""
import json, jax.numpy as jnp, torchlax
jnp.ones(3) + 1
print(json.dumps({"dir": torchlax.compilation_cache_dir()}))
"""


def _run(tmp_path, script: str = _STEP, **settings: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    env.pop("TORCHLAX_COMPILATION_CACHE", None)
    env.update(settings)
    done = fresh_python.run(["-c", script], env=env, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_second_process_running_the_same_step_compiles_nothing(tmp_path):
    cache = tmp_path / "cache"
    first = _run(tmp_path, XDG_CACHE_HOME=str(cache))
    assert first["dir"] == str(cache / "torchlax" / "xla")
    assert first["compiles"] > first["hits"]  # (a program compiled twice is a hit there)
    assert _compilation_cache.entries(first["dir"])
    second = _run(tmp_path, XDG_CACHE_HOME=str(cache))
    assert second["losses"] == first["losses"]
    assert second["compiles"] == second["hits"] > 0  # every compilation was a load

    files, size = _compilation_cache.clear_compilation_cache(first["dir"])
    assert files > 0 and size > 0 and not _compilation_cache.entries(first["dir"])


@pytest.mark.slow
def test_the_setting_moves_or_turns_it_off_and_jax_config_comes_first(tmp_path):
    moved = tmp_path / "elsewhere"
    assert _run(tmp_path, _IMPORT, TORCHLAX_COMPILATION_CACHE=str(moved))["dir"] == str(moved)
    assert _compilation_cache.entries(moved)
    xdg = str(tmp_path)
    off = _run(tmp_path, _IMPORT, TORCHLAX_COMPILATION_CACHE="off", XDG_CACHE_HOME=xdg)
    assert off["dir"] is None and not (tmp_path / "torchlax").exists()
    mine = tmp_path / "mine"
    theirs = _run(tmp_path, _IMPORT, JAX_COMPILATION_CACHE_DIR=str(mine), XDG_CACHE_HOME=xdg)
    assert theirs["dir"] == str(mine) and not (tmp_path / "torchlax").exists()
    disabled = _run(tmp_path, _IMPORT, JAX_ENABLE_COMPILATION_CACHE="false", XDG_CACHE_HOME=xdg)
    assert disabled["dir"] is None and not (tmp_path / "torchlax").exists()


def test_directory_follows_the_settings(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHLAX_COMPILATION_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert _compilation_cache.directory() == tmp_path / "torchlax" / "xla"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert _compilation_cache.directory() == tmp_path / "home" / ".cache" / "torchlax" / "xla"
    for off in ("off", "0", "false", "OFF"):
        assert _compilation_cache.directory(off) is None
    assert _compilation_cache.directory("~/x") == tmp_path / "home" / "x"


def test_clear_removes_only_cache_entries(tmp_path):
    (tmp_path / "jit_f-abc-cache").write_bytes(b"12345")
    (tmp_path / "jit_f-abc-atime").write_bytes(b"1")
    (tmp_path / "notes.txt").write_text("mine")
    assert _compilation_cache.clear_compilation_cache(tmp_path) == (2, 6)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
    assert _compilation_cache.clear_compilation_cache(tmp_path / "missing") == (0, 0)


def test_the_test_suite_keeps_its_own_cache():
    # conftest.py set the run's directory before JAX started: torchlax left it in place.
    assert os.environ.get("JAX_COMPILATION_CACHE_DIR")
    assert _compilation_cache.compilation_cache_dir() == os.environ["JAX_COMPILATION_CACHE_DIR"]
    assert _compilation_cache.enable() is None


def test_python_m_torchlax_cache_shows_and_clears(monkeypatch, tmp_path, capsys):
    from torchlax._doctor import main

    monkeypatch.setenv("TORCHLAX_COMPILATION_CACHE", str(tmp_path))
    (tmp_path / "jit_f-abc-cache").write_bytes(b"x" * 2048)
    assert main(["cache"]) == 0
    shown = capsys.readouterr().out
    assert f"torchlax's compilation cache: {tmp_path}" in shown and "1 entries" in shown
    assert main(["cache", "clear"]) == 0
    assert "removed 1 compilation cache entries" in capsys.readouterr().out
    assert not list(tmp_path.iterdir())
    assert main(["cache", "wipe"]) == 2
    assert "usage: python -m torchlax doctor | cache [clear]" in capsys.readouterr().err
