"""Fixtures shared by the core's tests."""

from __future__ import annotations

import pytest
import torchlax_core


@pytest.fixture
def env():
    """A fresh environment, current, with an op cache that compiles a signature on its second
    call (the tests count hits and misses from there). Fresh, not the default one: what the
    process ran before (another module's tests in the same worker) must not decide what these
    tests see (signatures already compiled or refused, which change the counts).
    Modules that need another environment define their own ``env`` fixture, which takes
    precedence."""
    env = torchlax_core.Environment()
    env.config.op_cache_size, env.config.op_cache_min_calls = 4096, 2
    with torchlax_core.enable(env):
        yield env
