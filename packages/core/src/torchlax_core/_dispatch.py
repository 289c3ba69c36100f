"""How one ATen op runs on torchlax Tensors: unwrap, call the lowering, wrap.

``Environment._resolve`` builds one ``impl(args, kwargs)`` per op overload, once; the eager hot
path is then ``Tensor.__torch_dispatch__`` -> ``impl``. Each impl is specialised for its op:

- plain ops unwrap only the argument positions the schema types as tensors (an "unwrap plan");
- view ops return tensors that share their base's storage (``_tensor._View``);
- in-place and ``out=`` overloads run the functional lowering and write the result back.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import torch
import torch.utils._pytree
from torch._prims_common import (
    make_channels_last_strides_for,
    make_contiguous_strides_for,
    suggest_memory_format,
)

from . import _opcache, _tensor
from ._dtypes import jax_dtype, scalar_type_name, torch_dtype
from ._errors import DeviceMismatchError
from ._iterator_layout import iterator_layout, row_major_strides
from ._registry import op_name
from ._tensor import (
    GATHER,
    IDENTITY,
    REINTERPRET,
    RESHAPE,
    Tensor,
    _first_index,
    _from_cpu,
    _make,
    _View,
)
from ._x64 import x64, x64_flag

_ArrayImpl = type(jnp.zeros(()))
_JAX_DTYPES = {t: jax_dtype(t) for t in _tensor._DTYPES.values()}


# -- unwrapping and wrapping --------------------------------------------------------------------


class _ForeignTensor(Exception):
    def __init__(self, tensor, position):
        self.tensor = tensor
        self.position = position


def _unwrap(x, position=None):
    """Any argument value -> what a lowering sees (arrays for tensors, recursively in lists)."""
    if isinstance(x, Tensor):
        return x._value()
    if isinstance(x, torch.Tensor):
        # PyTorch lets a 0-d CPU tensor act as a scalar next to tensors on any device.
        if x.dim() == 0 and x.device.type == "cpu":
            return _from_cpu(x)
        raise _ForeignTensor(x, position)
    if type(x) is list or type(x) is tuple:
        return type(x)(_unwrap(y, position) for y in x)
    return x


def _unwrap_deferring(x, position):
    """``_unwrap`` of one tensor of a list argument, a deferred view as ``_opcache.Pending``."""
    if type(x) is Tensor:
        view = x._view
        if view is not None and view.seen is None:
            return _opcache.Pending(x, x._storage.array, view.compute, view.compute.recipe)
    return _unwrap(x, position)


def _wrap(x):
    """A lowering's result -> Tensors (recursively in lists and tuples)."""
    if type(x) is _ArrayImpl or isinstance(x, jax.Array):
        return _make(x)
    if type(x) is list or type(x) is tuple:
        return type(x)(_wrap(y) for y in x)
    return x


def _is_tensor_type(t) -> bool:
    if isinstance(t, torch.TensorType):
        return True
    if isinstance(t, torch.OptionalType | torch.ListType):
        return _is_tensor_type(t.getElementType())
    return False


def _unwrap_plan(func) -> tuple[tuple[int, ...], bool]:
    """(positions of tensor-typed arguments, whether any kwarg-only argument is a tensor)."""
    schema = getattr(func, "_schema", None)
    if schema is None:  # not an ATen overload: look at everything
        return (), True
    positions = tuple(
        i for i, a in enumerate(schema.arguments) if not a.kwarg_only and _is_tensor_type(a.type)
    )
    tensor_kwargs = any(a.kwarg_only and _is_tensor_type(a.type) for a in schema.arguments)
    return positions, tensor_kwargs


def release(args) -> None:
    """Clear the exclusivity of every torchlax Tensor in ``args`` (see ``_tensor._Storage``):
    for an op whose lowering runs plainly, which may return an input's array unchanged."""
    for a in args:
        if type(a) is Tensor or isinstance(a, Tensor):
            a._storage.exclusive = False
        elif type(a) is list or type(a) is tuple:
            release(a)


def _make_unwrapper(func, defer_views: bool = False) -> Callable:
    """``unwrap(args, kwargs) -> (arrays, kwargs)`` specialised to ``func``'s schema.

    On the hot path: one call, no helper calls for a plain Tensor argument. With
    ``defer_views`` (cached ops) a deferred view not computed yet comes as ``_opcache.Pending``.
    It reads arrays without handing them out (``_peek``): the caller decides (``release``).
    """
    positions, tensor_kwargs = _unwrap_plan(func)
    by_schema = getattr(func, "_schema", None) is not None
    cpu_index_positions = _cpu_index_positions(func)
    several_devices = _several_devices()  # fixed for the process once JAX has started

    def unwrap(args, kwargs):
        try:
            if by_schema:
                jargs = list(args)
                n = len(jargs)
                for i in positions:
                    if i >= n:
                        break
                    a = jargs[i]
                    if type(a) is Tensor:
                        view = a._view
                        if view is None:
                            jargs[i] = a._storage.array
                        elif defer_views and view.seen is None:
                            jargs[i] = _opcache.Pending(
                                a, a._storage.array, view.compute, view.compute.recipe
                            )
                        else:
                            jargs[i] = a._peek()
                    elif defer_views and type(a) is list:  # cat's tensors
                        jargs[i] = [_unwrap_deferring(x, i) for x in a]
                    elif a is not None:
                        jargs[i] = _unwrap(a, i)
            else:  # not an ATen overload: look at everything
                jargs = [_unwrap(a, i) for i, a in enumerate(args)]
            if kwargs and tensor_kwargs:
                kwargs = {k: _unwrap(v, k) for k, v in kwargs.items()}
        except _ForeignTensor as exc:
            if exc.position in cpu_index_positions:
                args = list(args)
                args[exc.position] = [
                    _from_cpu(t) if _is_cpu_tensor(t) else t for t in args[exc.position]
                ]
                return unwrap(args, kwargs)
            raise _foreign_tensor_error(func, exc) from None
        if several_devices:
            _check_one_device(func, args, positions)
        return jargs, kwargs

    return unwrap


@functools.cache
def _several_devices() -> bool:
    return jax.device_count() > 1


def _check_one_device(func, args, positions) -> None:
    """PyTorch's rule for ``jax:0 + jax:1``: tensors of one op must be on one device (JAX would
    quietly compute on one of them). Only single-device arrays are compared: a sharded array
    spans devices by design."""
    first = None
    for i in positions or range(len(args)):
        if i >= len(args):
            break
        for a in args[i] if type(args[i]) in (list, tuple) else (args[i],):  # cat's tensors
            if type(a) is not Tensor:
                continue
            if first is None:
                first = (i, a)
            elif a.device != first[1].device and _single_device(a) and _single_device(first[1]):
                _raise_mismatch(func, first, (i, a))


def _raise_mismatch(func, first, second) -> None:
    schema = func._schema.arguments if getattr(func, "_schema", None) else None
    names = [
        f"argument '{schema[k].name}'" if schema and k < len(schema) else f"argument {k}"
        for k in (first[0], second[0])
    ]
    raise DeviceMismatchError(
        f"{op_name(func)} got tensors on different devices: {first[1].device} as {names[0]} "
        f"and {second[1].device} as {names[1]}. Expected all tensors to be on the same device: "
        "move one first, e.g. with tensor.to(other.device)."
    )


