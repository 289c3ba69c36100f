"""``torchlax.Tensor``: a ``torch.Tensor`` subclass whose data is a ``jax.Array``.

Every ATen op on it reaches ``__torch_dispatch__``, which runs it in the current environment
(``_run.run_op``). Autograd sits above the Python dispatch key, so
``loss.backward()`` runs PyTorch's own derivative formulas on torchlax Tensors.

Views alias as in PyTorch. A root tensor and its views share one ``_Storage`` (a box holding
the root's array); a view also keeps the function that computes it from that array. Reading a
view recomputes when the storage's array changed; writing to it puts the new value back into
the storage (see ``_write``).
"""

from __future__ import annotations

import copy
import functools
import threading
import typing
import weakref

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import torch

from ._current import current_env
from ._dtypes import _JAX_TO_TORCH as _DTYPES  # jax dtype -> torch dtype, for _make
from ._dtypes import jax_dtype, torch_dtype
from ._host_put import put
from ._run import run_op
from ._x64 import x64

# -- what a tensor is made of -----------------------------------------------------------------

_make_wrapper_subclass = torch.Tensor._make_wrapper_subclass
# On hot paths it is called with positional arguments, (cls, size, strides, storage_offset,
# memory_format, dtype, layout, device, pin_memory, requires_grad): PyTorch's argument parser
# matches keywords by name, ~0.4-0.7 us more per new Tensor (benchmarks/README.md, session 16).
_ArrayImpl = type(jnp.zeros(()))
_STRIDED = torch.strided
_DEVICES: dict = {}  # sharding -> torch.device("jax", index): one hash per new tensor


@functools.cache
def _torch_device(index: int) -> torch.device:
    return torch.device("jax", index)


def _device_index(array) -> int:
    if isinstance(array, jax.core.Tracer):
        return 0
    try:
        devices = array.devices()
    except Exception:  # a deleted or otherwise device-less array, or a jax.ShapeDtypeStruct
        sharding = getattr(array, "sharding", None)
        devices = getattr(sharding, "device_set", None)
        if not devices:
            return 0
    if len(devices) == 1:
        return next(iter(devices)).id
    return min(d.id for d in devices)


def _device_of(array) -> torch.device:
    if type(array) is _ArrayImpl:
        sharding = array.sharding
        device = _DEVICES.get(sharding)
        if device is None:
            device = _torch_device(_device_index(array))
            if len(_DEVICES) < 4096:
                _DEVICES[sharding] = device
        return device
    return _torch_device(_device_index(array))


class _Storage:
    """The array a root tensor and all its views share (PyTorch's storage).

    Tensors point at it rather than at each other, so swapping two tensors' contents
    (``torch.utils.swap_tensors``, used by ``module.to``) keeps every alias consistent.

    ``exclusive``: no one outside this storage has seen ``array``. A compiled program that
    wrote it sets it (``internal.set_exclusive``); whatever hands the array out clears it, so
    that it is never donated to XLA while someone can still read it: ``_value`` (``t.jax()``,
    DLPack, ``.numpy()``), a write of another array (``_write``) and an op whose lowering runs
    plainly (its result may be its input unchanged: ``_unwrap.release``). An op served by a
    compiled executable (the eager op cache) only reads its inputs: its results are new
    buffers, so the hot path leaves the flag alone.
    """

    __slots__ = ("__weakref__", "addressed", "array", "exclusive")

    def __init__(self, array):
        self.array = array
        self.addressed: torch.UntypedStorage | None = None  # see _addressed_storage
        self.exclusive = False


_address_lock = threading.Lock()
_next_address = 1 << 56  # far above host memory: a jax storage has no host address of its own
# Address -> storage, so that ``set_(tensor.untyped_storage(), ...)`` finds the arrays again.
_by_address: weakref.WeakValueDictionary[int, _Storage] = weakref.WeakValueDictionary()


def storage_at(untyped: torch.UntypedStorage) -> _Storage | None:
    """The storage whose ``untyped_storage()`` is ``untyped`` (None: not a jax storage's)."""
    return _by_address.get(untyped.data_ptr())


