"""Results laid out as PyTorch lays them out where that is not row-major.

A result PyTorch gives other strides (a pointwise op on transposed or channels-last inputs,
``nonzero``, fused attention) is stored with its elements in memory order and viewed transposed
back (``stored_in_order``, the one constructor of such a tensor). Two impl wrappers apply
PyTorch's rules: ``memory_order_impl`` (pointwise and ``*_like`` ops: TensorIterator's layout,
``_iterator_layout``) and ``meta_layout_impl`` (ops whose layout PyTorch's meta kernel gives).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.utils._pytree
from torch._prims_common import make_channels_last_strides_for

from . import _opcache, _tensor
from ._iterator_layout import iterator_layout, row_major_strides
from ._tensor import GATHER, REINTERPRET, Tensor, _make, _View
from ._unwrap import _JAX_DTYPES, _ArrayImpl, _is_tensor_type, _wrap


class _Aval:
    """What ``_make`` reads of an array (shape, dtype) for a view not computed yet."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape, root):
        self.shape = shape
        self.dtype = root.dtype


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


def traced_input(array, strides: tuple[int, ...] | None = None, order=None) -> Tensor:
    """A compiled program's input ``array`` as the tensor its trace computes with
    (``torchlax.jit``'s steps, the backend's graphs): row-major, or with the ``strides`` the
    caller traces it with (``_laid_out``), or, where its elements are passed in memory
    ``order``, stored in that order (``stored_in_order``)."""
    if strides is None:
        return Tensor(array)
    if order is None:
        return _laid_out(array, strides)
    return stored_in_order(array, order, strides)


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


def returned_in_memory_order(tensor: Tensor) -> tuple:
    """``(array, order)``: a traced output as a compiled program returns it (``torchlax.jit``;
    the backend's graphs). Eager PyTorch lays some results out densely other than row-major
    (``x.t() * 2``: TensorIterator follows its operand): such a one is returned in memory
    order, ``order``, and the caller views it back after the call (``viewed_back``); any other
    (row-major, or with gaps: a slice comes back row-major) is its value, order None."""
    if not tensor.is_contiguous():
        ordered = memory_ordered_array(tensor)
        if ordered is not None:
            return ordered
    return tensor._value(), None


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