def _single_device(t) -> bool:
    array = t._storage.array
    return not isinstance(array, jax.core.Tracer) and len(array.devices()) == 1


def _cpu_index_positions(func) -> frozenset[int]:
    """Arguments PyTorch lets stay on the CPU next to tensors on any device: ``x[cpu_index]``."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return frozenset()
    return frozenset(
        i
        for i, a in enumerate(schema.arguments)
        if a.name == "indices" and isinstance(a.type, torch.ListType)
    )


def _is_cpu_tensor(t) -> bool:
    return isinstance(t, torch.Tensor) and not isinstance(t, Tensor) and t.device.type == "cpu"


def _foreign_tensor_error(func, exc: _ForeignTensor) -> DeviceMismatchError:
    arg = "an argument"
    schema = getattr(func, "_schema", None)
    if (
        schema is not None
        and isinstance(exc.position, int)
        and exc.position < len(schema.arguments)
    ):
        arg = f"argument '{schema.arguments[exc.position].name}'"
    elif isinstance(exc.position, str):
        arg = f"argument '{exc.position}'"
    return DeviceMismatchError(
        f"{op_name(func)} got a tensor on device {exc.tensor.device} as {arg}, next to torchlax "
        "Tensors on device jax. Only 0-d CPU tensors mix with jax tensors (as scalars). Move it "
        "first with tensor.to('jax') inside torchlax.enable(), or torchlax.from_torch(tensor)."
    )


def _call(fn, jargs, jkwargs):
    """Run a lowering with JAX's 64-bit mode on (entering it only when it is off).

    Implementations run under ``_run.run_op``, which turns the mode on; this is for what runs
    later, outside any op: a view recomputing itself from its storage when read.
    """
    if x64_flag.value:
        return fn(*jargs, **jkwargs)
    with x64():
        return fn(*jargs, **jkwargs)


# -- one impl per op ----------------------------------------------------------------------------


def lowering_impl(func, fn, cache: _opcache.OpCache | None = None) -> Callable:
    schema = getattr(func, "_schema", None)
    if schema is not None and schema.is_mutable:
        return derived_mutation_impl(func, None, plain_impl(func, fn))
    if getattr(func, "is_view", False) and torch.Tag.inplace_view not in func.tags:
        if func is torch.ops.aten.as_strided.default:
            return as_strided_impl(func, fn)
        return view_impl(func, fn)
    if cache is not None and _opcache.cacheable_op(func):
        if func not in RESULT_LAYOUT_FROM_META and keeps_layout(func):
            return cached_impl(func, fn, cache, keeps_layout=True)
        impl = cached_impl(func, fn, cache)
    else:
        impl = plain_impl(func, fn)
    if func in RESULT_LAYOUT_FROM_META:
        return meta_layout_impl(func, impl)
    return memory_order_impl(func, impl) if keeps_layout(func) else impl


# Ops whose results PyTorch does not lay out row-major, and whose layout its meta kernel gives:
# nonzero's (n, ndim) is allocated transposed, strides (1, n); the fused attention ops' outputs
# (the CPU flash kernel's, and the overrideable one a PrivateUse1 device such as `jax` takes)
# are laid out as their query is, and the overrideable backward's gradients as their inputs
# (a traced graph after them may ``view`` them accordingly).
RESULT_LAYOUT_FROM_META = frozenset(
    {
        torch.ops.aten.nonzero.default,
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
        torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default,
        torch.ops.aten._scaled_dot_product_fused_attention_overrideable_backward.default,
    }
)


def meta_layout_impl(func, inner: Callable) -> Callable:
    """``inner`` with its results stored with the strides PyTorch's meta kernel gives them."""
    run = inner.raw  # pyright: ignore[reportFunctionMemberAccess]  (plain_impl/cached_impl set it)

    def impl(args, kwargs):
        out = run(args, kwargs)
        results = out if isinstance(out, tuple | list) else (out,)
        # (a result that is no array, such as a gradient not asked for, has no layout)
        shapes = [r.shape if isinstance(r, jax.Array) else None for r in results]
        strides = result_strides(func, args, kwargs, shapes)
        laid_out = [
            _wrap(r) if s is None else _laid_out(r, s, deferred=True)
            for r, s in zip(results, strides, strict=True)
        ]
        return laid_out[0] if results is not out else type(out)(laid_out)

    impl.raw = run  # pyright: ignore[reportFunctionMemberAccess]  (out= lays out its own tensor)
    return impl


# (op, arguments' sizes/strides/dtypes and other values) -> each result's (sizes, strides), with
# a data-dependent size (nonzero's row count) as a sympy symbol
_RESULT_LAYOUTS: dict = {}


def result_strides(func, args, kwargs, shapes: list) -> list[tuple[int, ...] | None]:
    """The strides PyTorch gives ``func``'s results of these ``shapes`` for these arguments.

    Its meta kernel runs once per argument signature, under a fake tensor mode whose shape
    environment stands a symbol in for a size that depends on values; the result's actual
    size is bound to that symbol here.
    """
    key = (func, _layout_key(args), _layout_key(kwargs))
    hit = _RESULT_LAYOUTS.get(key)
    if hit is None:
        hit = _meta_results(func, args, kwargs)
        if len(_RESULT_LAYOUTS) < 4096:
            _RESULT_LAYOUTS[key] = hit
    return [
        None if shape is None else _bound(sizes, strides, shape)
        for (sizes, strides), shape in zip(hit, shapes, strict=False)
    ]


def _layout_key(x):
    if isinstance(x, torch.Tensor):
        return ("tensor", tuple(x.shape), x.stride(), x.dtype)
    if type(x) is list or type(x) is tuple:
        return tuple(_layout_key(y) for y in x)
    if type(x) is dict:
        return tuple(sorted((k, _layout_key(v)) for k, v in x.items()))
    return x


def _meta_results(func, args, kwargs) -> list[tuple[tuple, tuple]]:
    # Lazily: sympy and the fake tensor mode cost an import that ops outside the set never pay.
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    def expression(n):
        return n.node.expr if isinstance(n, torch.SymInt) else int(n)

    with FakeTensorMode(shape_env=ShapeEnv(allow_dynamic_output_shape_ops=True)):
        fake_args, fake_kwargs = torch.utils._pytree.tree_map_only(
            torch.Tensor,
            lambda t: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype),
            (args, kwargs),
        )
        out = func(*fake_args, **fake_kwargs)
    results = out if isinstance(out, tuple | list) else (out,)
    return [
        (tuple(map(expression, r.shape)), tuple(map(expression, r.stride())))
        if isinstance(r, torch.Tensor)
        else ((), ())
        for r in results
    ]


def _bound(sizes: tuple, strides: tuple, shape) -> tuple[int, ...]:
    symbols = {size: n for size, n in zip(sizes, shape, strict=True) if not isinstance(size, int)}
    return tuple(s if isinstance(s, int) else int(s.xreplace(symbols)) for s in strides)


