"""Shared test configuration."""

import os

# Keep XLA to one host device here; tests that need many devices start a subprocess with
# XLA_FLAGS=--xla_force_host_platform_device_count=8 (see tests/distributed).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
