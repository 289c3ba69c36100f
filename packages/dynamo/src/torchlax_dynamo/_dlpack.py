"""The hand-off between torch tensors and jax.Arrays on every call of a compiled graph.

Both directions share memory (DLPack). ``jax.dlpack.from_dlpack`` costs about 100 us a call
(it re-canonicalises the dtype through ``jnp.asarray``), which would dominate a small compiled
graph, so the hot path talks to jaxlib's DLPack entry points directly and falls back to the
public API where they are missing or refuse.

CPU parameters and buffers come back on every call with the same storage: ``InputCache``
remembers the array made for each input slot, keyed on the tensor's identity and data
pointer, so a steady-state call converts only the tensors that actually changed.

CUDA tensors land on the JAX GPU with the same CUDA ordinal, without a copy. DLPack's
``stream`` argument orders the hand-over: torch makes a JAX stream wait for the work queued
on the tensor's current torch stream, and the new array counts as ready only after that
wait, so no XLA kernel reads a half-written tensor. In the other direction
``torch.from_dlpack`` passes torch's current stream, which then waits for XLA's computation.
"""

from __future__ import annotations

import contextlib
import operator

import jax
import torch
from torchlax_core.internal import cuda_device, x64

try:  # jaxlib's DLPack entry points (what jax.dlpack wraps)
    from jax._src.lib import _jax as _jaxlib
    from jax._src.lib import jaxlib_extension_version as _jaxlib_version

    _to_buffer = _jaxlib.dlpack_managed_tensor_to_buffer if _jaxlib_version >= 467 else None
    _to_capsule = _jaxlib.buffer_to_dlpack_managed_tensor
except (ImportError, AttributeError):  # pragma: no cover - other jaxlib versions
    _to_buffer = _to_capsule = None

_KDL_CPU = 1
_KDL_CUDA = 2
_cpu_device = []
_gpu_devices: dict[int, jax.Device] = {}  # torch CUDA index -> JAX device  # pyright: ignore[reportInvalidTypeForm]  (jax.Device is a run-time alias of jaxlib's class)


def _shared_cpu_array(tensor: torch.Tensor) -> jax.Array | None:
    """A jax.Array viewing a contiguous CPU tensor's memory, or None if JAX cannot view it."""
    if _to_buffer is None or not tensor.is_contiguous():
        return None
    if not _cpu_device:
        _cpu_device.append(jax.devices("cpu")[0])
    try:
        # copy=False: XLA refuses data not aligned to 64 bytes instead of copying silently.
        return _to_buffer(torch._C._to_dlpack(tensor), _cpu_device[0], None, False, _KDL_CPU)
    except Exception:
        return None


def _shared_cuda_array(tensor: torch.Tensor) -> jax.Array | None:
    """A jax.Array viewing a contiguous CUDA tensor's memory, ordered after its producer.

    What ``jax.dlpack.from_dlpack`` does, without its dtype round trip: JAX names a stream,
    torch's ``__dlpack__(stream=...)`` makes it wait for torch's current stream, and jaxlib
    marks the buffer ready on that same stream.
    """
    if _to_buffer is None or not tensor.is_contiguous() or tensor.is_conj() or tensor.is_neg():
        return None
    index = tensor.device.index
    device = _gpu_devices.get(index)
    if device is None:
        device = _gpu_devices[index] = cuda_device(tensor.device)
    try:
        stream = device.get_stream_for_external_ready_events()
    except Exception:  # a client without external streams: torch syncs its default stream
        stream = None
    # torch exports only tensors of the current CUDA device.
    with torch.cuda.device(index):
        capsule = tensor.__dlpack__(stream=stream)
    try:
        return _to_buffer(capsule, device, stream, False, _KDL_CUDA)
    except Exception:
        return None


def torch_to_jax(tensor: torch.Tensor) -> jax.Array:
    """A jax.Array sharing ``tensor``'s memory (a copy only if JAX cannot take it as is)."""
    if tensor.device.type == "cpu":
        array = _shared_cpu_array(tensor)
        if array is not None:
            return array
    elif tensor.device.type == "cuda":
        array = _shared_cuda_array(tensor.detach())
        if array is not None:
            return array
    # Not torchlax_interop.from_torch: that makes the tensor copy-on-write, so that a long-lived
    # array keeps its value; a compiled program only borrows its inputs for one call.
    tensor = tensor.detach().resolve_conj().resolve_neg().contiguous()
    with x64(), _current_cuda_device(tensor):  # x64: keep int64/float64
        return jax.dlpack.from_dlpack(tensor)