def memory_order(shape, strides) -> tuple[int, ...] | None:
    """The dimensions from outermost to innermost in memory where ``strides`` are a permutation
    of a dense layout other than row-major (a transposed result), else None (row-major, empty,
    or overlapping/with gaps: a view's)."""
    if 0 in shape or tuple(strides) == row_major_strides(tuple(shape)):
        return None
    order = tuple(sorted(range(len(shape)), key=lambda d: -strides[d]))
    dense = 1
    for d in reversed(order):
        if strides[d] != dense and shape[d] != 1:
            return None
        dense *= shape[d]
    return order


def _laid_out(array, strides: tuple[int, ...], deferred: bool = False) -> Tensor:
    """``array`` as a Tensor with ``strides``, a permutation of a dense layout: its storage holds
    the array transposed to that dimension order, and the tensor views it transposed back.

    ``deferred``: the tensor's own value is left to compute (a deferred view of its storage),
    for results that the next op reads in their logical order (attention's output, which GPT-2
    transposes and reshapes before its projection): views of a deferred view are deferred too
    and fold into the next cached op's executable, where a computed value would make each of
    them a JAX dispatch of its own. Reading the value costs one transpose back. (A traced
    array keeps its value: it costs nothing.)
    """
    order = _storage_order(tuple(array.shape), tuple(strides))
    if order is None:
        return _make(array)
    value = None if deferred and type(array) is _ArrayImpl else array
    return stored_in_order(_transposed(array, order), order, strides, value=value)


@functools.lru_cache(maxsize=4096)
def _storage_order(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...] | None:
    """The dimension order in which a result of ``shape`` with ``strides`` (a permutation of a
    dense layout) is stored; None where that is row-major. Remembered: a model's ops meet the
    same few layouts on every call. (An empty result keeps the strides it is given, PyTorch's,
    with nothing to reorder.)"""
    if strides == row_major_strides(shape):
        return None
    return memory_order(shape, strides) or tuple(range(len(shape)))


def _transposed(array, order: tuple[int, ...]):
    """``jnp.transpose(array, order)``; a concrete array through a jitted transpose, one C++
    launch instead of ``jax.numpy``'s Python dispatch."""
    if type(array) is _ArrayImpl:
        return _transposer(order)(array)
    return jnp.transpose(array, order)


@functools.cache
def _transposer(order: tuple[int, ...]) -> Callable:
    return jax.jit(functools.partial(jnp.transpose, axes=order))


class _TransposedBack:
    """The view of a tensor stored in memory order: its storage array transposed back."""

    __slots__ = ("axes", "recipe")

    def __init__(self, axes: tuple[int, ...]):
        self.axes = axes
        self.recipe = ((_TransposedBack, axes),)  # what the op cache keys a deferred view on

    def __call__(self, array):
        return jnp.transpose(array, self.axes)


@functools.lru_cache(maxsize=1024)
def _inverse(order: tuple[int, ...]) -> tuple[int, ...]:
    """The permutation that undoes ``order``."""
    return tuple(int(d) for d in np.argsort(order))


@functools.lru_cache(maxsize=1024)
def _transposed_back(back: tuple[int, ...]) -> _TransposedBack:
    """One ``_TransposedBack`` per permutation (it holds nothing else): views of it then share
    their recompute functions (``_deferred_compute``)."""
    return _TransposedBack(back)


def stored_in_order(stored, order, strides=None, value=None) -> Tensor:
    """The Tensor of ``strides`` (a dense layout, dimension ``order[0]`` outermost) whose
    storage is ``stored``, its elements in memory order (the tensor transposed to ``order``).

    The one constructor of a tensor laid out other than row-major, for eager results and
    compiled programs' outputs alike. ``strides`` default to the dense layout of ``order``
    (``stored``'s row-major strides, put back in the tensor's dimension order); an empty
    result passes PyTorch's own. The tensor views its storage transposed back; without
    ``value`` that transpose is computed when first read, or inside the next cached op (a
    deferred view), so a chain of ops that all run in memory order never transposes.
    """
    back = _inverse(tuple(order))
    compute = _transposed_back(back)
    if strides is None:
        dense = row_major_strides(tuple(stored.shape))
        strides = tuple(dense[d] for d in back)
    layout = (tuple(strides), 0, int(stored.size) * stored.dtype.itemsize)
    storage = _tensor._Storage(stored)
    if value is None and type(stored) is _ArrayImpl:
        shape = tuple(stored.shape[d] for d in back)
        aval = _Aval(shape, stored)
        view = _View(compute, GATHER, None, None)
        return _make(aval, storage, view, layout=layout, device=_tensor._device_of(stored))  # pyright: ignore[reportArgumentType]  (_make reads shape, dtype)
    if value is None:  # traced: the transpose costs nothing at run time
        value = compute(stored)
    return _make(value, storage, _View(compute, GATHER, stored, value), layout=layout)


def viewed_back(stored: torch.Tensor, order: tuple[int, ...]) -> torch.Tensor:
    """A compiled program's output ``stored`` (its dimensions in memory order, ``order``) with
    its dimensions put back: a tensor of its own, not a view (``_base`` is None), as the eager
    op that made it returns. A torchlax Tensor is laid out as an eager result is (its
    transpose deferred to its first read); a CPU or CUDA tensor shares ``stored``'s memory."""
    if isinstance(stored, Tensor):
        return stored_in_order(stored._value(), order)
    back = _inverse(tuple(order))
    shape = [stored.shape[d] for d in back]
    strides = [stored.stride(d) for d in back]
    with torch.no_grad():
        out = torch.empty(0, dtype=stored.dtype, device=stored.device)
        return out.set_(stored.untyped_storage(), stored.storage_offset(), shape, strides)


def memory_ordered_array(tensor: Tensor, order: tuple[int, ...] | None = None):
    """``(array, order)``: ``tensor``'s elements in memory order (``order`` from
    ``memory_order``, unless the caller knows it), taken from its storage where that holds
    exactly them (a transposed view, a result stored in order); None for a row-major or
    non-dense tensor."""
    if order is None:
        order = memory_order(tuple(tensor.shape), tensor.stride())
    if order is None:
        return None
    shape = tuple(tensor.shape[d] for d in order)
    stored = _own_storage(tensor, shape)
    if stored is None:
        stored = jnp.transpose(tensor._value(), order)
    return stored, order


def _own_storage(tensor: Tensor, shape):
    """The storage array of a dense ``tensor`` that holds exactly its elements (in memory
    order, as ``shape``), else None (a part of the storage, another dtype, a conjugate)."""
    view = tensor._view
    storage = tensor._storage
    array = storage.array
    if (
        (view is not None and view.kind == REINTERPRET)
        or tensor.storage_offset() != 0
        or array.size != tensor.numel()
        or array.dtype != _JAX_DTYPES[tensor.dtype]
    ):
        return None
    storage.exclusive = False  # read by an op (see _tensor._Storage)
    return array if array.shape == shape else array.reshape(shape)


# Ops whose result PyTorch lays out as their input (TensorIterator's memory order, or
# ``memory_format=torch.preserve_format``), besides those tagged pointwise.
_LAYOUT_KEEPING = frozenset(
    {
        torch.ops.aten.zeros_like.default,
        torch.ops.aten.ones_like.default,
        torch.ops.aten.full_like.default,
        torch.ops.aten.empty_like.default,
        torch.ops.aten.rand_like.default,
        torch.ops.aten.randn_like.default,
    }
)


