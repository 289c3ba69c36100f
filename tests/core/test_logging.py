"""torchlax's logger: silent by default, TORCHLAX_LOG turns on a stderr handler."""

import logging
import os

import fresh_python
import pytest
import torchlax_core
from torchlax_core import _logging

_SCRIPT = (
    "import torch, torchlax_core\n"
    "env = torchlax_core.Environment()\n"
    "with torchlax_core.enable(env):\n"
    "    torch.ones(2, device='jax')\n"
)


def _run(log_value):
    env = dict(os.environ)
    env.pop("TORCHLAX_LOG", None)
    if log_value is not None:
        env["TORCHLAX_LOG"] = log_value
    done = fresh_python.run(["-c", _SCRIPT], env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_logger_is_the_torchlax_logger_with_a_null_handler():
    assert torchlax_core.logger is logging.getLogger("torchlax")
    assert any(isinstance(h, logging.NullHandler) for h in torchlax_core.logger.handlers)
    assert _logging.get_logger("dynamo").name == "torchlax.dynamo"


@pytest.mark.slow
def test_silent_by_default_and_on_with_torchlax_log():
    assert "[torchlax" not in _run(None).stderr
    stderr = _run("info").stderr
    assert "[torchlax.plugins INFO] plugin 'torchlax.device' loaded" in stderr


def test_configure_from_env_sets_level_and_replaces_its_handler():
    before_level, before = torchlax_core.logger.level, list(torchlax_core.logger.handlers)
    try:
        first = _logging.configure_from_env("debug")
        second = _logging.configure_from_env("info")
        ours = [h for h in torchlax_core.logger.handlers if h.get_name() == "torchlax-env"]
        assert ours == [second] and first is not second
        assert torchlax_core.logger.level == logging.INFO
        assert _logging.configure_from_env("") is None
        with pytest.warns(RuntimeWarning, match="TORCHLAX_LOG='loud' is not a logging level"):
            assert _logging.configure_from_env("loud") is None
    finally:
        for h in list(torchlax_core.logger.handlers):
            if h not in before:
                torchlax_core.logger.removeHandler(h)
        torchlax_core.logger.setLevel(before_level)


def test_plugin_loading_is_logged(caplog):
    with caplog.at_level(logging.INFO, logger="torchlax"):
        torchlax_core.Environment()
    assert any("plugin 'torchlax.device' loaded" in r.getMessage() for r in caplog.records)
