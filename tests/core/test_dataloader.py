"""DataLoader workers forked after JAX started (docs/semantics.md's recipe): CPU batches moved
to jax in the main process work, and a worker touching the jax device raises, saying what to
do instead."""

from __future__ import annotations

import os

import fresh_python
import pytest

_SCRIPT = r"""
import torch, torchlax
from torch.utils.data import DataLoader, Dataset, TensorDataset

class OnJax(Dataset):
    def __len__(self):
        return 4
    def __getitem__(self, i):
        return torch.ones(2, device="jax")

data = TensorDataset(torch.arange(64.0).reshape(32, 2))
with torchlax.enable():
    w = torch.full((2,), 2.0, device="jax")  # JAX has started: workers fork after it
    total = 0.0
    for epoch in range(2):
        for (batch,) in DataLoader(data, batch_size=8, num_workers=2):
            total += float((batch.to("jax") * w).sum())
    print("total", total)
    try:
        next(iter(DataLoader(OnJax(), batch_size=2, num_workers=1)))
    except RuntimeError as exc:
        print("worker error:", "persistent_workers=True" in str(exc))
"""


@pytest.mark.slow
def test_forked_workers_serve_cpu_batches_and_refuse_the_jax_device_warning_once():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    done = fresh_python.run(["-c", _SCRIPT], env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"total {2 * 2 * sum(range(64))}.0" in done.stdout
    assert "worker error: True" in done.stdout
    # JAX warns at each fork after it started (5 forks here: 2 epochs of 2 workers, then 1),
    # and Python shows it again after any change to the warning filters: torchlax lets the
    # first through and hides the others.
    assert done.stderr.count("os.fork() was called") == 1, done.stderr[-3000:]