def _addressed_storage(tensor: Tensor) -> torch.UntypedStorage:
    """The ``UntypedStorage`` that ``untyped_storage()`` answers for ``tensor``'s storage.

    A wrapper tensor's own storage has no data pointer (PyTorch calls it an invalid python
    storage), and code that tells storages apart by address (safetensors, ``save_pretrained``)
    fails on it. Each storage gets, once, a unique address no host memory has and that nothing
    reads through; every view of it answers the same one, as PyTorch's views do.
    """
    global _next_address
    box = tensor._storage
    storage = box.addressed
    if storage is None:
        nbytes = int(box.array.size) * box.array.dtype.itemsize
        with _address_lock:
            storage = box.addressed
            if storage is None:
                address = _next_address
                _next_address += (nbytes // 64 + 1) * 64  # (empty storages differ too)
                storage = typing.cast(
                    torch.UntypedStorage,
                    torch._C._construct_storage_from_data_pointer(address, tensor.device, nbytes),
                )
                box.addressed = storage
                _by_address[address] = box
    return storage


# How a view's elements relate to its storage's: ordered so that composing two views takes
# the larger kind.
IDENTITY, RESHAPE, GATHER, REINTERPRET = 0, 1, 2, 3


class _View:
    """How a view tensor is computed from its storage's array, and how writes go back.

    ``compute`` maps the storage array to the view's (``None`` for an identity view: detach,
    alias). ``value`` caches it for the storage array ``seen``; an in-place op on the base
    replaces the storage array, so the next read recomputes.
    """

    __slots__ = ("compute", "kind", "seen", "value", "_indices", "byte_sources")

    def __init__(self, compute, kind: int, seen, value):
        self.compute = compute
        self.kind = kind
        self.seen = seen
        self.value = value
        self._indices = None
        self.byte_sources: jax.Array | None = (
            None  # a REINTERPRET view's byte map, once written through
        )

    def indices(self, root_array):
        # Applying the view function to an iota of the root's shape tells which root element
        # each view element is: that makes one generic scatter for every gathering view op.
        if self._indices is None:
            size = int(np.prod(root_array.shape, dtype=np.int64))
            with jax.ensure_compile_time_eval():
                iota = jnp.arange(size, dtype=jnp.int64 if size > 2**31 - 1 else jnp.int32)
            # Computed now even inside a jit trace: a constant of the program, safe to cache.
            with x64(), jax.ensure_compile_time_eval():
                self._indices = self.compute(iota.reshape(root_array.shape)).reshape(-1)
        return self._indices


def _first_index(view: _View, root_array) -> int:
    """The root (storage) index of a view's first element: its storage offset."""
    with jax.ensure_compile_time_eval():
        return int(view.indices(root_array)[0])


def _as_real(array):
    """A complex array as floats with a trailing (real, imag) dim; other arrays unchanged."""
    if jnp.issubdtype(array.dtype, jnp.complexfloating):
        return jnp.stack([jnp.real(array), jnp.imag(array)], axis=-1)
    return array


def _from_real(array, dtype):
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return jax.lax.complex(array[..., 0], array[..., 1])
    return array


def _write_reinterpreted(view: _View, root, new):
    """``root`` with the elements the view reads replaced so that it reads ``new``.

    The views that change the dtype between real and complex (``real``, ``imag``,
    ``view_as_real``, ``view_as_complex``, ``conj``, composed with slices) are linear in the
    root's real components and pick each at most once, up to a sign: the transpose of the view
    then scatters ``new`` back onto the components it came from. A bit reinterpretation
    (``view(dtype)``) is not linear; it moves bytes, so ``new``'s bytes are scattered onto the
    root's bytes they came from (``_byte_sources``).
    """
    compute = view.compute
    real_root = _as_real(root)

    def read(components):
        return _as_real(compute(_from_real(components, root.dtype)))

    try:
        scatter = jax.linear_transpose(read, real_root)
        (written,) = scatter(_as_real(new))
        (picked,) = scatter(jnp.ones_like(_as_real(new)))
    except (TypeError, NotImplementedError, ValueError):
        if view.byte_sources is None:
            view.byte_sources = _byte_sources(compute, root, new.dtype)
        return _scatter_bytes(root, view.byte_sources, new)
    return _from_real(jnp.where(picked != 0, written, real_root), root.dtype)


@jax.jit  # one program per (root, view) shape and dtype pair, not a compile per jnp call
def _scatter_bytes(root, byte_sources, new):
    """``root`` with the bytes at ``byte_sources`` replaced by ``new``'s bytes."""
    written = _to_bytes(root).at[byte_sources].set(_to_bytes(new))
    return _from_bytes(written, root.dtype, root.shape)


def _to_bytes(array):
    """``array``'s bytes, flat, element after element (complex: real then imaginary part)."""
    array = _as_real(array.astype(jnp.uint8) if array.dtype == jnp.bool_ else array)
    return jax.lax.bitcast_convert_type(array, jnp.uint8).reshape(-1)


def _from_bytes(data, dtype, shape):
    """The array of ``dtype`` and ``shape`` whose bytes are ``data`` (inverse of ``_to_bytes``)."""
    if dtype == jnp.bool_:
        return (data != 0).reshape(shape)
    complex_ = jnp.issubdtype(dtype, jnp.complexfloating)
    part = jnp.dtype(jnp.float32 if dtype == jnp.complex64 else jnp.float64) if complex_ else dtype
    units = data.reshape(-1, part.itemsize) if part.itemsize > 1 else data
    values = jax.lax.bitcast_convert_type(units, part)
    if complex_:
        pairs = values.reshape(-1, 2)
        values = jax.lax.complex(pairs[:, 0], pairs[:, 1])
    return values.reshape(shape)


def _byte_sources(compute, root, view_dtype):
    """For every byte of the view ``compute(root)``, the index of the root byte it shows.

    The view is computed from probe roots whose bytes spell one bit of their own index each
    (0x40 or 0x41: normal numbers in every float type, no NaN to canonicalise and no denormal
    to flush; 0 or 1 where bool is involved); the view's bytes then spell their source's index.
    A view that changes the bytes it moves (a conjugate or negation after a ``view(dtype)``)
    shows other bytes and is refused.
    """
    nbytes = int(root.size) * root.dtype.itemsize
    positions = np.arange(nbytes, dtype=np.int64)
    marker = 0 if jnp.bool_ in (root.dtype, view_dtype) else 0x40
    sources = None

    @jax.jit  # one compile for every probe, not one per jnp call
    def view_bytes(probe):
        return _to_bytes(compute(_from_bytes(probe, root.dtype, root.shape)))

    with x64(), jax.ensure_compile_time_eval():
        for bit in range(max(1, (nbytes - 1).bit_length())):
            probe = jnp.asarray((marker | (positions >> bit) & 1).astype(np.uint8))
            seen = np.asarray(view_bytes(probe))
            if np.any((seen | 1) != (marker | 1)):
                raise NotImplementedError(
                    "Writing in place through this view is not supported by torchlax: it "
                    "reinterprets its base's bytes (view(dtype)) and also changes them (a "
                    "conjugate or negation). Write to the base tensor instead, or resolve the "
                    "conjugate first (t.resolve_conj())."
                )
            bits = (seen & 1).astype(np.int64) << bit
            sources = bits if sources is None else sources | bits
    return jnp.asarray(sources)


def spans_storage(tensor: Tensor) -> bool:
    """Whether ``tensor`` is its storage's whole array as it is (a root, or an identity view:
    ``detach``, ``alias``): what a compiled program may donate or mark exclusive."""
    view = tensor._view
    return view is None or view.compute is None


def _make(
    array,
    storage: _Storage | None = None,
    view: _View | None = None,
    requires_grad: bool = False,
    layout: tuple | None = None,
    device: torch.device | None = None,
) -> Tensor:
    """A new torchlax Tensor for ``array`` (the hot path: no ``__new__``/``__init__`` calls).

    ``layout`` is a view's ``(strides, storage_offset, storage_nbytes)`` as PyTorch computes
    them (see ``_views._view_layouts``); without it the tensor is row-major from offset 0.
    ``device``, when the caller knows it (a view: its base's), saves reading the array's.
    """
    try:
        dtype = _DTYPES[array.dtype]
    except KeyError:
        dtype = torch_dtype(array.dtype)  # raises UnsupportedDtypeError
    if device is None:
        device = _device_of(array)
    if layout is None:
        r = _make_wrapper_subclass(
            Tensor, array.shape, None, None, None, dtype, _STRIDED, device, False, requires_grad
        )
    else:
        r = _make_wrapper_subclass(
            Tensor,
            array.shape,
            strides=layout[0],
            storage_offset=layout[1],
            storage_size=layout[2],
            dtype=dtype,
            device=device,
            requires_grad=requires_grad,
        )
    r._storage = _Storage(array) if storage is None else storage
    r._view = view
    return r


class Tensor(torch.Tensor):
    """A ``torch.Tensor`` that holds a ``jax.Array``.

    Create one with ``torchlax.wrap(jax_array)``, with ``tensor.to("jax")`` or a factory such as
    ``torch.randn(2, 3, device="jax")`` inside ``torchlax.enable()``, or with
    ``torchlax.from_torch(tensor)``. ``t.jax()`` returns the array.
    """

    _storage: _Storage
    _view: _View | None

    @staticmethod
    def __new__(cls, elem: jax.Array, *, requires_grad: bool = False):
        return _make(elem, requires_grad=requires_grad)

    def __init__(self, elem: jax.Array, *, requires_grad: bool = False):
        pass

    # -- data -----------------------------------------------------------------------------

    def jax(self) -> jax.Array:
        """The ``jax.Array`` this tensor holds (for a view: its current value)."""
        return self._value()

    @property
    def _elem(self) -> jax.Array:
        return self._value()

    def _value(self) -> jax.Array:
        self._storage.exclusive = False  # the array is handed out (see _Storage)
        return self._peek()

    def _peek(self) -> jax.Array:
        """``_value()`` for a reader that keeps the array to itself (an executable's input)."""
        view = self._view
        root = self._storage.array
        if view is None:
            return root
        if view.seen is not root:
            view.value = root if view.compute is None else view.compute(root)
            view.seen = root
        return view.value

    def _write(self, new: jax.Array) -> None:
        """Replace this tensor's data in place (same shape and dtype), through any view."""
        storage = self._storage
        storage.exclusive = False  # ``new`` may be held elsewhere (``b.copy_(a)``)
        view = self._view
        if view is None:
            storage.array = new
            return
        kind = view.kind
        root = storage.array
        if kind == IDENTITY:
            storage.array = new
        elif kind == RESHAPE:
            storage.array = new.reshape(root.shape)
        elif kind == GATHER:
            with x64():  # a scatter outside 64-bit mode would narrow int64/float64 roots
                flat = root.reshape(-1).at[view.indices(root)].set(new.reshape(-1))
            storage.array = flat.reshape(root.shape)
        else:
            with x64():
                storage.array = _write_reinterpreted(view, root, new)
        view.value = new
        view.seen = storage.array

    def _alias_of(self, other: Tensor) -> None:
        """Make this tensor share ``other``'s storage and view (``self.data = other``)."""
        self._storage = other._storage
        view = other._view
        self._view = None if view is None else _View(view.compute, view.kind, view.seen, view.value)

    @property
    def data(self):
        return torch.Tensor.data.__get__(self)  # pyright: ignore[reportAttributeAccessIssue]  (torch's stubs type Tensor.data as a Tensor, not its descriptor)

    @data.setter
    def data(self, new):
        # ``param.data = t`` (module.to between jax devices or dtypes) swaps the C++ metadata;
        # the jax data must follow, or the tensor would report one dtype and hold another.
        torch.Tensor.data.__set__(self, new)  # pyright: ignore[reportAttributeAccessIssue]  (torch's stubs type Tensor.data as a Tensor, not its descriptor)
        if isinstance(new, Tensor):
            self._alias_of(new)

    def untyped_storage(self) -> torch.UntypedStorage:
        return _addressed_storage(self)

    def data_ptr(self) -> int:
        return (
            _addressed_storage(self).data_ptr() + int(self.storage_offset()) * self.element_size()
        )

    # -- conversions that behave as PyTorch's ------------------------------------------------

    def numpy(self, *, force: bool = False) -> np.ndarray:
        if self.requires_grad and not force:
            raise RuntimeError(
                "Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead."
            )
        return np.asarray(_concrete(self._value(), "numpy()"))

    def tolist(self):
        return self.numpy(force=True).tolist()

    def item(self):
        if self.numel() != 1:
            raise RuntimeError(
                f"a Tensor with {self.numel()} elements cannot be converted to Scalar"
            )
        return _concrete(self._value(), "item()").item()

    def __repr__(self, *, tensor_contents=None) -> str:
        value = self._value()
        if isinstance(value, jax.core.Tracer):
            return (
                f"torchlax.Tensor(<traced>, shape={tuple(self.shape)}, dtype={self.dtype}, "
                f"device='{self.device}')"
            )
        # Reuse PyTorch's formatting of the values; PyTorch names the device before the dtype.
        head = repr(_to_cpu(value))[:-1]
        device = f", device='{self.device}'"
        at = head.find(", dtype=")
        head = head + device if at < 0 else head[:at] + device + head[at:]
        if self.grad_fn is not None:
            head += f", grad_fn=<{type(self.grad_fn).__name__}>"
        elif self.requires_grad:
            head += ", requires_grad=True"
        return head + ")"

    def __reduce_ex__(self, protocol):
        # Pickles (torch.save) as a plain CPU tensor, so it loads where torchlax is absent.
        return self.detach().cpu().__reduce_ex__(protocol)

    def __coerce_same_metadata_as_tangent__(self, expected_metadata=None, expected_type=None):
        # AOT autograd (torch.compile) asks a tangent to match what its backward traced; a
        # torchlax Tensor already is the tensor a compiled backward takes.
        return self

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        new = _make(self._value(), requires_grad=self.requires_grad)
        if getattr(self, "_is_param", False):
            new._is_param = True
        memo[id(self)] = new
        if self.grad is not None:
            new.grad = copy.deepcopy(self.grad, memo)
        return new

    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        """``torch.Tensor.backward``, run on the calling thread.

        PyTorch's autograd engine hands the backward of a non-CPU device to that device's
        worker thread and waits for it. The `jax` device gains nothing from it (XLA runs
        asynchronously anyway) and pays two thread handoffs per call: ~0.5 ms of a 2 ms
        compiled MLP training step. So ``loss.backward()`` runs here, as for CPU tensors;
        ``torch.autograd.backward``/``grad`` still use the device thread (and see the
        caller's ``torchlax.enable`` scopes there).
        """
        with torch.autograd.set_multithreading_enabled(False):
            return super().backward(gradient, retain_graph, create_graph, inputs)

    # -- dispatch -----------------------------------------------------------------------------

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return run_op(current_env(), func, args, kwargs or {})

    # While no environment overrides a torch-level function, PyTorch skips
    # __torch_function__ altogether for this class (see set_function_overrides).
    __torch_function__ = torch._C._disabled_torch_function_impl  # pyright: ignore[reportAssignmentType]  (PyTorch's documented way to disable __torch_function__)


def _hide_from_dynamo(function) -> None:
    """Dynamo never compiles ``function`` nor any Python frame it calls.

    When torch.compile runs a piece of user code eagerly (at a graph break, or
    ``loss.backward()``), its frame hook would try to compile every Python frame an op runs:
    this dispatch, the lowering, JAX. (``torch._dynamo.disable`` does this through a wrapper
    on every call and imports Dynamo; the frame strategy costs nothing per call.)
    """
    frames = torch._C._dynamo.eval_frame  # pyright: ignore[reportAttributeAccessIssue]  (torch._C's stubs omit _dynamo)
    skip = frames._FrameAction.SKIP
    frames.set_code_exec_strategy(function.__code__, frames._FrameExecStrategy(skip, skip))


_hide_from_dynamo(Tensor.__dict__["__torch_dispatch__"].__func__)
_hide_from_dynamo(run_op)  # also entered from the jax device's kernels
_hide_from_dynamo(Tensor.backward)  # run eagerly at the graph break Dynamo makes there


_DisableTorchFunctionSubclass = torch._C.DisableTorchFunctionSubclass
_overrides_by_env: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_overridden: frozenset = frozenset()


def _torch_function(cls, func, types, args=(), kwargs=None):
    try:
        overridden = func in _overridden
    except TypeError:  # an unhashable callable is never overridden
        overridden = False
    if overridden:
        return current_env().call_function(func, types, args, kwargs or {})
    with _DisableTorchFunctionSubclass():
        return func(*args, **(kwargs or {}))


def set_function_overrides(env, functions) -> None:
    """Record which torch-level functions ``env`` overrides (called when its tables change).

    ``__torch_function__`` costs every torch call on a Tensor a Python round trip, so it is
    installed only while some environment has function overrides.
    """
    global _overridden
    _overrides_by_env[env] = frozenset(functions)
    _overridden = frozenset().union(*_overrides_by_env.values())
    Tensor.__torch_function__ = (  # pyright: ignore[reportAttributeAccessIssue]  (torch's stubs declare __torch_function__ read-only)
        classmethod(_torch_function) if _overridden else torch._C._disabled_torch_function_impl
    )


def _concrete(array, what: str):
    if isinstance(array, jax.core.Tracer):
        raise RuntimeError(
            f"Tensor.{what} needs a concrete value, but this torchlax Tensor is being traced by "
            "JAX (under jax.jit / torchlax.jit). Return the tensor from the jitted function "
            "and convert it outside."
        )
    return array


def _to_cpu(array) -> torch.Tensor:
    """Copy a concrete jax.Array into a new CPU torch.Tensor of the same dtype."""
    array = _concrete(array, "cpu()")
    cpu = jax.device_get(array)  # numpy array (ml_dtypes for bfloat16/float8)
    dtype = torch_dtype(array.dtype)
    if cpu.dtype.kind in "biufc" and cpu.dtype.type.__module__ == "numpy":
        return torch.from_numpy(np.array(cpu, copy=True))
    # bfloat16 and float8: numpy has no native type; move the bytes.
    raw = np.array(cpu, copy=True).view(np.uint8 if cpu.dtype.itemsize == 1 else np.int16)
    return torch.from_numpy(raw).view(dtype)


def _from_cpu(tensor: torch.Tensor, device=None) -> jax.Array:
    """Copy a CPU (or other) torch.Tensor into a new jax.Array of the same dtype (on ``device``,
    a ``jax.Device`` or a ``Sharding``; ``None``: JAX's default device, uncommitted)."""
    target = jax_dtype(tensor.dtype)
    if tensor.numel() == 0:  # nothing to copy (transformers' DynamicCache makes 4 per forward)
        return put(np.zeros(tuple(tensor.shape), target), device)
    t = tensor.detach().resolve_conj().resolve_neg().contiguous().cpu()
    # (np.from_dlpack, not t.numpy(): numpy() marks the caller's storage non-resizable for good)
    if t.dtype in (torch.bfloat16,) or t.dtype.itemsize == 1 and t.is_floating_point():
        raw = np.from_dlpack(t.view(torch.uint8 if t.dtype.itemsize == 1 else torch.int16))
        host = raw.view(target)
    else:
        host = np.from_dlpack(t)
    # A copy only the new array holds: ``put`` may keep its host buffer as the array's.
    return put(np.array(host, copy=True), device)