# Pointwise ops whose CPU kernels give row-major results whatever their inputs' layout
# (``masked_fill`` clones its input contiguously, ``pow(number, t)`` allocates row-major,
# ``rrelu`` writes into a row-major ``empty_like`` of its noise);
# tests/core/test_strides_layout.py checks the rule against the CPU for every pointwise op.
_ROW_MAJOR_POINTWISE = frozenset(
    {
        torch.ops.aten.masked_fill.Scalar,
        torch.ops.aten.masked_fill.Tensor,
        torch.ops.aten.pow.Scalar,
        torch.ops.aten.float_power.Scalar,
        torch.ops.aten.rrelu.default,
    }
)


def keeps_layout(func) -> bool:
    if func in _ROW_MAJOR_POINTWISE:
        return False
    return torch.Tag.pointwise in func.tags or func in _LAYOUT_KEEPING


# Ops whose TensorIterator takes the tensor arguments in another order than the schema's.
_OPERAND_ORDER = {torch.ops.aten.threshold_backward.default: (1, 0)}


def _operand_positions(func) -> tuple[int, ...] | None:
    """The argument positions that are TensorIterator operands of ``func``, in its order:
    tensor arguments, and a number given for ``self``/``other`` (ATen wraps it as a 0-d
    tensor, which makes the op take the general, stride-sorting path). None: not an ATen
    overload, every tensor argument counts."""
    if func in _OPERAND_ORDER:
        return _OPERAND_ORDER[func]
    schema = getattr(func, "_schema", None)
    if schema is None:
        return None
    return tuple(
        i
        for i, a in enumerate(schema.arguments)
        if not a.kwarg_only
        and (
            _is_tensor_type(a.type)
            or (isinstance(a.type, torch.NumberType) and a.name in ("self", "other"))
        )
    )


def memory_order_impl(func, inner: Callable) -> Callable:
    """``inner`` (a pointwise op) laying its result out as PyTorch's TensorIterator does.

    The result's strides follow the tensor arguments' (``_iterator_layout``). Where they are
    not row-major and every tensor argument that is not 0-d has exactly the result's dense
    layout and owns its storage array, the op runs on the storage arrays, which hold the
    elements in that order, and the result is stored the same way: no transpose, no new
    compile. Otherwise (mixed layouts, broadcast operands, slices) the op runs on the values
    and its result is transposed once into memory order. Arguments that are all roots
    (row-major, the common case) cost one attribute check per argument.
    """
    run = inner.raw  # pyright: ignore[reportFunctionMemberAccess]  (plain_impl/cached_impl set it)
    positions = _operand_positions(func)

    def impl(args, kwargs):
        if kwargs and kwargs.get("memory_format") in _CHANNELS_LAST:
            out = run(args, kwargs)  # asked for: x.contiguous(memory_format=channels_last)
            rank, name = (4, "channels_last")
            if kwargs["memory_format"] is torch.channels_last_3d:
                rank, name = (5, "channels_last_3d")
            if out.ndim != rank:
                raise RuntimeError(f"required rank {rank} tensor to use {name} format")
            return _laid_out(out, make_channels_last_strides_for(out.shape))
        for a in args:
            if type(a) is Tensor and a._view is not None:
                return _in_iterator_order(inner, run, positions, args, kwargs)
        return inner(args, kwargs)

    impl.raw = run  # pyright: ignore[reportFunctionMemberAccess]  (in-place and out= write their own tensor)
    return impl


_CHANNELS_LAST = (torch.channels_last, torch.channels_last_3d)
_NUMBERS = (int, float, bool, complex)
_NUMBER_OPERAND = ((), ())  # a number ATen wraps as a 0-d tensor


def _in_iterator_order(inner: Callable, run: Callable, positions, args, kwargs):
    """``inner(args, kwargs)`` with its results laid out as TensorIterator lays them out."""
    if kwargs:
        fmt = kwargs.get("memory_format")
        if fmt is not None and fmt is not torch.preserve_format:
            return inner(args, kwargs)  # contiguous_format: row-major
    given = args if positions is None else [args[i] for i in positions if i < len(args)]
    operands = tuple(
        (a.shape, a.stride()) if isinstance(a, torch.Tensor) else _NUMBER_OPERAND
        for a in given
        if isinstance(a, torch.Tensor) or (positions is not None and type(a) in _NUMBERS)
    )
    if kwargs:
        operands += tuple(
            (a.shape, a.stride()) for a in kwargs.values() if isinstance(a, torch.Tensor)
        )
    layout = iterator_layout(operands) if operands else None
    if layout is None:
        return inner(args, kwargs)
    shape, strides = layout
    stored = _memory_ordered_args(args, kwargs, shape, strides, getattr(run, "defers_views", False))
    if stored is not None:
        out = run(stored[0], kwargs)
        order = stored[1]
        if isinstance(out, tuple | list):
            return type(out)(stored_in_order(r, order, strides) for r in out)
        return stored_in_order(out, order, strides)
    out = run(args, kwargs)
    if isinstance(out, tuple | list):
        return type(out)(_laid_out(r, strides) if isinstance(r, jax.Array) else r for r in out)
    return _laid_out(out, strides) if isinstance(out, jax.Array) else _wrap(out)


def _memory_ordered_args(args, kwargs, shape, strides, defer: bool = False):
    """``(args with each tensor's elements in the result's memory order, order)``, the result
    being dense with ``strides``: a tensor of exactly that layout that owns its storage array
    gives that array (no copy); any other (a broadcast operand, another layout, a slice) its
    value, rank-aligned and transposed to that order. None where the result's layout is not
    a permutation (an empty result) or an argument is not a torchlax Tensor.

    With ``defer`` (the op is cached) a full-rank argument's transpose is not computed: it is
    passed as a deferred view of its value, which the op's executable applies itself, so XLA
    reads the argument transposed inside the op instead of copying it first (``x.t() + y``
    with ``y`` row-major)."""
    if kwargs and any(isinstance(v, torch.Tensor) for v in kwargs.values()):
        return None
    order = memory_order(shape, strides)
    if order is None:
        return None
    ordered_shape = tuple(shape[d] for d in order)
    ndim = len(shape)
    stored = list(args)
    for i, a in enumerate(args):
        if not isinstance(a, torch.Tensor) or a.dim() == 0:
            continue
        if type(a) is not Tensor:
            return None
        if a.shape == shape and a.stride() == strides:
            array = _own_storage(a, ordered_shape)
            if array is not None:
                stored[i] = array
                continue
        value = a._value()
        offset = ndim - value.ndim
        if offset == 0:
            if defer and type(value) is _ArrayImpl:
                transpose = _TransposedBack(order)
                stored[i] = _opcache.Pending(
                    _TransposedOperand(value, order), value, transpose, transpose.recipe
                )
            else:
                stored[i] = jax.lax.transpose(value, order)
        else:  # one op: transpose its own dimensions, then insert the leading size-1 ones
            own = tuple(d - offset for d in order if d >= offset)
            aligned = (1,) * offset + tuple(value.shape)
            stored[i] = jax.lax.reshape(value, tuple(aligned[d] for d in order), own)
    return stored, order