def _current_cuda_device(tensor: torch.Tensor):
    # torch's __dlpack__ exports only tensors on the current CUDA device.
    if tensor.device.type == "cuda":
        return torch.cuda.device(tensor.device.index)
    return contextlib.nullcontext()


def jax_to_torch(array: jax.Array, *, on_cpu: bool = False) -> torch.Tensor:
    """A torch tensor sharing ``array``'s memory (waits until the array is computed).

    ``on_cpu`` (the caller knows the array is on the CPU) takes jaxlib's capsule directly;
    otherwise the DLPack protocol runs, which orders JAX's stream before torch's on a GPU.
    """
    if on_cpu and _to_capsule is not None:
        try:
            return torch._C._from_dlpack(_to_capsule(array))
        except Exception:
            pass
    return torch.from_dlpack(array)


def cpu_tensors(arrays) -> list[torch.Tensor] | None:
    """``jax_to_torch(array, on_cpu=True)`` of each of a CPU program's results, in one loop
    (jaxlib's capsule straight to torch); None where one is refused or is not on the CPU (a
    program that ran elsewhere than the graph said): the caller then takes the general path.
    """
    if _to_capsule is None:
        return None
    from_capsule = torch._C._from_dlpack
    try:
        tensors = [from_capsule(_to_capsule(array)) for array in arrays]
    except Exception:
        return None
    return tensors if all(t.is_cpu for t in tensors) else None


