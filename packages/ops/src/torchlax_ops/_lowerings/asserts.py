"""Assertions on tensor values: ``torch._assert_async``.

Eagerly the value is on hand, so a false assertion raises PyTorch's ``RuntimeError`` at once
(reading it is a device-to-host sync, as PyTorch's CPU kernel is). Inside a compiled program
(``torchlax.jit``, ``torch.compile``, ``jax.jit``) XLA cannot raise: the assertion is recorded
with ``jax.experimental.checkify`` when the program is built checked (``Config(checked=True)``
or ``TORCHLAX_CHECKS=1``), which raises it after the call; otherwise it compiles to nothing.
The number of elements is known while tracing, so a tensor that is not a single value is
rejected everywhere, as PyTorch does.
"""

from __future__ import annotations

import math

from torchlax_core import check

from .. import _aten
from .._table import lowering

aten = _aten.aten  # (an op this torch lacks: a Missing, skipped)


def _assert_nonzero(self, message: str) -> None:
    size = math.prod(self.shape)
    if size != 1:
        raise RuntimeError(
            f"Boolean value of Tensor with {'no values' if size == 0 else 'more than one value'} "
            "is ambiguous"
        )
    check(self.reshape(()) != 0, RuntimeError, message.replace("{", "{{").replace("}", "}}"))


@lowering(aten._assert_async.default)
def _assert_async(self):
    _assert_nonzero(self, "Expected Tensor with single nonzero value, but got zero")


@lowering(aten._assert_async.msg)
def _assert_async_msg(self, assert_msg):
    _assert_nonzero(self, assert_msg)
