"""TPU tests: one process holds the chip (run with ``-n 0``); Dynamo starts fresh per test."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
