"""View ops: results that share their base's storage and remember how to recompute from it.

``view_impl`` computes a view's array when it is made, or defers it (``_DEFERRED_VIEWS``: computed
when first read, or applied inside the next cached op's executable); ``as_strided_impl`` indexes
the storage rather than its input; ``inplace_view_impl`` changes ``self``'s shape and strides in
place (``transpose_``, ``squeeze_``).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import torch
import torch.utils._pytree

from ._layouts import _Aval
from ._tensor import GATHER, IDENTITY, REINTERPRET, RESHAPE, Tensor, _first_index, _make, _View
from ._unwrap import _ArrayImpl, _call, _make_unwrapper, _wrap

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
