"""Fixtures for the torch.compile backend tests."""

import pytest
import torch
import torchlax_dynamo


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch and sees only its own counts."""
    torch._dynamo.reset()
    torchlax_dynamo.counters.clear()
    yield
    torch._dynamo.reset()
