"""Configuration for the ops tests."""

import torchlax_core


def pytest_configure(config):
    # The ops tests compare against PyTorch: never let the CPU fallback answer for a lowering.
    torchlax_core.default_env().config.fallback_to_torch = False
