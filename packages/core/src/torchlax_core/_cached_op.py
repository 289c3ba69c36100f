"""An op served by the eager op cache (``_opcache``): its hits and its misses.

``cached_impl`` assembles an op's impl from small pieces that share one ``_CachedOp``: the hit
(the signature built straight from the Tensors, ``_make_hit_key``; one dict lookup; one launch;
a wrap from the entry's metadata), the general path (unwrap, ``_opcache.signature``) and the
miss (run plainly, or compile). ``serve_pair``, ``serve_single`` and ``serve_hit`` are the hits
that ``_fast_methods`` try before PyTorch's dispatcher.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from . import _opcache, _tensor
from ._layouts import memory_order_impl
from ._tensor import Tensor, _make
from ._unwrap import _ArrayImpl, _make_unwrapper, _several_devices, _unwrap_plan, _wrap, release


class _CachedOp:
    """What the pieces of one op's cached impl share: the op (``func``, its lowering ``fn``, the
    ``_opcache.Op`` naming it in keys), its cache, and the general path's unwrapper."""

    __slots__ = ("func", "fn", "cache", "op", "unwrap")

    def __init__(self, func, fn, cache: _opcache.OpCache):
        self.func = func
        self.fn = fn
        self.cache = cache
        self.op = cache.op(func)
        self.unwrap = _make_unwrapper(func, defer_views=True)


# -- the hit's key ------------------------------------------------------------------------------

_PLAIN_NUMBERS = frozenset({int, float, bool, complex})


def _keyed_from_tensors(func) -> bool:
    """Whether ``_make_hit_key`` keys ``func``'s calls at all: its refusals that hang on the op
    alone (not an ATen overload, tensor kwargs, several devices), decided once per op."""
    _, tensor_kwargs = _unwrap_plan(func)
    return getattr(func, "_schema", None) is not None and not (tensor_kwargs or _several_devices())


def _make_hit_key(func, op, roots_only: bool = False) -> Callable:
    """``hit_key(args, kwargs, leaves)``: ``_opcache.signature`` of the unwrapped call, built
    from the Tensors themselves (no unwrapped argument list), or ``None`` for a call it does
    not take: a tensor argument that is not a torchlax Tensor (a 0-d CPU scalar, a list of
    tensors), a tracer, an argument the cache cannot key on, tensor kwargs, several devices
    (their check is the unwrapper's). The general path then unwraps and keys as before.
    With ``roots_only`` it also refuses views and kwargs (a pointwise op's layout rule decides
    those: ``cached_impl``).
    """
    if not _keyed_from_tensors(func):
        return lambda args, kwargs, leaves: None
    if roots_only:
        return _make_roots_hit_key(func, op)
    tensor_positions = frozenset(_unwrap_plan(func)[0])
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
                for name, value in kwargs.items():
                    append(name)
                    append(piece(value, leaves))
        except not_cacheable:
            return None
        append(op.context())
        return tuple(key)

    return hit_key


def _make_roots_hit_key(func, op) -> Callable:
    """``_make_hit_key``'s ``roots_only`` key: that of a call whose tensors are all root Tensors
    and that has no kwargs (the same tuple), else ``None``."""
    tensor_positions = frozenset(_unwrap_plan(func)[0])
    piece = _opcache._piece
    not_cacheable = _opcache.NotCacheable

    def hit_key(args, kwargs, leaves):
        if kwargs:
            return None
        key: list = [op]
        append = key.append
        try:
            for i, a in enumerate(args):
                if type(a) is Tensor:
                    array = a._storage.array
                    if (
                        i not in tensor_positions
                        or a._view is not None
                        or type(array) is not _ArrayImpl
                    ):
                        return None
                    leaves.append(array)
                    append(array.aval)
                elif i in tensor_positions and a is not None and type(a) not in _PLAIN_NUMBERS:
                    return None  # a list of tensors, a CPU tensor, ...
                else:  # (PyTorch passes `x * 2`'s 2 as a Python number in a tensor position)
                    append(piece(a, leaves))
        except not_cacheable:
            return None
        append(op.context())
        return tuple(key)

    return hit_key


# -- a hit: launch and wrap ---------------------------------------------------------------------

_new_tensor = _tensor._make_wrapper_subclass
_Storage = _tensor._Storage


def _wrap_hit(entry, leaves):
    """Launch ``entry`` and wrap its result with the shape, dtype and device the entry keeps
    (reading them off a fresh array costs more than the rest of the wrap)."""
    meta = entry.meta
    try:
        out = entry.call(*leaves)
    except (ValueError, TypeError):  # inputs on other devices than it was compiled for
        out = entry.relax()(*leaves)
        meta = None
    if meta is None:
        return _wrap(out)
    # Positional (size, strides, storage_offset, memory_format, dtype, layout, device):
    # PyTorch's argument parser matches keywords by name, ~0.4-0.7 us a result more.
    r = _new_tensor(Tensor, meta[0], None, None, None, meta[1], torch.strided, meta[2])
    r._storage = _Storage(out)
    r._view = None
    return r