class _TransposedOperand:
    """The tensor of a ``Pending`` transpose that ``_memory_ordered_args`` passes a cached op:
    computed only where the op runs its lowering plainly (``_opcache.materialize``)."""

    __slots__ = ("array", "order")

    def __init__(self, array, order: tuple[int, ...]):
        self.array = array
        self.order = order

    def _value(self):
        return jax.lax.transpose(self.array, self.order)


def plain_impl(func, fn) -> Callable:
    unwrap = _make_unwrapper(func)

    def raw(args, kwargs):
        jargs, jkwargs = unwrap(args, kwargs)
        release(args)
        release(kwargs.values())
        return fn(*jargs, **jkwargs)

    def impl(args, kwargs):
        jargs, jkwargs = unwrap(args, kwargs)
        release(args)
        release(kwargs.values())
        out = fn(*jargs, **jkwargs)
        if type(out) is _ArrayImpl:
            return _make(out)
        return _wrap(out)

    impl.raw = raw  # arrays out, for in-place and out= variants that write them back  # pyright: ignore[reportFunctionMemberAccess]  (an attribute of our own on the function)
    return impl


def cached_impl(func, fn, cache: _opcache.OpCache, keeps_layout: bool = False) -> Callable:
    """``plain_impl`` with the eager op cache in front (see ``_opcache``).

    A hit is: the signature built straight from the call's Tensors (``hit_key``), one dict
    lookup, one executable launch, and a wrap that takes the result's shape, dtype and device
    from the entry (reading them off a fresh array costs more than the rest of the wrap).
    Any call ``hit_key`` does not take, and every miss, goes the general way: unwrap, then
    ``_opcache.signature`` of the unwrapped arguments (the same key).

    ``keeps_layout``: a pointwise op, whose result follows its arguments' layout
    (``memory_order_impl``). A hit of root Tensors alone (row-major, the common case) is served
    before that rule, which would only call through to it: each Python frame between two
    launches also slows the next launch down (docs/architecture.md).
    """
    unwrap = _make_unwrapper(func, defer_views=True)
    materialize = _opcache.materialize
    entries = cache.entries
    refused = cache.refused
    stats = cache.stats
    config = cache.config
    signature = _opcache.signature
    compiling_suspended = _opcache.compiling_suspended
    not_cacheable = _opcache.NotCacheable
    new_tensor = _tensor._make_wrapper_subclass
    storage = _tensor._Storage
    strided = torch.strided
    op = cache.op(func)
    hit_key = _make_hit_key(func, op)
    roots_hit_key = _make_hit_key(func, op, roots_only=True) if keeps_layout else hit_key

    def lookup(jargs, jkwargs) -> tuple:
        """(entry or None, key, leaves); key is None when this call is not cacheable."""
        if not config.op_cache_size:
            return None, None, None
        leaves: list = []
        try:
            key = signature(op, jargs, jkwargs, leaves)
        except not_cacheable:  # a tracer (inside a JAX trace), a generator, ...
            return None, None, None
        entry = entries.get(key)
        if entry is None:
            if key in refused:  # (it reads values on the host, draws keys, ...)
                return None, None, None
            stats.misses += 1
        else:
            stats.hits += 1
            entry.used = True  # (the LRU's second chance: OpCache.insert)
        return entry, key, leaves

    def hit(args, kwargs) -> tuple:
        """(entry, leaves) of a call ``hit_key`` takes and the cache holds, else (None, None)."""
        if not config.op_cache_size:
            return None, None
        leaves: list = []
        key = hit_key(args, kwargs, leaves)
        if key is None:
            return None, None
        entry = entries.get(key)
        if entry is None:
            return None, None  # (the general path counts the miss)
        stats.hits += 1
        entry.used = True
        return entry, leaves

    def miss(key, jargs, jkwargs, leaves):
        calls = cache.note_seen(key)
        min_calls = cache.min_calls()
        probed = None
        once = compiling_suspended()
        if calls < min_calls or calls == 1 or once:
            # The first call of a signature runs plainly, counting host reads.
            try:
                out = _opcache.run_probed(cache, key, func, fn, materialize(jargs), jkwargs)
            except BaseException:
                # A call that raised (bad arguments) counts for nothing: compiled on a repeat,
                # its trace would raise too and mark the whole op never cacheable.
                cache.seen.pop(key, None)
                raise
            if calls < min_calls or key in refused or once:
                return None, out
            # op_cache_min_calls=1: compile now and answer with the executable (so that
            # tests run each op's compiled form once).
            probed = (out,)
        entry = _opcache.compile_entry(cache, key, func, fn, jargs, jkwargs, leaves)
        if entry is None:
            if probed is not None:  # not run a second time: a random op would draw again
                return None, probed[0]
            return None, fn(*materialize(jargs), **jkwargs)
        cache.insert(_opcache.keyed(cache, func, key), entry)
        out = entry.call(*leaves)
        entry.launch_directly()
        return entry, out

    def general_raw(args, kwargs):
        jargs, jkwargs = unwrap(args, kwargs)
        entry, key, leaves = lookup(jargs, jkwargs)
        if entry is not None:
            try:
                return entry.call(*leaves)
            except (ValueError, TypeError):  # inputs on other devices than it was compiled for
                return entry.relax()(*leaves)
        release(args)  # run plainly from here on
        release(kwargs.values())
        if key is None:
            return fn(*materialize(jargs), **jkwargs)
        return miss(key, jargs, jkwargs, leaves)[1]

    def raw(args, kwargs):
        entry, leaves = hit(args, kwargs)
        if entry is None:
            return general_raw(args, kwargs)
        try:
            return entry.call(*leaves)
        except (ValueError, TypeError):  # inputs on other devices than it was compiled for
            return entry.relax()(*leaves)

    def general(args, kwargs):
        jargs, jkwargs = unwrap(args, kwargs)
        entry, key, leaves = lookup(jargs, jkwargs)
        if entry is None:
            release(args)  # run plainly
            release(kwargs.values())
            if key is None:
                out = fn(*materialize(jargs), **jkwargs)
            else:
                entry, out = miss(key, jargs, jkwargs, leaves)
                if entry is not None and entry.meta is None:
                    entry.learn(out)
            return _make(out) if type(out) is _ArrayImpl else _wrap(out)
        return wrap_hit(entry, leaves)

    def wrap_hit(entry, leaves):
        meta = entry.meta
        try:
            out = entry.call(*leaves)
        except (ValueError, TypeError):
            out = entry.relax()(*leaves)
            meta = None
        if meta is None:
            return _wrap(out)
        # Positional (size, strides, storage_offset, memory_format, dtype, layout, device):
        # PyTorch's argument parser matches keywords by name, ~0.4-0.7 us a result more.
        r = new_tensor(Tensor, meta[0], None, None, None, meta[1], strided, meta[2])
        r._storage = storage(out)
        r._view = None
        return r

    def launch_hit(entry, leaves):
        """Count the hit, launch ``entry`` and wrap its result (``serve_hit``'s second half)."""
        stats.hits += 1
        entry.used = True  # (the LRU's second chance: OpCache.insert)
        meta = entry.meta
        if meta is None:
            return wrap_hit(entry, leaves)
        try:
            out = entry.call(*leaves)
        except (ValueError, TypeError):
            return _wrap(entry.relax()(*leaves))
        r = new_tensor(Tensor, meta[0], None, None, None, meta[1], strided, meta[2])
        r._storage = storage(out)
        r._view = None
        return r

    def serving(otherwise: Callable, key_of: Callable) -> Callable:
        """``impl(args, kwargs)``: a hit (``serve_hit``), else ``otherwise``."""

        def impl(args, kwargs):
            out = serve_hit(args, kwargs)
            return otherwise(args, kwargs) if out is None else out

        def serve_hit(args, kwargs):
            """The hit alone, else None. ``impl`` falls back to ``otherwise``; the Tensor's
            fast methods (``_fast_methods``) serve a call this way before PyTorch's dispatcher
            (pointwise ones through ``serve_pair``/``serve_single``, the same hit with a key
            built for their calls), and otherwise let it dispatch (which counts the miss and
            fills the cache)."""
            if config.op_cache_size:
                leaves: list = []
                key = key_of(args, kwargs, leaves)
                if key is not None:
                    entry = entries.get(key)
                    if entry is not None:
                        return launch_hit(entry, leaves)
            return None

        impl.raw = raw  # pyright: ignore[reportFunctionMemberAccess]  (an attribute of our own on the function)
        impl.serve_hit = serve_hit  # pyright: ignore[reportFunctionMemberAccess]  (an attribute of our own on the function)
        return impl

    positions, tensor_kwargs = _unwrap_plan(func)
    # hit_key's refusals that hang on the op alone (see _make_hit_key), decided once here.
    keyed = getattr(func, "_schema", None) is not None and not (tensor_kwargs or _several_devices())
    first_is_tensor = 0 in positions
    second_is_tensor = 1 in positions
    piece = _opcache._piece

    def serve_pair(a, b):
        """``func(a, b)``'s hit where ``a`` is a root Tensor and ``b`` a root Tensor or a Python
        number (the caller's checks), else None: ``serve_hit`` with the key built for that shape
        of call, the same tuple ``hit_key`` builds, without its generic loop. ``launch_hit``'s
        lines are repeated here and in ``serve_single`` rather than called: with the method's
        own frame, two frames fewer per served ``a + b`` measured ~1 us less of its ~23 us
        (loaded machine, interleaved with ``jnp.add``)."""
        array_a = a._storage.array
        if type(array_a) is not _ArrayImpl or not config.op_cache_size:
            return None
        if type(b) is Tensor:
            array_b = b._storage.array
            if type(array_b) is not _ArrayImpl or not second_is_tensor:
                return None
            entry = entries.get((op, array_a.aval, array_b.aval, op.context()))
            if entry is None:
                return None
            leaves = (array_a, array_b)
        else:
            entry = entries.get((op, array_a.aval, piece(b, []), op.context()))
            if entry is None:
                return None
            leaves = (array_a,)
        stats.hits += 1
        entry.used = True
        meta = entry.meta
        if meta is None:
            return wrap_hit(entry, leaves)
        try:
            out = entry.call(*leaves)
        except (ValueError, TypeError):
            return _wrap(entry.relax()(*leaves))
        r = new_tensor(Tensor, meta[0], None, None, None, meta[1], strided, meta[2])
        r._storage = storage(out)
        r._view = None
        return r

    def serve_single(a):
        """``func(a)``'s hit where ``a`` is a root Tensor, else None (as ``serve_pair``)."""
        array_a = a._storage.array
        if type(array_a) is not _ArrayImpl or not config.op_cache_size:
            return None
        entry = entries.get((op, array_a.aval, op.context()))
        if entry is None:
            return None
        stats.hits += 1
        entry.used = True
        meta = entry.meta
        if meta is None:
            return wrap_hit(entry, (array_a,))
        try:
            out = entry.call(array_a)
        except (ValueError, TypeError):
            return _wrap(entry.relax()(array_a))
        r = new_tensor(Tensor, meta[0], None, None, None, meta[1], strided, meta[2])
        r._storage = storage(out)
        r._view = None
        return r

    raw.defers_views = True  # pyright: ignore[reportFunctionMemberAccess]  (takes _opcache.Pending arguments)
    impl = serving(general, hit_key)
    if keeps_layout:
        impl = serving(memory_order_impl(func, impl), roots_hit_key)
    if keyed and first_is_tensor:
        impl.serve_pair = serve_pair  # pyright: ignore[reportFunctionMemberAccess]  (an attribute of our own on the function)
        impl.serve_single = serve_single  # pyright: ignore[reportFunctionMemberAccess]  (an attribute of our own on the function)
    return impl


