"""Writes: in-place and ``out=`` overloads derived from their functional overload, and the ops
that change a tensor's storage (``resize_``, ``set_``).

``derived_mutation_impl`` runs the functional overload and writes each result into the argument
the op mutates: PyTorch's casting rule (``cast_for_write``), and an ``out=`` of another dtype or
shape checked and resized as PyTorch does.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.utils._pytree
from torch._prims_common import (
    make_channels_last_strides_for,
    make_contiguous_strides_for,
    suggest_memory_format,
)

from . import _tensor
from ._dtypes import jax_dtype, scalar_type_name, torch_dtype
from ._layouts import RESULT_LAYOUT_FROM_META, memory_order, result_strides
from ._registry import op_name
from ._tensor import GATHER, REINTERPRET, RESHAPE, Tensor, _first_index, _make, _View
from ._unwrap import _JAX_DTYPES, _ArrayImpl, _wrap

# -- in-place and out= ---------------------------------------------------------------------------


def functional_counterpart(func):
    """The functional overload an in-place (``add_``) or ``out=`` overload is derived from."""
    if not isinstance(func, torch._ops.OpOverload):
        return None
    schema = func._schema
    if not schema.is_mutable:
        return None
    name = schema.name.split("::")[-1]
    namespace = getattr(torch.ops, func.namespace)
    if name.endswith("_") and not name.endswith("__"):
        packet = getattr(namespace, name[:-1], None)
        if packet is None:
            return None
        overload = getattr(packet, func._overloadname, None)
        if (
            overload is not None
            and not overload._schema.is_mutable
            and len(overload._schema.arguments) == len(schema.arguments)
        ):
            return overload
        return None
    out_names = [a.name for a in schema.arguments if a.is_out]
    if not out_names:
        return None
    wanted = [(a.name, str(a.type)) for a in schema.arguments if not a.is_out]
    packet = func.overloadpacket
    for overload_name in packet.overloads():
        candidate = getattr(packet, overload_name)
        cs = candidate._schema
        if cs.is_mutable:
            continue
        arguments = [(a.name, str(a.type)) for a in cs.arguments]
        if arguments == wanted:
            return candidate
        # A factory's out= overload (zeros.out, linspace.out) lacks the functional's tensor
        # options: the out tensor gives the dtype.
        if (
            arguments[: len(wanted)] == wanted
            and {a.name for a in cs.arguments[len(wanted) :]} == _TENSOR_OPTIONS
        ):
            return candidate
    return None


_TENSOR_OPTIONS = frozenset({"dtype", "layout", "device", "pin_memory"})


def _mutated_targets(func) -> list:
    """For each return of a mutating op: the position or name of the argument it writes."""
    schema = func._schema
    if not schema.returns:  # e.g. _foreach_add_(Tensor(a!)[] self, ...) -> ()
        return [
            a.name if a.kwarg_only else i
            for i, a in enumerate(schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write
        ]
    targets = []
    for ret in schema.returns:
        target = None
        if ret.alias_info is not None and ret.alias_info.is_write:
            alias = set(ret.alias_info.before_set)
            for i, arg in enumerate(schema.arguments):
                if arg.alias_info is not None and alias & set(arg.alias_info.before_set):
                    target = arg.name if arg.kwarg_only else i
                    break
        targets.append(target)
    return targets


def cast_for_write(func, dst: Tensor, value: jax.Array) -> jax.Array:
    """``value`` as ``dst`` holds it: PyTorch's can_cast check, then the cast (no resizing)."""
    dst_dtype = dst.dtype
    if value.dtype != _JAX_DTYPES[dst_dtype]:
        src = torch_dtype(value.dtype)
        if not torch.can_cast(src, dst_dtype):
            raise RuntimeError(
                f"{op_name(func)}: result type {scalar_type_name(src)} can't be cast to the desired "
                f"output type {scalar_type_name(dst_dtype)}"
            )
        value = value.astype(jax_dtype(dst_dtype))
    if value.shape != dst.shape:
        if value.size == dst.numel() and value.ndim == 0:
            value = value.reshape(tuple(dst.shape))
        else:
            raise RuntimeError(
                f"output with shape {list(dst.shape)} doesn't match the broadcast shape "
                f"{list(value.shape)} ({op_name(func)}): an in-place op cannot broadcast its "
                "tensor to a larger shape; pass an output of the result's shape."
            )
    return value


