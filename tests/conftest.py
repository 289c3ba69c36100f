"""Shared test configuration."""

import os

import pytest
import xla_compilation_cache

# Keep XLA to one host device here; tests that need many devices start a subprocess with
# XLA_FLAGS=--xla_force_host_platform_device_count=8 (see tests/distributed).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# The example third-party plugin (examples/plugins/torchlax-example-plugin) is installed in the
# development environment; it overrides a built-in lowering. The suite tests the built-in
# behaviour, so the plugin is blocked here, exactly as a user would block it. Its own tests
# (tests/plugins) run it in subprocesses with the block lifted.
os.environ.setdefault("TORCHLAX_BLOCK_PLUGINS", "example")

# One persistent XLA compilation cache for the run's processes (xla_compilation_cache.py): set
# here, before JAX is imported and before pytest-xdist starts its workers, which inherit it.
_XLA_CACHE_CREATED_HERE = xla_compilation_cache.share_for_this_run()


def pytest_unconfigure(config):
    if _XLA_CACHE_CREATED_HERE is not None:
        xla_compilation_cache.remove(_XLA_CACHE_CREATED_HERE)


@pytest.fixture
def float64_default():
    """``torch.set_default_dtype(torch.float64)`` for one test (compiled optimizers' step
    counts take the default dtype: see docs/training.md)."""
    import torch

    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: unknown where it is not installed
def pytest_xdist_make_scheduler(config, log):
    """``--dist load`` (pytest-xdist's default) with each model's tests in one worker (see
    shared_compilation_scheduling.py); other ``--dist`` modes are left to pytest-xdist."""
    if config.getvalue("dist") != "load":
        return None
    from shared_compilation_scheduling import SharedCompilationScheduling

    return SharedCompilationScheduling(config, log)