_PLAIN_NUMBERS = frozenset({int, float, bool, complex})


def _make_hit_key(func, op, roots_only: bool = False) -> Callable:
    """``hit_key(args, kwargs, leaves)``: ``_opcache.signature`` of the unwrapped call, built
    from the Tensors themselves (no unwrapped argument list), or ``None`` for a call it does
    not take: a tensor argument that is not a torchlax Tensor (a 0-d CPU scalar, a list of
    tensors), a tracer, an argument the cache cannot key on, tensor kwargs, several devices
    (their check is the unwrapper's). The general path then unwraps and keys as before.
    With ``roots_only`` it also refuses views and kwargs (a pointwise op's layout rule decides
    those: ``cached_impl``).
    """
    positions, tensor_kwargs = _unwrap_plan(func)
    if getattr(func, "_schema", None) is None or tensor_kwargs or _several_devices():
        return lambda args, kwargs, leaves: None
    tensor_positions = frozenset(positions)
    piece = _opcache._piece
    pending = _opcache.Pending
    not_cacheable = _opcache.NotCacheable

    def hit_key(args, kwargs, leaves):
        key: list = [op]
        append = key.append
        try:
            for i, a in enumerate(args):
                if type(a) is Tensor:
                    if i not in tensor_positions:
                        return None
                    view = a._view
                    array = a._storage.array
                    if type(array) is not _ArrayImpl:
                        return None
                    if view is None:
                        leaves.append(array)
                        append(array.aval)
                    elif roots_only:
                        return None
                    elif view.seen is None:  # deferred: the executable applies it (Pending)
                        leaves.append(array)
                        append((pending, view.compute.recipe, array.aval))
                    else:
                        array = a._peek()
                        if type(array) is not _ArrayImpl:
                            return None
                        leaves.append(array)
                        append(array.aval)
                elif i in tensor_positions and a is not None and type(a) not in _PLAIN_NUMBERS:
                    return None  # a list of tensors, a CPU tensor, ...
                else:  # (PyTorch passes `x * 2`'s 2 as a Python number in a tensor position)
                    append(piece(a, leaves))
            if kwargs:
                if roots_only:
                    return None
                for name, value in kwargs.items():
                    append(name)
                    append(piece(value, leaves))
        except not_cacheable:
            return None
        append(op.context())
        return tuple(key)

    return hit_key


