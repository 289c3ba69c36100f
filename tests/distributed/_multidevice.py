"""The distributed tests run their bodies in fresh Python processes: this starts them.

The parent test process keeps one XLA host device; a body runs with
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` so JAX sees N simulated CPU devices.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import fresh_python

HERE = Path(__file__).resolve().parent

PRELUDE = f"""
import sys
sys.path.insert(0, {str(HERE)!r})
import jax
import numpy as np
import torch
import torchlax_core
from jax.sharding import NamedSharding, PartitionSpec as P
import torchlax_interop.distributed as D
"""


def device_env(devices: int = 8) -> dict[str, str]:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["JAX_PLATFORMS"] = "cpu"
    env.setdefault("TORCHLAX_BLOCK_PLUGINS", "example")
    return env


def run_on_devices(*parts: str, devices: int = 8, timeout: float = 600) -> str:
    """Run the code ``parts`` (each dedented, after ``PRELUDE``) with ``devices`` simulated CPU
    devices; return the child's stdout.

    Fails the test with the child's output if it exits non-zero.
    """
    code = (
        PRELUDE
        + f"assert len(jax.devices()) == {devices}, jax.devices()\n"
        + "".join(textwrap.dedent(p) for p in parts)
    )
    proc = fresh_python.run(["-c", code], env=device_env(devices), timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(
            f"subprocess failed (exit {proc.returncode})\n--- stdout\n{proc.stdout}\n"
            f"--- stderr\n{proc.stderr[-6000:]}"
        )
    return proc.stdout