def _hit_launcher(cache: _opcache.OpCache) -> Callable:
    """``launch_hit(entry, leaves)``: count the hit, launch ``entry`` and wrap its result
    (``serve_hit``'s second half)."""
    stats = cache.stats
    new_tensor = _new_tensor
    storage = _Storage
    strided = torch.strided

    def launch_hit(entry, leaves):
        stats.hits += 1
        entry.used = True  # (the LRU's second chance: OpCache.insert)
        meta = entry.meta
        if meta is None:
            return _wrap_hit(entry, leaves)
        try:
            out = entry.call(*leaves)
        except (ValueError, TypeError):
            return _wrap(entry.relax()(*leaves))
        r = new_tensor(Tensor, meta[0], None, None, None, meta[1], strided, meta[2])
        r._storage = storage(out)
        r._view = None
        return r

    return launch_hit


# -- the general path: unwrap, key, look up; a miss runs plainly or compiles ----------------------


def _general_lookup(site: _CachedOp) -> Callable:
    """``lookup(jargs, jkwargs) -> (entry or None, key, leaves)`` of unwrapped arguments, counting
    the hit or miss; key is None when this call is not cacheable."""
    cache = site.cache
    entries = cache.entries
    refused = cache.refused
    stats = cache.stats
    config = cache.config
    signature = _opcache.signature
    not_cacheable = _opcache.NotCacheable
    op = site.op

    def lookup(jargs, jkwargs) -> tuple:
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

    return lookup


def _run_first(site: _CachedOp, key, jargs, jkwargs):
    """The first call of a signature, run plainly while its reads of values on the host are
    counted (``_opcache.run_probed``)."""
    cache = site.cache
    try:
        jargs = _opcache.materialize(jargs)
        return _opcache.run_probed(cache, key, site.func, site.fn, jargs, jkwargs)
    except BaseException:
        # A call that raised (bad arguments) counts for nothing: compiled on a repeat, its
        # trace would raise too and mark the whole op never cacheable.
        cache.seen.pop(key, None)
        raise


def _miss(site: _CachedOp, key, jargs, jkwargs, leaves) -> tuple:
    """``(entry or None, result)`` of a call the cache does not hold: run plainly until its
    signature's ``Config.op_cache_min_calls``-th call, then compiled and launched."""
    cache = site.cache
    fn = site.fn
    calls = cache.note_seen(key)
    min_calls = cache.min_calls()
    probed = None
    once = _opcache.compiling_suspended()
    if calls < min_calls or calls == 1 or once:
        out = _run_first(site, key, jargs, jkwargs)
        if calls < min_calls or key in cache.refused or once:
            return None, out
        # op_cache_min_calls=1: compile now and answer with the executable (so that tests run
        # each op's compiled form once).
        probed = (out,)
    entry = _opcache.compile_entry(cache, key, site.func, fn, jargs, jkwargs, leaves)
    if entry is None:
        if probed is not None:  # not run a second time: a random op would draw again
            return None, probed[0]
        return None, fn(*_opcache.materialize(jargs), **jkwargs)
    cache.insert(_opcache.keyed(cache, site.func, key), entry)
    out = entry.call(*leaves)
    entry.launch_directly()
    return entry, out


def _general(site: _CachedOp, lookup: Callable) -> Callable:
    """``general(args, kwargs)``: unwrap, look up, then a hit or a miss; a Tensor result."""
    unwrap = site.unwrap
    fn = site.fn
    materialize = _opcache.materialize

    def general(args, kwargs):
        jargs, jkwargs = unwrap(args, kwargs)
        entry, key, leaves = lookup(jargs, jkwargs)
        if entry is None:
            release(args)  # run plainly
            release(kwargs.values())
            if key is None:
                out = fn(*materialize(jargs), **jkwargs)
            else:
                entry, out = _miss(site, key, jargs, jkwargs, leaves)
                if entry is not None and entry.meta is None:
                    entry.learn(out)
            return _make(out) if type(out) is _ArrayImpl else _wrap(out)
        return _wrap_hit(entry, leaves)

    return general


def _raw(site: _CachedOp, hit_key: Callable, lookup: Callable) -> Callable:
    """``raw(args, kwargs)``: the call's arrays, not wrapped (for in-place and ``out=``
    overloads, which write them back, and the layout rules, which lay them out)."""
    unwrap = site.unwrap
    fn = site.fn
    cache = site.cache
    entries = cache.entries
    stats = cache.stats
    config = cache.config
    materialize = _opcache.materialize

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
        return _miss(site, key, jargs, jkwargs, leaves)[1]

    def raw(args, kwargs):
        if not config.op_cache_size:
            return general_raw(args, kwargs)
        leaves: list = []
        key = hit_key(args, kwargs, leaves)
        entry = None if key is None else entries.get(key)
        if entry is None:  # (the general path counts the miss)
            return general_raw(args, kwargs)
        stats.hits += 1
        entry.used = True
        try:
            return entry.call(*leaves)
        except (ValueError, TypeError):  # inputs on other devices than it was compiled for
            return entry.relax()(*leaves)

    raw.defers_views = True  # pyright: ignore[reportFunctionMemberAccess]  (takes _opcache.Pending arguments)
    return raw


