"""The tensors of one repeated call's result, made ahead in batches.

A compiled call repeated in a loop (``torchlax.jit``'s repeated forward) wraps its result in
a new torchlax Tensor each time, and making that tensor (PyTorch's ``_make_wrapper_subclass``
and the allocations behind it) is most of what wrapping costs. Inside such a call it costs
three to four times what it costs in a tight loop (loaded 2-core machine: ~6 us against
~1.5): the call follows an XLA computation that left the caches cold, so each call fetches
that code and data again. Made in batches, all but the first tensor of a batch find them warm:
one call in ``BATCH`` makes the next ``BATCH`` tensors, the others take one. The first batches
are smaller (1, 2, 4, ...), so that a call repeated only a few times before something changes
(and the caller starts over with new wrappers) makes few tensors that no one takes.

A tensor made ahead is the tensor the call would make: PyTorch reads no thread state when it
makes one but inference mode (a tensor made under ``torch.inference_mode()`` has no autograd
keys: an inference tensor), so a call under inference mode makes its own.
"""

from __future__ import annotations

import jax
import torch

from ._tensor import _STRIDED, Tensor, _ArrayImpl, _make, _make_wrapper_subclass, _Storage

BATCH = 16  # a batch's first tensor costs what ~3 warm ones do; 16 make it ~1/5 of a tensor each

_inference_mode = torch.is_inference_mode_enabled


class ResultWrappers:
    """``wrap(array)``: ``array``, a result of the executable whose earlier result gave
    ``spec`` (``result_specs``: shape, dtype, device, sharding), as a new root torchlax Tensor.

    Not thread-safe: the caller serializes its calls (``torchlax.jit`` holds its lock)."""

    __slots__ = ("spec", "_made", "_batch")

    def __init__(self, spec: tuple):
        self.spec = spec
        self._made: list[Tensor] = []
        self._batch = 1  # the next batch's size: doubled up to BATCH

    def wrap(self, array: jax.Array) -> Tensor:
        shape, dtype, device, sharding = self.spec
        if type(array) is not _ArrayImpl or array.sharding is not sharding:
            return _make(array)  # placed otherwise (a fallback path), or a tracer
        if _inference_mode():
            tensor = _make_wrapper_subclass(
                Tensor, shape, None, None, None, dtype, _STRIDED, device
            )
            tensor._storage = _Storage(array)
            tensor._view = None
            return tensor
        made = self._made
        if not made:
            self._make_batch()
        tensor = made.pop()
        tensor._storage.array = array  # (its own storage, made with it and seen by no one)
        return tensor

    def _make_batch(self) -> None:
        shape, dtype, device, _ = self.spec
        for _ in range(self._batch):
            tensor = _make_wrapper_subclass(
                Tensor, shape, None, None, None, dtype, _STRIDED, device
            )
            tensor._storage = _Storage(None)
            tensor._view = None
            self._made.append(tensor)
        self._batch = min(2 * self._batch, BATCH)