_OUT_DTYPE_ERRORS: dict = {}  # (op, dtypes) -> PyTorch's message, or None

# How PyTorch's kernels word an out= dtype they refuse.
_DTYPE_VERDICTS = ("Found dtype", "Expected out tensor to have", "can't be cast to the desired")


def _check_out_dtype(func, args, kwargs) -> None:
    """PyTorch's dtype rule for an ``out=`` of another dtype than the result, from its CPU kernel.

    Most ops cast into any dtype the result can be cast to (``cast_for_write``), but some want
    ``out``'s dtype exactly (``neg``, ``floor``, ``sign``: "Found dtype Double but expected
    Float"; ``nonzero``: Long). The meta kernels do not all check this, so the op runs once per
    dtype signature on the CPU: first on empty tensors of the arguments' ranks (free), and only
    when those do not fit the op's other arguments (a ``reshape`` size) on broadcast zeros of
    the real shapes (no memory). ``out`` is an empty tensor: PyTorch resizes it.
    """
    leaves = torch.utils._pytree.tree_leaves((args, kwargs))
    key = (func, tuple(t.dtype for t in leaves if isinstance(t, torch.Tensor)))
    if key not in _OUT_DTYPE_ERRORS:
        out_names = {a.name for a in func._schema.arguments if a.is_out}

        def stand_in(empty):
            def convert(x):
                if not isinstance(x, torch.Tensor):
                    return x
                if empty:
                    return torch.zeros([1 if n == 1 else 0 for n in x.shape], dtype=x.dtype)
                return torch.zeros((), dtype=x.dtype).expand(x.shape)

            cpu_args = torch.utils._pytree.tree_map(convert, args)
            cpu_kwargs = {
                k: torch.empty(0, dtype=v.dtype)
                if k in out_names
                else torch.utils._pytree.tree_map(convert, v)
                for k, v in kwargs.items()
            }
            return cpu_args, cpu_kwargs

        message = None
        for empty in (True, False):
            cpu_args, cpu_kwargs = stand_in(empty)
            try:
                func(*cpu_args, **cpu_kwargs)
            except (RuntimeError, NotImplementedError) as error:
                text = str(error)
                if any(verdict in text for verdict in _DTYPE_VERDICTS):
                    message = f"{op_name(func)}: {text}; pass an out= tensor of the expected dtype."
                elif empty:
                    continue  # the empty stand-ins do not fit: try the real shapes
                elif "not implemented for" not in text:  # (the CPU may lack this dtype's kernel)
                    raise
            break
        _OUT_DTYPE_ERRORS[key] = message
    if _OUT_DTYPE_ERRORS[key] is not None:
        raise RuntimeError(_OUT_DTYPE_ERRORS[key])


def _kept_in_place(dst: Tensor, new):
    """``new`` where ``dst``'s data is, when that is committed and ``new`` is not.

    An in-place op never moves a tensor in PyTorch; a result built from the shape alone
    (``zero_``, ``fill_``) comes out of its program uncommitted on the default device, so a
    sharded tensor would otherwise end up whole on device 0.
    """
    # (a tracer's ``committed`` raises: only concrete arrays are looked at)
    if type(new) is not _ArrayImpl or new.committed:
        return new
    old = dst._storage.array
    if type(old) is not _ArrayImpl or not old.committed or old.shape != new.shape:
        return new  # (a view's write combines with its committed root: placed by JAX)
    return jax.device_put(new, old.sharding)


