"""How one ATen op runs on torchlax Tensors: one ``impl(args, kwargs)`` per op overload.

``Environment._resolve`` builds it once per op (``lowering_impl``, or for a derived overload
``_views.inplace_view_impl`` and ``_mutation.derived_mutation_impl``); the eager hot path is
then ``Tensor.__torch_dispatch__`` -> ``impl``. The modules it assembles, bottom up:

- ``_unwrap``: arguments to arrays, results to Tensors (``plain_impl`` here is just that);
- ``_layouts``: results whose strides PyTorch does not make row-major;
- ``_views``: view ops, whose results share their base's storage;
- ``_mutation``: in-place and ``out=`` overloads written back, ``resize_``, ``set_``;
- ``_cached_op``: functional ops the eager op cache serves (its hits and misses);
- ``_like_placement``: ``zeros_like(x)`` and kin land where a committed ``x`` is.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from . import _opcache
from ._cached_op import cached_impl
from ._layouts import RESULT_LAYOUT_FROM_META, keeps_layout, memory_order_impl, meta_layout_impl
from ._like_placement import LIKE_OPS, placed_lowering, source_is_committed
from ._mutation import derived_mutation_impl
from ._tensor import _make
from ._unwrap import _ArrayImpl, _make_unwrapper, _wrap, release
from ._views import as_strided_impl, view_impl

# -- one impl per op ----------------------------------------------------------------------------


def lowering_impl(func, fn, cache: _opcache.OpCache | None = None) -> Callable:
    if func in LIKE_OPS:  # zeros_like(x) and kin: where x is, when x is committed
        usual = _lowering_impl(func, fn, cache)
        placed = _lowering_impl(func, placed_lowering(func, fn), None)

        def like_impl(args, kwargs):
            return (placed if source_is_committed(args) else usual)(args, kwargs)

        return like_impl
    return _lowering_impl(func, fn, cache)


def _lowering_impl(func, fn, cache: _opcache.OpCache | None) -> Callable:
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