# -- the impl: a hit served first, else the general path ------------------------------------------


def _serving(
    cache: _opcache.OpCache, otherwise: Callable, key_of: Callable, launch_hit, raw
) -> Callable:
    """``impl(args, kwargs)``: a hit (``serve_hit``), else ``otherwise``."""
    entries = cache.entries
    config = cache.config

    def impl(args, kwargs):
        out = serve_hit(args, kwargs)
        return otherwise(args, kwargs) if out is None else out

    def serve_hit(args, kwargs):
        """The hit alone, else None. ``impl`` falls back to ``otherwise``; the Tensor's fast
        methods (``_fast_methods``) serve a call this way before PyTorch's dispatcher (pointwise
        ones through ``serve_pair``/``serve_single``, the same hit with a key built for their
        calls), and otherwise let it dispatch (which counts the miss and fills the cache)."""
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


def _pair_server(site: _CachedOp, second_is_tensor: bool) -> Callable:
    """``serve_pair(a, b)``: ``func(a, b)``'s hit where ``a`` is a root Tensor and ``b`` a root
    Tensor or a Python number (the caller's checks), else None."""
    cache = site.cache
    entries = cache.entries
    stats = cache.stats
    config = cache.config
    op = site.op
    piece = _opcache._piece
    new_tensor = _new_tensor
    storage = _Storage
    strided = torch.strided

    def serve_pair(a, b):
        """``serve_hit`` with the key built for this shape of call, the same tuple ``hit_key``
        builds, without its generic loop. ``launch_hit``'s lines are repeated here and in
        ``serve_single`` rather than called: with the method's own frame, two frames fewer per
        served ``a + b`` measured ~1 us less of its ~23 us (loaded machine, interleaved with
        ``jnp.add``)."""
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
            return _wrap_hit(entry, leaves)
        try:
            out = entry.call(*leaves)
        except (ValueError, TypeError):
            return _wrap(entry.relax()(*leaves))
        r = new_tensor(Tensor, meta[0], None, None, None, meta[1], strided, meta[2])
        r._storage = storage(out)
        r._view = None
        return r

    return serve_pair


def _single_server(site: _CachedOp) -> Callable:
    """``serve_single(a)``: ``func(a)``'s hit where ``a`` is a root Tensor, else None (as
    ``serve_pair``)."""
    cache = site.cache
    entries = cache.entries
    stats = cache.stats
    config = cache.config
    op = site.op
    new_tensor = _new_tensor
    storage = _Storage
    strided = torch.strided

    def serve_single(a):
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
            return _wrap_hit(entry, (array_a,))
        try:
            out = entry.call(array_a)
        except (ValueError, TypeError):
            return _wrap(entry.relax()(array_a))
        r = new_tensor(Tensor, meta[0], None, None, None, meta[1], strided, meta[2])
        r._storage = storage(out)
        r._view = None
        return r

    return serve_single


def cached_impl(func, fn, cache: _opcache.OpCache, keeps_layout: bool = False) -> Callable:
    """``plain_impl`` with the eager op cache in front (see ``_opcache``).

    A hit is: the signature built straight from the call's Tensors (``hit_key``), one dict
    lookup, one executable launch, and a wrap that takes the result's shape, dtype and device
    from the entry (``_wrap_hit``). Any call ``hit_key`` does not take, and every miss, goes
    the general way (``_general``): unwrap, then ``_opcache.signature`` of the unwrapped
    arguments (the same key).

    ``keeps_layout``: a pointwise op, whose result follows its arguments' layout
    (``memory_order_impl``). A hit of root Tensors alone (row-major, the common case) is served
    before that rule, which would only call through to it: each Python frame between two
    launches also slows the next launch down (docs/architecture.md).

    The impl carries ``raw`` (arrays out), ``serve_hit`` and, where the op's first argument is a
    tensor, ``serve_pair``/``serve_single`` (the hits ``_fast_methods`` try).
    """
    site = _CachedOp(func, fn, cache)
    hit_key = _make_hit_key(func, site.op)
    lookup = _general_lookup(site)
    raw = _raw(site, hit_key, lookup)
    launch_hit = _hit_launcher(cache)
    impl = _serving(cache, _general(site, lookup), hit_key, launch_hit, raw)
    if keeps_layout:
        roots_hit_key = _make_hit_key(func, site.op, roots_only=True)
        impl = _serving(cache, memory_order_impl(func, impl), roots_hit_key, launch_hit, raw)
    positions, _ = _unwrap_plan(func)
    if _keyed_from_tensors(func) and 0 in positions:
        impl.serve_pair = _pair_server(site, 1 in positions)  # pyright: ignore[reportFunctionMemberAccess]  (an attribute of our own on the function)
        impl.serve_single = _single_server(site)  # pyright: ignore[reportFunctionMemberAccess]  (an attribute of our own on the function)
    return impl