def derived_mutation_impl(func, functional, inner: Callable) -> Callable:
    """Run ``inner`` functionally, then write its results into the arguments ``func`` mutates.

    The written tensor keeps its identity (``id``) and dtype; autograd bumps its ``_version``.
    """
    targets = _mutated_targets(func)
    out_names = {a.name for a in func._schema.arguments if a.is_out}
    single = len(targets) == 1
    drop_out = functional is not None and bool(out_names)
    # A factory's out= takes its dtype from out (zeros.out -> zeros(dtype=out.dtype)).
    dtype_from = None
    if functional is not None and len(out_names) == 1:
        takes_dtype = any(a.name == "dtype" for a in functional._schema.arguments)
        if takes_dtype and not any(a.name == "dtype" for a in func._schema.arguments):
            dtype_from = next(iter(out_names))

    run = getattr(inner, "raw", inner)  # skip wrapping a result that is written back

    def impl(args, kwargs):
        call_kwargs = (
            {k: v for k, v in kwargs.items() if k not in out_names} if drop_out else kwargs
        )
        if dtype_from is not None:
            call_kwargs["dtype"] = kwargs[dtype_from].dtype
        result = run(args, call_kwargs)
        results = (result,) if single or not isinstance(result, list | tuple) else tuple(result)
        outputs = []
        for i, (value, target) in enumerate(zip(results, targets, strict=False)):
            if target is None:
                outputs.append(_wrap(value))
                continue
            dst = kwargs[target] if isinstance(target, str) else args[target]
            if dst is value:
                outputs.append(dst)
                continue
            if isinstance(dst, list):  # e.g. _foreach_add_: one tensor per element
                for d, v in zip(dst, value, strict=True):
                    d._write(cast_for_write(func, d, v._value() if isinstance(v, Tensor) else v))
                outputs.append(None)
                continue
            new = value._value() if isinstance(value, Tensor) else value
            if target in out_names:
                if new.dtype != _JAX_DTYPES.get(dst.dtype):
                    _check_out_dtype(func, args, kwargs)
                if new.shape != dst.shape:
                    resize_output(func, dst, new.shape)
                    if functional in RESULT_LAYOUT_FROM_META:  # resized to PyTorch's layout
                        shapes = [getattr(r, "shape", ()) for r in results]
                        strides = result_strides(functional, args, call_kwargs, shapes)[i]
                        torch.ops.aten.as_strided_.default(dst, new.shape, strides)
            dst._write(_kept_in_place(dst, cast_for_write(func, dst, new)))
            outputs.append(dst)
        if not func._schema.returns:
            return None
        return outputs[0] if single else tuple(outputs)

    return impl


# -- resize_ ------------------------------------------------------------------------------------


def resize_(self, size, memory_format=None):
    """``resize_`` as PyTorch's: the tensor reads ``prod(size)`` storage elements from its
    storage offset on, row-major (for a transposed view: storage order, not its own).

    The tensor becomes a view of its storage, so aliases stay consistent. Growing past the
    storage would need elements a jax.Array does not have, so that raises.
    """
    size = [int(n) for n in size]
    numel = 1
    for n in size:
        numel *= n
    strides = make_contiguous_strides_for(size)
    if memory_format in (torch.channels_last, torch.channels_last_3d):
        strides = make_channels_last_strides_for(size)  # pyright: ignore[reportArgumentType]  (its stub's int-like protocol misses int)
    elif size == list(self.shape):
        return self
    storage = self._storage
    root = storage.array
    view = self._view
    offset = 0
    if view is not None and view.compute is not None and self.numel():
        if view.kind == REINTERPRET:
            raise NotImplementedError(
                "aten.resize_ on a view that reinterprets its base's dtype is not supported by "
                "torchlax; resize a copy (t.clone().resize_(...)) instead."
            )
        offset = _first_index(view, root)
    if offset + numel > root.size:
        return _grow(self, root, offset, size)

    order = memory_order(size, strides)  # channels_last: the storage holds NHWC
    stored = size if order is None else [size[d] for d in order]
    back = None if order is None else tuple(int(d) for d in np.argsort(order))

    def compute(array):
        elements = array.reshape(-1)[offset : offset + numel].reshape(stored)
        return elements if back is None else jnp.transpose(elements, back)

    kind = RESHAPE if offset == 0 and numel == root.size and back is None else GATHER
    with torch._C._DisableTorchDispatch():  # the wrapper's own sizes, checked against its storage
        torch.ops.aten.as_strided_.default(self, size, strides, self.storage_offset())
    self._view = _View(compute, kind, root, compute(root))
    return self


