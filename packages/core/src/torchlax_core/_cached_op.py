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
        cache.insert(key, entry)
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
    default_dtype = torch.get_default_dtype
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
            entry = entries.get((op, array_a.aval, array_b.aval, default_dtype()))
            if entry is None:
                return None
            leaves = (array_a, array_b)
        else:
            entry = entries.get((op, array_a.aval, piece(b, []), default_dtype()))
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
        entry = entries.get((op, array_a.aval, default_dtype()))
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
    default_dtype = torch.get_default_dtype

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
        append(default_dtype())
        return tuple(key)

    return hit_key
