"""``torchlax.Tensor``: a ``torch.Tensor`` subclass whose data is a ``jax.Array``.

Every ATen op on it reaches ``__torch_dispatch__``, which hands it to the current environment
(``_environment.Environment.dispatch``). Autograd sits above the Python dispatch key, so
``loss.backward()`` runs PyTorch's own derivative formulas on torchlax Tensors.

Views alias as in PyTorch. A view keeps its root tensor and the function that computes it from
the root's array; reading it recomputes when the root's array changed, and writing to it
scatters the new value back into the root (see ``_write``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ._dtypes import jax_dtype, torch_dtype


@functools.cache
def _torch_device(index: int) -> torch.device:
    return torch.device("jax", index)


def _device_index(array) -> int:
    if isinstance(array, jax.core.Tracer):
        return 0
    try:
        devices = array.devices()
    except Exception:  # a deleted or otherwise device-less array
        return 0
    if len(devices) == 1:
        return next(iter(devices)).id
    return min(d.id for d in devices)


class _View:
    """How a view tensor is computed from its root, and how writes go back."""

    __slots__ = ("root", "compute", "seen", "_indices", "shape_only")

    def __init__(self, root: Tensor, compute, shape_only: bool):
        self.root = root
        self.compute = compute  # root array -> view array
        self.seen = None  # the root array the cached value was computed from
        self._indices = None
        self.shape_only = shape_only

    def indices(self, root_array):
        # Applying the view function to an iota of the root's shape tells which root element
        # each view element is: that makes one generic scatter for every shape-only view op.
        if self._indices is None:
            size = int(np.prod(root_array.shape, dtype=np.int64))
            iota = jnp.arange(size, dtype=jnp.int64 if size > 2**31 - 1 else jnp.int32)
            self._indices = self.compute(iota.reshape(root_array.shape)).reshape(-1)
        return self._indices


class Tensor(torch.Tensor):
    """A ``torch.Tensor`` that holds a ``jax.Array``.

    Create one with ``torchlax.wrap(jax_array)``, with ``tensor.to("jax")`` or a factory such as
    ``torch.randn(2, 3, device="jax")`` inside ``torchlax.enable()``, or with
    ``torchlax.from_torch(tensor)``. ``t.jax()`` returns the array.
    """

    _elem: jax.Array
    _view: _View | None

    @staticmethod
    def __new__(cls, elem: jax.Array, *, requires_grad: bool = False, _view: _View | None = None):
        dtype = torch_dtype(elem.dtype)
        r = torch.Tensor._make_wrapper_subclass(
            cls,
            elem.shape,
            dtype=dtype,
            device=_torch_device(_device_index(elem)),
            requires_grad=requires_grad,
        )
        r._elem = elem
        r._view = _view
        return r

    def __init__(self, elem: jax.Array, *, requires_grad: bool = False, _view=None):
        pass

    # -- data -----------------------------------------------------------------------------

    def jax(self) -> jax.Array:
        """The ``jax.Array`` this tensor holds (for a view: its current value)."""
        return self._value()

    def _value(self) -> jax.Array:
        view = self._view
        if view is None:
            return self._elem
        root_array = view.root._value()
        if view.seen is not root_array:
            self._elem = view.compute(root_array)
            view.seen = root_array
        return self._elem

    def _write(self, new: jax.Array) -> None:
        """Replace this tensor's data in place (same shape and dtype), through any view."""
        view = self._view
        if view is None:
            self._elem = new
            return
        if not view.shape_only:
            raise NotImplementedError(
                "Writing in place through a view that reinterprets the dtype (view(dtype), "
                "real, imag, view_as_real, view_as_complex) is not supported by torchlax; "
                "write to the base tensor instead."
            )
        root = view.root
        root_array = root._value()
        flat = root_array.reshape(-1).at[view.indices(root_array)].set(new.reshape(-1))
        root._write(flat.reshape(root_array.shape))
        self._elem = new
        view.seen = root._value()

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

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        new = Tensor(self._value(), requires_grad=self.requires_grad)
        if getattr(self, "_is_param", False):
            new._is_param = True
        memo[id(self)] = new
        return new

    # -- dispatch -----------------------------------------------------------------------------

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        from ._environment import current_env

        return current_env().dispatch(func, args, kwargs or {})

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        from ._environment import current_env

        return current_env().call_function(func, types, args, kwargs or {})


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
    """Copy a CPU (or other) torch.Tensor into a new jax.Array of the same dtype."""
    target = jax_dtype(tensor.dtype)
    t = tensor.detach().resolve_conj().resolve_neg().contiguous().cpu()
    if t.dtype in (torch.bfloat16,) or t.dtype.itemsize == 1 and t.is_floating_point():
        raw = t.view(torch.uint8 if t.dtype.itemsize == 1 else torch.int16).numpy()
        host = raw.view(target)
    else:
        host = t.numpy()
    return jax.device_put(np.array(host, copy=True), device)