# View ops whose result reads the same elements in the same order (a reshape of the base).
_RESHAPING_VIEWS = frozenset(
    {
        "aten::view",
        "aten::_unsafe_view",
        "aten::_reshape_alias",
        "aten::unsqueeze",
        "aten::squeeze",
        "aten::flatten",
        "aten::unflatten",
        "aten::view_as",
    }
)
# View ops whose result reinterprets the base's bytes: readable, not writable through.
_REINTERPRETING_VIEWS = frozenset(
    {
        "aten::view.dtype",
        "aten::view_as_real",
        "aten::view_as_complex",
        "aten::real",
        "aten::imag",
        "aten::_neg_view",
        "aten::_conj",
    }
)


def _view_kind(func) -> int:
    name = str(func._schema.name)
    qualified = name if func._overloadname == "default" else f"{name}.{func._overloadname}"
    if name in _REINTERPRETING_VIEWS or qualified in _REINTERPRETING_VIEWS:
        return REINTERPRET
    if name in _RESHAPING_VIEWS and qualified != "aten::view.dtype":
        return RESHAPE
    return GATHER


# Views computed only when read, or applied inside the next cached op's executable, where XLA
# folds them into the op (a transpose into a matmul's dimension numbers) instead of copying:
# Linear's weight.t(), attention's view/transpose chains. Single-result views of one array
# whose result shape PyTorch's meta kernel gives (``_view_layouts``).
_DEFERRED_VIEWS = frozenset(
    {
        torch.ops.aten.t.default,
        torch.ops.aten.transpose.int,
        torch.ops.aten.permute.default,
        torch.ops.aten.view.default,
        torch.ops.aten.unsqueeze.default,
        torch.ops.aten.squeeze.dim,
        torch.ops.aten.expand.default,
        torch.ops.aten.slice.Tensor,
        torch.ops.aten.select.int,
    }
)
# Views of the very same elements: of a deferred view, another one with the same recipe
# (autograd detaches a weight's gradient, often a deferred ``t()``, before SGD reads it).
_IDENTITY_VIEWS = frozenset({torch.ops.aten.detach.default, torch.ops.aten.alias.default})
# Multi-result views made deferred the same way: each result is the op's i-th result
# (attention's q, k, v = qkv.split(...); XLA keeps only the slice a consumer reads).
_DEFERRED_SPLITS = frozenset(
    {
        torch.ops.aten.split.Tensor,
        torch.ops.aten.split_with_sizes.default,
        torch.ops.aten.unbind.int,
    }
)


class _Aval:
    """What ``_make`` reads of an array (shape, dtype) for a view not computed yet."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape, root):
        self.shape = shape
        self.dtype = root.dtype


def view_impl(func, fn) -> Callable:
    """A view op: its results share the base's storage and remember how to recompute."""
    unwrap = _make_unwrapper(func)
    op_kind = _view_kind(func)
    splits = func in _DEFERRED_SPLITS
    deferrable = splits or func in _DEFERRED_VIEWS
    identity = func in _IDENTITY_VIEWS
    layout_cache: dict = {}  # see _view_layouts
    # The deferred views' recompute functions, one per (other arguments, result index, parent's
    # function): they read no tensor, so every call with the same arguments shares one (built
    # once, its recipe with it) instead of new closures per call.
    computes: dict = {}
    token = _RecipeOp.of(func)

    def impl(args, kwargs):
        base = args[0]
        if not isinstance(base, Tensor):
            jargs, jkwargs = unwrap(args, kwargs)
            return _wrap(_call(fn, jargs, jkwargs))
        storage = base._storage
        root_array = storage.array
        try:  # frozen once: the layout cache's key and the deferred view's recipe
            frozen = _frozen(args[1:])
        except TypeError:  # a tensor argument: neither is cached
            frozen = None
        # First, so that PyTorch's own errors come out (view of a non-viewable layout, ...).
        layouts = _view_layouts(func, base, args, kwargs, root_array, layout_cache, frozen)
        parent = base._view
        if (
            identity
            and parent is not None
            and parent.seen is None
            and parent.compute is not None
            and layouts is not None
            and type(root_array) is _ArrayImpl
        ):
            view = _View(parent.compute, parent.kind, None, None)
            aval = _Aval(layouts[0][3], root_array)
            return _make(aval, storage, view, layout=layouts[0], device=base.device)  # pyright: ignore[reportArgumentType]  (_make reads shape, dtype)
        if (
            deferrable
            and layouts is not None
            and frozen is not None
            and (splits or len(layouts) == 1)
            and not kwargs
            and type(root_array) is _ArrayImpl
            and (parent is None or (parent.seen is None and parent.compute is not None))
        ):
            device = base.device
            kind = op_kind if parent is None else max(op_kind, parent.kind)
            if splits:
                return [
                    _deferred_view(
                        _deferred_compute(computes, token, fn, args, frozen, parent, i),
                        storage,
                        root_array,
                        kind,
                        layout,
                        device,
                    )
                    for i, layout in enumerate(layouts)
                ]
            return _deferred_view(
                _deferred_compute(computes, token, fn, args, frozen, parent, None),
                storage,
                root_array,
                kind,
                layouts[0],
                device,
            )
        jargs, jkwargs = unwrap(args, kwargs)  # (the view's array stays inside the storage)
        rest = jargs[1:]
        base_array = jargs[0]
        out = _call(fn, jargs, jkwargs)

        def step(array):
            return _call(fn, [array, *rest], jkwargs)

        if isinstance(out, list | tuple):
            compute = (
                step if parent is None or parent.compute is None else _then(parent.compute, step)
            )
            kind = max(GATHER, parent.kind if parent is not None else IDENTITY)
            return type(out)(
                _view_of(
                    storage,
                    a,
                    _pick(compute, i),
                    kind,
                    root_array,
                    base_array,
                    None if layouts is None else layouts[i],
                )
                for i, a in enumerate(out)
            )
        if out is base_array:  # detach, alias: the very same elements
            kind = IDENTITY
            compute = None if parent is None else parent.compute
        else:
            kind = op_kind
            compute = (
                step if parent is None or parent.compute is None else _then(parent.compute, step)
            )
        if parent is not None:
            kind = max(kind, parent.kind)
        return _view_of(
            storage,
            out,
            compute,
            kind,
            root_array,
            base_array,
            None if layouts is None else layouts[0],
        )

    return impl


class _RecipeOp:
    """A view op as deferred views' recipes name it: hashed by identity (an ``OpOverload``'s
    ``__hash__`` is Python code, and the op cache hashes every deferred argument's recipe on
    each hit). One per op, so that recipes from different environments still compare equal."""

    __slots__ = ("func",)
    _interned: dict = {}

    def __init__(self, func):
        self.func = func

    @classmethod
    def of(cls, func) -> _RecipeOp:
        token = cls._interned.get(func)
        if token is None:
            token = cls._interned[func] = cls(func)
        return token

    def __repr__(self) -> str:
        return f"_RecipeOp({self.func})"