def _grow(self, root, offset: int, size: list) -> Tensor:
    """``resize_`` past the storage: a new, larger storage holding the old one's elements first.

    As PyTorch reallocates, so does this; the C++ tensor is pointed at a storage of the new
    size by PyTorch's own device-generic ``set_`` kernel. Other tensors that shared the old
    storage keep it (in PyTorch they would see the grown one).
    """
    numel = int(np.prod(size, dtype=np.int64))
    flat = jnp.zeros(offset + numel, root.dtype).at[: root.size].set(root.reshape(-1))
    grown = _make(flat)
    with torch._C._DisableTorchDispatch():
        _SET_STORAGE.redispatch(
            _CPU_KEYS,
            self,
            torch.Tensor.untyped_storage(grown),  # (the C++ one, not the addressed one)
            offset,
            size,
            make_contiguous_strides_for(size),
        )
    self._storage = grown._storage
    if offset == 0:
        self._storage.array = flat.reshape(size)
        self._view = None
    else:

        def compute(array):
            return array[offset:].reshape(size)

        self._view = _View(compute, GATHER, flat, compute(flat))
    return self


_SET_STORAGE = torch.ops.aten.set_.source_Storage_storage_offset
_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)  # set_'s kernel is device-generic


# -- set_ ---------------------------------------------------------------------------------------


def set_storage_(self, source, storage_offset=0, size=None, stride=None):
    """``set_(storage, offset, size, stride)``: ``self`` becomes a strided view of the storage
    of the jax tensor whose ``untyped_storage()`` is ``source``; writes go both ways."""
    storage = _tensor.storage_at(source)
    if storage is None:
        raise RuntimeError(
            "aten.set_: the source storage is not a jax tensor's storage; pass "
            "other.untyped_storage() of a tensor on the jax device."
        )
    root = storage.array
    if root.dtype != jax_dtype(self.dtype):
        raise NotImplementedError(
            f"aten.set_: a storage of {torch_dtype(root.dtype)} elements into a {self.dtype} "
            "tensor (a reinterpretation) is not supported by torchlax; view the source with "
            ".view(dtype) instead."
        )
    if size is None:  # set_(storage): all of it, 1-d
        size = [int(source.nbytes()) // self.element_size()]
    size = [int(n) for n in size]
    stride = make_contiguous_strides_for(size) if stride is None else [int(n) for n in stride]
    offset = int(storage_offset)
    last = offset + sum((n - 1) * st for n, st in zip(size, stride, strict=True))
    if 0 not in size and last >= root.size:
        # PyTorch grows the storage in place; other tensors hold this jax array by its shape.
        raise RuntimeError(
            f"aten.set_: the new view reads storage element {last}, past the storage's "
            f"{root.size} elements, and torchlax cannot grow a storage that other tensors "
            "share; resize_ the source tensor first (or set_ a view that fits)."
        )
    with torch._C._DisableTorchDispatch():  # PyTorch's own checks and the wrapper's metadata
        _SET_STORAGE.redispatch(
            _CPU_KEYS, self, torch.Tensor.untyped_storage(_make(root)), offset, size, stride
        )
    positions = offset + sum(
        (np.arange(n).reshape([-1] + [1] * (len(size) - 1 - d)) * st)
        for d, (n, st) in enumerate(zip(size, stride, strict=True))
    )
    positions = np.broadcast_to(np.asarray(positions, np.int64), size)

    def compute(array):
        return array.reshape(-1)[positions]

    self._storage = storage
    self._view = _View(compute, GATHER, root, compute(root))
    return self


def set_tensor_(self, source):
    """``set_(tensor)``: ``self`` shares ``source``'s storage, offset, sizes and strides."""
    with torch._C._DisableTorchDispatch():
        _SET_STORAGE.redispatch(
            _CPU_KEYS,
            self,
            torch.Tensor.untyped_storage(source),  # (the C++ one, not the addressed one)
            source.storage_offset(),
            source.shape,
            source.stride(),
        )
    self._alias_of(source)
    return self


def resize_output(func, out: Tensor, shape: tuple) -> None:
    """An ``out=`` tensor of another shape is resized, as PyTorch's ``resize_output`` does."""
    if out.numel():
        warnings.warn(
            f"{op_name(func)}: An output with one or more elements was resized since it had "
            f"shape {list(out.shape)}, which does not match the required output shape "
            f"{list(shape)}. This behavior is deprecated, and in a future PyTorch release outputs "
            "will not be resized unless they have zero elements. You can explicitly reuse an out "
            "tensor t by resizing it, inplace, to zero elements with t.resize_(0).",
            UserWarning,
            stacklevel=2,
        )
    resize_(out, shape)


def resize_as_(self, the_template, *, memory_format=None):
    if memory_format is torch.preserve_format:
        memory_format = suggest_memory_format(the_template)
    return resize_(self, the_template.shape, memory_format)
