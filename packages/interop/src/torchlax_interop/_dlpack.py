"""Zero-copy exchange of tensors between PyTorch and JAX through the DLPack protocol.

Aliasing rules (JAX arrays are immutable, torch tensors are not):

* ``from_torch(t)`` shares ``t``'s memory with the new JAX array, then turns ``t``'s storage
  copy-on-write (PyTorch's lazy clone). A later in-place write to ``t`` (or any view of its
  storage) first moves ``t`` to a private copy, so the JAX array keeps the value ``t`` had at
  promotion. The copy is paid only if torch writes while the JAX array is alive; reading
  ``t`` stays free, and promoting the same unwritten tensor again returns the same array.
  PyTorch code that asks for a writable pointer (``t.data_ptr()``, ``t.numpy()``) counts as a
  write: it gets the copy, never the JAX array's buffer.
* ``to_torch(x)`` returns a torch tensor sharing the JAX array's memory. It is read-only by
  contract. Writing to it would change an immutable JAX array, so such writes are detected:
  the next interop call (``from_torch``, ``to_torch``, ``call_jax``, ``jit``, ...) raises
  ``SharedMemoryWriteError``. Ask for ``copy=True`` (or use ``tensor.cpu()``) for a tensor
  you will write to.

On a GPU (with ``torchlax[cuda]``) both directions work the same way for CUDA tensors: a tensor
on ``cuda:N`` becomes an array on the JAX GPU with CUDA ordinal N (``local_hardware_id``), and
back. DLPack's ``stream`` argument orders the hand-over: ``from_torch`` makes JAX wait for the
work queued on the tensor's current torch stream, ``to_torch`` makes torch's current stream
wait for XLA's computation, so neither side reads half-written memory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref

import jax
import jax.core
import jax.numpy as jnp
import torch
from torchlax_core import Tensor, TorchlaxError, jax_dtype, wrap
from torchlax_core.internal import x64

from ._arguments import check_from_torch_tensor, check_to_torch_array

_ALIGNMENT = 16  # XLA's CPU client aliases only buffers aligned to 16 bytes; it copies others.


class SharedMemoryWriteError(TorchlaxError, RuntimeError):
    """A torch tensor sharing memory with a JAX array was written to in place."""


# -- tensors handed out by to_torch, watched for writes -------------------------------------------


@dataclasses.dataclass
class _Export:
    tensor: weakref.ref
    version: int
    array: jax.Array


_exports: dict[int, _Export] = {}


def _watch(tensor: torch.Tensor, array: jax.Array) -> None:
    key = id(tensor)
    _exports[key] = _Export(
        weakref.ref(tensor, lambda _: _exports.pop(key, None)), tensor._version, array
    )


def check_shared_writes() -> None:
    """Raise ``SharedMemoryWriteError`` if a tensor ``to_torch`` shared was written in place.

    Every interop entry point calls this; call it yourself to check at a point of your choice.
    """
    if not _exports:
        return
    for key, export in list(_exports.items()):
        tensor = export.tensor()
        if tensor is None or tensor._version == export.version:
            continue
        del _exports[key]
        raise SharedMemoryWriteError(
            f"A torch tensor returned by torchlax.to_torch (shape {tuple(tensor.shape)}, "
            f"dtype {tensor.dtype}) was modified in place. It shares memory with an immutable "
            "JAX array, whose value is now corrupted. Call to_torch(x, copy=True) (or "
            "tensor.cpu()) to get a tensor you may write to."
        )


# -- torch -> JAX ---------------------------------------------------------------------------------


def from_torch(tensor: torch.Tensor, *, copy: bool = False) -> Tensor:
    """A torchlax Tensor holding ``tensor``'s data, shared through DLPack without a copy.

    Works for CPU tensors (and CUDA tensors when JAX sees a GPU) of every dtype torchlax
    supports, including bool, bfloat16, 0-d and empty tensors. The memory is shared; ``tensor``
    becomes copy-on-write, so later in-place writes to it never reach the JAX array (see the
    module docstring). A copy is made (and nothing is shared) where DLPack or PyTorch cannot
    express the sharing:

    * strides that are not a permutation of a compact layout (``t[::2]``, ``expand``);
    * tensors with the conjugate or negative bit set (``t.conj()`` of a complex tensor);
    * data not aligned to 16 bytes (XLA copies such buffers itself);
    * memory PyTorch does not own (from NumPy or another DLPack producer), which cannot be
      made copy-on-write; a tensor that ``to_torch`` made is the exception: it gives back the
      very JAX array it came from;
    * ``copy=True``.

    If ``tensor`` requires grad (and grad mode is on), the result is connected to it by
    autograd: gradients flow back through ``to_torch``. A torchlax Tensor is returned as is.
    """
    check_shared_writes()
    if isinstance(tensor, Tensor):
        return tensor
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(
            f"torchlax.from_torch expects a torch.Tensor, got {type(tensor).__name__}. For a "
            "jax.Array use torchlax.wrap(array)."
        )
    check_from_torch_tensor(tensor)
    if tensor.requires_grad and torch.is_grad_enabled():
        return _FromTorch.apply(tensor, copy)
    return wrap(_to_jax_array(tensor, copy))


def _to_jax_array(tensor: torch.Tensor, copy: bool) -> jax.Array:
    jax_dtype(tensor.dtype)  # raises a clear error for dtypes JAX cannot hold
    if tensor.layout != torch.strided:
        raise TypeError(
            f"torchlax.from_torch takes dense (strided) tensors; got layout {tensor.layout}. "
            "Call tensor.to_dense() first."
        )
    if tensor.device.type == "meta":
        raise ValueError(
            "torchlax.from_torch got a tensor on the meta device, which has no data. Use "
            "jax.ShapeDtypeStruct for shapes, or materialize the tensor first."
        )
    export = _exports.get(id(tensor))
    if export is not None and export.tensor() is tensor and not copy:
        return export.array  # a round trip: the array to_torch shared, still unmodified
    tensor = tensor.detach()
    with x64(), _current_cuda_device(tensor):
        if tensor.numel() == 0:  # nothing to share; on the device DLPack would have used
            return jnp.zeros(
                tuple(tensor.shape), jax_dtype(tensor.dtype), device=_dlpack_device(tensor)
            )
        if tensor.is_conj() or tensor.is_neg() or not _compact(tensor):
            # A private copy in a layout DLPack can express: share it, nothing to protect.
            return jnp.from_dlpack(tensor.resolve_conj().resolve_neg().contiguous())
        if copy:
            return jnp.array(jnp.from_dlpack(tensor), copy=True)
        cached = _promoted_before(tensor)
        if cached is not None:
            return cached
        # data_ptr() gives an already copy-on-write tensor its own buffer (a copy, unless the
        # earlier JAX array is gone), so that the export below aliases exactly that buffer.
        pointer = tensor.data_ptr()
        array = jnp.from_dlpack(tensor)
        if array.unsafe_buffer_pointer() != pointer:
            return array  # XLA copied (unaligned data): nothing is shared
        if not _make_copy_on_write(tensor):
            return jnp.array(array, copy=True)
        _remember(tensor, array)
        return array


def _current_cuda_device(tensor: torch.Tensor):
    # torch's __dlpack__ exports only tensors of the current CUDA device.
    if tensor.device.type == "cuda":
        return torch.cuda.device(tensor.device.index)
    return contextlib.nullcontext()


def _dlpack_device(tensor: torch.Tensor) -> jax.Device:  # pyright: ignore[reportInvalidTypeForm]  (jax.Device is a run-time alias of jaxlib's class)
    if tensor.device.type == "cuda":
        from torchlax_core.internal import cuda_device

        return cuda_device(tensor.device)
    return jax.local_devices(backend="cpu")[0]


def _compact(tensor: torch.Tensor) -> bool:
    """Whether the strides are a permutation of a dense layout (all DLPack/XLA can alias)."""
    dims = sorted(
        (stride, size) for size, stride in zip(tensor.shape, tensor.stride()) if size != 1
    )
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


def _make_copy_on_write(exported: torch.Tensor) -> bool:
    """Turn ``exported``'s storage copy-on-write; its current buffer then belongs to JAX.

    A lazy clone holds the buffer for JAX: whichever side writes first gets a copy, and the
    buffer is freed when both the clone and the storage let go. The clone is attached to the
    tensor object JAX's DLPack handle holds, which lives exactly as long as the JAX buffer
    (PyTorch keeps a tensor's Python object alive while C++ holds the tensor). Returns False
    for memory PyTorch cannot make copy-on-write.
    """
    lazy_clone = getattr(torch, "_lazy_clone", None)
    if lazy_clone is None:
        return False
    try:
        exported._torchlax_keep = lazy_clone(exported)  # pyright: ignore[reportAttributeAccessIssue]  (an attribute of our own on the exported tensor)
    except RuntimeError:  # memory torch does not own (from NumPy, DLPack, shared memory)
        return False
    return True


def _view_key(tensor: torch.Tensor) -> tuple:
    return (tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)


def _promoted_before(tensor: torch.Tensor) -> jax.Array | None:
    """The array an earlier ``from_torch`` made of this very view, if nothing was written since.

    Exporting a copy-on-write tensor again would give it a private copy first; reusing the
    earlier array is free. Any write moves the storage to a new buffer, which the address
    check sees (``const_data_ptr`` does not trigger the copy).
    """
    is_cow = getattr(torch._C, "_is_cow_tensor", None)
    if is_cow is None or not is_cow(tensor):
        return None
    arrays = getattr(tensor.untyped_storage(), "_torchlax_arrays", None)
    if not arrays:
        return None
    entry = arrays.get(_view_key(tensor))
    if entry is None:
        return None
    ref, address = entry
    array = ref()
    if array is None or address != tensor.const_data_ptr():  # pyright: ignore[reportAttributeAccessIssue]  (torch's stubs omit Tensor.const_data_ptr)
        return None
    return array


def _remember(tensor: torch.Tensor, array: jax.Array) -> None:
    storage = tensor.untyped_storage()
    arrays = getattr(storage, "_torchlax_arrays", None)
    if arrays is None:
        arrays = storage._torchlax_arrays = {}  # pyright: ignore[reportAttributeAccessIssue]  (an attribute of our own on the storage)
    for key in [k for k, (ref, _) in arrays.items() if ref() is None]:
        del arrays[key]
    arrays[_view_key(tensor)] = (weakref.ref(array), tensor.const_data_ptr())  # pyright: ignore[reportAttributeAccessIssue]  (torch's stubs omit Tensor.const_data_ptr)


class _FromTorch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, copy):
        ctx.device = tensor.device
        return wrap(_to_jax_array(tensor, copy))

    @staticmethod
    def backward(ctx, grad):  # pyright: ignore[reportIncompatibleMethodOverride]  (PyTorch's one-output form of backward)
        if isinstance(grad, Tensor):
            grad = _to_torch_tensor(grad.jax(), copy=True)
        return grad.to(ctx.device), None


# -- JAX -> torch ---------------------------------------------------------------------------------


def to_torch(x: torch.Tensor | jax.Array, *, copy: bool = False) -> torch.Tensor:
    """A plain torch tensor with the data of a torchlax Tensor or ``jax.Array``.

    The memory is shared through DLPack (a CPU tensor for a CPU array, CUDA for a GPU array),
    so the call is free. The result is read-only by contract: JAX arrays are immutable, and a
    write to it is detected and reported by the next interop call (``SharedMemoryWriteError``).
    With ``copy=True`` the result owns fresh memory and may be written to. Arrays spread over
    several devices are gathered (a copy). A torch tensor that is not a torchlax Tensor is
    returned as is. If ``x`` is a torchlax Tensor that requires grad, gradients flow back
    through ``from_torch``.
    """
    check_shared_writes()
    if isinstance(x, Tensor):
        if x.requires_grad and torch.is_grad_enabled():
            return _ToTorch.apply(x, copy)
        return _to_torch_tensor(x.jax(), copy, watch=not copy)
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, jax.Array):
        return _to_torch_tensor(x, copy, watch=not copy)
    raise TypeError(
        f"torchlax.to_torch expects a torchlax.Tensor or a jax.Array, got {type(x).__name__}."
    )


def _to_torch_tensor(array: jax.Array, copy: bool, watch: bool = False) -> torch.Tensor:
    check_to_torch_array(array)
    if isinstance(array, jax.core.Tracer):
        raise TypeError(
            "torchlax.to_torch got a value traced by JAX (inside jax.jit, jax.grad or "
            "torchlax.jit). Return it from the transformed function and convert it outside."
        )
    if len(array.devices()) != 1:
        array = jax.device_put(array, next(iter(array.devices())))
        copy, watch = False, False  # already a fresh buffer
    if copy:
        array = jnp.array(array, copy=True)
    tensor = torch.from_dlpack(array)
    if watch:
        _watch(tensor, array)
    return tensor


class _ToTorch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, copy):
        return _to_torch_tensor(x.jax(), copy, watch=not copy)

    @staticmethod
    def backward(ctx, grad):  # pyright: ignore[reportIncompatibleMethodOverride]  (PyTorch's one-output form of backward)
        return wrap(_to_jax_array(grad, copy=False)), None
