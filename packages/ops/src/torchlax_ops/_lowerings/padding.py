"""Reflection and replication padding (1-d to 3-d), with backward (the ``jax.vjp`` of ``jnp.pad``)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from .. import _aten
from .._table import lowering, named
from ._common import _vjp

aten = _aten.aten  # (an op this torch lacks: a Missing, skipped)


# -- reflection and replication padding -------------------------------------------------------------


def _pad(self, padding, mode):
    n = len(padding) // 2
    widths = [(0, 0)] * (self.ndim - n)
    widths += [(padding[2 * (n - 1 - d)], padding[2 * (n - 1 - d) + 1]) for d in range(n)]
    if mode == "edge":
        # Output element i reads input clamp(i - low, 0, size - 1): negative padding crops.
        for d, (low, high) in enumerate(widths):
            if low or high:
                size = self.shape[d]
                index = np.clip(np.arange(size + low + high) - low, 0, size - 1)
                self = jnp.take(self, jnp.asarray(index), axis=d)
        return self
    # Negative padding crops that side first (PyTorch allows it), then the rest pads.
    self = self[
        tuple(
            slice(max(-low, 0), size - max(-high, 0))
            for (low, high), size in zip(widths, self.shape, strict=True)
        )
    ]
    widths = [(max(low, 0), max(high, 0)) for low, high in widths]
    if mode == "reflect":
        for d, (low, high) in enumerate(widths):
            size = self.shape[d]
            if low >= size or high >= size:
                raise RuntimeError(
                    f"reflection_pad: padding ({low}, {high}) should be less than the input size "
                    f"{size} of dimension {d}."
                )
    return jnp.pad(self, widths, mode=mode)


def _pad_lowering(name, mode, n):
    def pad(self, padding):
        return _pad(self, padding, mode)

    def pad_backward(grad_output, self, padding):
        return _vjp(lambda x: _pad(x, padding, mode), self, grad_output)

    lowering(getattr(aten, f"{name}{n}d").default)(named(f"{name}{n}d", pad))
    backward = f"{name}{n}d_backward"
    lowering(getattr(aten, backward).default, opmath=True)(named(backward, pad_backward))


for _n in (1, 2, 3):
    _pad_lowering("reflection_pad", "reflect", _n)
    _pad_lowering("replication_pad", "edge", _n)