class InputCache:
    """Per input slot: the jax.Array viewing the CPU tensor seen there last, and those of the
    few tensors seen there before it.

    An entry is reused only for the very same tensor object with the same data pointer and
    shape, so it views exactly the bytes the tensor holds now; in-place updates (an optimizer
    step, ``mul_`` under ``no_grad``) are seen through the shared memory, and a tensor given
    other memory (``p.data = other``) or a tensor the slot has not seen is converted again.
    (Its strides need no check: Dynamo guards them, and only contiguous tensors are cached.)
    Copies and CUDA tensors are never cached: a copy would go stale, and a reused CUDA array
    would skip the stream synchronisation DLPack performs.

    A slot keeps up to ``_KEPT`` earlier entries besides the last one: Dynamo gives one graph to
    every model whose frame passes its guards, and transformers' models all run through one
    decorated ``forward`` frame, so two compiled instances of a class (a model and its EMA copy,
    an ensemble) called in turn share one program; with one entry per slot each call would
    convert every parameter again (29 DLPack conversions, ~360 us a GPT-2 (2 layers) call,
    loaded). Each entry's array views its tensor's memory and so keeps that memory alive until
    the entry goes: when the slot has seen ``_KEPT`` + 1 newer tensors, or with the program.

    The array is made from an alias of the tensor (``detach()``), and the entry holds no
    reference to the tensor itself, weak or strong: ``module.to("jax")`` replaces a parameter's
    contents with ``torch.utils.swap_tensors``, which refuses a tensor that something else
    references (a DLPack export holds its ``TensorImpl``) or that has a weak reference. Once the
    tensor is gone its ``id`` may be reused while the entry lives; a new tensor then hits only
    with the same data pointer in the memory the entry keeps alive and the same shape, and
    Dynamo's guards give the slot the same dtype, strides and conjugate/negative bits: the
    entry's array views exactly its bytes.

    An entry holds the tensor's ``id`` and its shape as a ``torch.Size``, so a hit does not read
    the array's ``shape`` (a Python property in JAX): 9 us instead of 15 us for GPT-2's 29
    inputs (a warm loop, loaded machine).

    ``get_all`` first compares the whole call with the last one in three C-level passes (the
    tensors' ids, data pointers and shapes, each as one list): a repeated call of a CPU model
    (its parameters and the same-shaped inputs, every one a cached view) returns the very
    list of arrays it returned last time and leaves ``generation`` as it was, which
    ``XlaProgram`` reads to skip its signature check. The checks are the per-slot ones, made
    for all slots at once.
    """

    __slots__ = ("_entries", "_earlier", "_last", "generation")

    def __init__(self, size: int):
        # Per slot: None or (id, data pointer, shape, array), the last seen.
        self._entries: list = [None] * size
        # Per slot: the entries seen before it, most recent first (at most _KEPT).
        self._earlier: list[list] = [[] for _ in range(size)]
        # The last get_all's (ids, data pointers, shapes, arrays) where every slot was a
        # cached view, else None (a one-item list).
        self._last: list = [None]
        # Counts the get_all calls that were not such a repeat: while it is unchanged, every
        # get_all since returned the same arrays (XlaProgram then skips its signature check).
        self.generation = 0

    def get(self, slot: int, tensor: torch.Tensor) -> jax.Array:
        entry = self._entries[slot]
        if (
            entry is not None
            and entry[0] == id(tensor)
            and tensor.data_ptr() == entry[1]
            and tensor.shape == entry[2]
        ):
            return entry[3]
        return self._miss(slot, tensor)

    def get_all(self, tensors) -> list[jax.Array]:
        """``get(slot, tensor)`` for every slot in order: a call whose inputs are all torch
        tensors (a CPU model's parameters and its inputs). A call whose tensors are the last
        call's, with the same memory and shapes, gets the last call's list itself (the
        caller must not change it) and leaves ``generation`` unchanged."""
        last = self._last[0]
        if (
            last is not None
            and list(map(id, tensors)) == last[0]
            and list(map(_data_ptr, tensors)) == last[1]
            and list(map(_shape, tensors)) == last[2]
        ):
            return last[3]
        self.generation += 1
        arrays = self._get_each(tensors)
        entries = self._entries
        if all(e is not None and e[3] is a for e, a in zip(entries, arrays, strict=True)):
            # Every slot a cached view: the next call may compare with this one at once.
            self._last[0] = (
                [e[0] for e in entries],
                [e[1] for e in entries],
                [e[2] for e in entries],
                arrays,
            )
        else:
            self._last[0] = None
        return arrays

    def _get_each(self, tensors) -> list[jax.Array]:
        arrays = []
        append = arrays.append
        for slot, (tensor, entry) in enumerate(zip(tensors, self._entries, strict=True)):
            if (
                entry is not None
                and entry[0] == id(tensor)
                and tensor.data_ptr() == entry[1]
                and tensor.shape == entry[2]
            ):
                append(entry[3])
            else:
                append(self._miss(slot, tensor))
        return arrays

    def _miss(self, slot: int, tensor: torch.Tensor) -> jax.Array:
        """The array for a tensor that is not the slot's last: an earlier entry's (made the
        last again), or a new view."""
        earlier = self._earlier[slot]
        key = id(tensor)
        for i, entry in enumerate(earlier):
            if entry[0] == key:
                del earlier[i]
                if tensor.data_ptr() == entry[1] and tensor.shape == entry[2]:
                    self._push(slot, entry)
                    return entry[3]
                break  # the same tensor with other memory or shape: its view is stale
        # From an alias: the export holds the alias's TensorImpl, not the tensor's (see above).
        array = _shared_cpu_array(tensor.detach()) if tensor.device.type == "cpu" else None
        if array is None:
            return torch_to_jax(tensor)
        self._push(slot, (key, tensor.data_ptr(), tensor.shape, array))
        return array

    def _push(self, slot: int, entry: tuple) -> None:
        """Make ``entry`` the slot's last; the one it replaces becomes the most recent earlier
        entry (unless it is for the same tensor, whose view is then stale)."""
        self._last[0] = None
        last = self._entries[slot]
        self._entries[slot] = entry
        if last is not None and last[0] != entry[0]:
            earlier = self._earlier[slot]
            earlier.insert(0, last)
            del earlier[_KEPT:]


_data_ptr = torch.Tensor.data_ptr
_shape = operator.attrgetter("shape")

# Earlier entries kept per input slot besides the last (InputCache): models of one class
# compiled and called in turn, each keeping its views.
_KEPT = 3
