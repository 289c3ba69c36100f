"""Fixtures shared by the core's tests."""

from __future__ import annotations

import pytest
import torchlax_core


@pytest.fixture
def env():
    """The default environment, current, with an op cache that compiles a signature on its
    second call (the tests count hits and misses from there). Modules that need another
    environment define their own ``env`` fixture, which takes precedence."""
    env = torchlax_core.default_env()
    saved = (env.config.op_cache_size, env.config.op_cache_min_calls)
    env.config.op_cache_size, env.config.op_cache_min_calls = 4096, 2
    with torchlax_core.enable(env):
        yield env
    env.config.op_cache_size, env.config.op_cache_min_calls = saved