def _deferred_compute(computes: dict, token, fn, args, frozen, parent, index):
    """The function computing a deferred view (of view op ``token``, its other arguments
    ``args[1:]``, frozen to ``frozen``) from its root array, with its ``recipe``; with ``index``,
    the ``index``-th result of a multi-result view op. Shared by the calls with equal arguments
    and the same parent function (kept in ``computes``, bounded)."""
    parent_compute = None if parent is None else parent.compute
    key = (frozen, index, parent_compute)
    shared = computes.get(key)
    if shared is not None:
        return shared
    rest = list(args[1:])
    if index is None:
        recipe = ((token, frozen),)

        def compute(array):
            return _call(fn, [array, *rest], {})
    else:
        recipe = ((token, frozen, index),)

        def compute(array):
            return _call(fn, [array, *rest], {})[index]

    if parent_compute is not None:  # a view of a deferred view: one function from the root
        compute = _then(parent_compute, compute)
        recipe = parent_compute.recipe + recipe
    compute.recipe = recipe  # pyright: ignore[reportFunctionMemberAccess]  (our own attribute: the op cache keys on it)
    if len(computes) < 4096:
        computes[key] = compute
    return compute


def _deferred_view(compute, storage, root_array, kind, layout, device) -> Tensor:
    """A view whose array is computed by ``compute`` when first read (``_View.seen`` None
    until then)."""
    return _make(
        _Aval(layout[3], root_array),  # pyright: ignore[reportArgumentType]  (_make reads shape, dtype)
        storage,
        _View(compute, kind, None, None),
        layout=layout,
        device=device,
    )


def _view_layouts(func, base, args, kwargs, root_array, cache: dict, frozen) -> list | None:
    """PyTorch's ``(strides, storage_offset, storage_nbytes, shape)`` of each result of view op
    ``func`` on ``base``: the op run once on a meta tensor of the base's layout, then kept in
    ``cache`` (one per view op: its key then needs no op, whose hash is Python code).

    ``None`` where PyTorch has no meta kernel for the op (the view is then row-major).
    """
    try:
        if frozen is None:  # a tensor argument
            raise TypeError("tensor")
        key = (  # the base's layout, the storage's shape and dtype, the other arguments
            base.shape,
            base.stride(),
            base.storage_offset(),
            base.dtype,
            root_array.shape,
            root_array.dtype,
            frozen,
            _frozen(kwargs) if kwargs else (),
        )
        hit = cache.get(key)
    except TypeError:  # a tensor or another unhashable argument: not cached
        key, hit = None, None
    if hit is None:
        nbytes = int(root_array.size) * root_array.dtype.itemsize
        hit = _meta_layouts(func, base, args, kwargs, nbytes)
        if key is not None and len(cache) < 4096:
            cache[key] = hit
    return hit or None


def _frozen(x):
    t = type(x)
    if t is int:
        return x
    if t is list or t is tuple:
        for y in x:  # most view arguments are flat lists of ints: no generator needed
            if type(y) is not int:
                return tuple(y if type(y) is int else _frozen(y) for y in x)
        return x if t is tuple else tuple(x)
    if isinstance(x, torch.Tensor):
        raise TypeError("tensor")
    if type(x) is dict:
        return tuple(sorted((k, _frozen(v)) for k, v in x.items()))
    return x


def _as_meta(t, nbytes=None):
    if not isinstance(t, torch.Tensor):
        return t
    if nbytes is None:
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
    storage = torch.empty(nbytes // t.element_size(), dtype=t.dtype, device="meta")
    return storage.as_strided(t.shape, t.stride(), t.storage_offset())


def _meta_layouts(func, base, args, kwargs, nbytes) -> list:
    meta_args = [_as_meta(base, nbytes)]
    meta_args += [torch.utils._pytree.tree_map(_as_meta, a) for a in args[1:]]
    meta_kwargs = torch.utils._pytree.tree_map(_as_meta, kwargs)
    try:
        out = func(*meta_args, **meta_kwargs)
    except NotImplementedError:
        return []
    outs = out if isinstance(out, list | tuple) else (out,)
    return [(t.stride(), t.storage_offset(), nbytes, tuple(t.shape)) for t in outs]


def inplace_view_counterpart(func):
    """The view op an in-place view op applies to ``self`` (``transpose_`` -> ``transpose.int``)."""
    if not isinstance(func, torch._ops.OpOverload) or not func._schema.is_mutable:
        return None
    name = func._schema.name.split("::")[-1]
    if not name.endswith("_") or name.endswith("__"):
        return None
    packet = getattr(getattr(torch.ops, func.namespace), name[:-1], None)
    if packet is None:
        return None
    wanted = [a.name for a in func._schema.arguments]
    for overload_name in packet.overloads():
        candidate = getattr(packet, overload_name)
        if candidate.is_view and [a.name for a in candidate._schema.arguments] == wanted:
            return candidate
    return None


def inplace_view_impl(func, functional, fn) -> Callable:
    """An in-place view op (``squeeze_``, ``transpose_``, ``as_strided_``): ``self`` changes
    shape and strides in place and becomes a view of the storage it already shares."""
    unwrap = _make_unwrapper(func)
    op_kind = _view_kind(functional)

    def impl(args, kwargs):
        self = args[0]
        jargs, jkwargs = unwrap(args, kwargs)
        rest = jargs[1:]

        def step(array):
            return _call(fn, [array, *rest], jkwargs)

        value = step(jargs[0])
        parent = self._view
        compute = step if parent is None or parent.compute is None else _then(parent.compute, step)
        kind = op_kind if parent is None else max(op_kind, parent.kind)
        with torch._C._DisableTorchDispatch():  # the wrapper's own sizes and strides
            func(*args, **kwargs)
        self._view = _View(compute, kind, self._storage.array, value)
        return self

    return impl


def as_strided_impl(func, fn) -> Callable:
    """``as_strided`` indexes the storage, not its input: on a view (``base[5:15]``) the
    offset and strides count from the root's first element, and the default offset is the
    view's own (the root index of its first element), as in PyTorch."""
    plain = view_impl(func, fn)

    def impl(args, kwargs):
        base = args[0]
        parent = base._view if isinstance(base, Tensor) else None
        if parent is None or parent.kind not in (RESHAPE, GATHER):
            return plain(args, kwargs)
        size, stride = args[1], args[2]
        offset = args[3] if len(args) > 3 else kwargs.get("storage_offset")
        storage = base._storage
        root_array = storage.array
        if offset is None:
            if base.numel() == 0:
                offset = 0
            else:
                try:
                    offset = _first_index(parent, root_array)
                except jax.errors.ConcretizationTypeError:  # a view computed from traced values
                    return plain(args, kwargs)

        def compute(root):
            return _call(fn, [root, size, stride, offset], {})

        nbytes = int(root_array.size) * root_array.dtype.itemsize
        layout = (tuple(int(n) for n in stride), int(offset), nbytes)
        return _view_of(storage, compute(root_array), compute, GATHER, root_array, None, layout)

    return impl


def _then(first, second):
    return lambda array: second(first(array))


def _pick(compute, i):
    return lambda array: compute(array)[i]


def _view_of(storage, array, compute, kind, root_array, base_array, layout=None):
    if kind != REINTERPRET and array.dtype != root_array.dtype:
        kind = REINTERPRET
    return _make(array, storage, _View(compute, kind, root_array, array), layout=layout)


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
            dst._write(cast_for_write(func, dst, new))
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
