"""The eager op cache: one compiled XLA executable per op call signature.

A lowering run eagerly calls ``jax.numpy`` once per primitive, each its own dispatch. Once a
call signature (op overload, static arguments, input avals including ``weak_type``) has been
seen ``Config.op_cache_min_calls`` times, the lowering is traced once with abstract inputs and
compiled into one executable; later calls with that signature are a dict lookup plus one
launch. The rules (docs/architecture.md, "The eager op cache"):

- Only functional ATen/prims lowerings are cached (``plain_impl``); in-place and ``out=`` ops
  through their functional overload. Views are not: their outputs alias their input's storage
  and keep the function that recomputes them.
- A signature whose lowering reads values on the host (``nonzero``, ``x[mask]``) is never
  compiled: the first run of each new signature counts host reads, and a signature that fails
  to trace with abstract inputs, or returns no arrays (it runs for its side effects), is
  refused too. Reads made by the value checks of ``_checks`` (an index out of range) are not
  such reads: the op is compiled with its checks recorded (``_checks.checked``) and each call
  raises PyTorch's error from the executable's check flags.
- A signature whose lowering draws a PRNG key (``env.next_prng_key``) is never compiled: its
  trace runs inside a key scope, and a drawn key refuses it (PyTorch's
  ``nondeterministic_seeded`` tag is not relied on: attention with ``dropout_p=0`` carries it
  and draws nothing). A ``torch.Generator`` argument bypasses.
- Refusals are per signature, not per op: the same signature takes the same Python path
  through its lowering on every call (its static arguments, avals and default dtype are the
  key), but another signature of the op may not (``x[mask]`` reads, ``x[indices]`` does not;
  attention with dropout draws, without it does not), and one such call must not leave every
  other signature of the op uncompiled for the rest of the process.
- Inside a JAX trace (an input is a tracer) the lowering just runs: the caller's program is
  the compilation unit.
- The cache holds at most ``Config.op_cache_size`` entries (0 turns it off); hits, misses and
  compilations are counted in ``Environment.stats()``. Registering or unregistering a plugin
  clears it. Eviction is least-recently-used by second chance (CLOCK): a hit only sets its
  entry's ``used`` bit, and a full cache passes over the oldest entries, clearing their bits
  and moving the used ones to the back, until it finds one unused since the last pass. (An
  ``OrderedDict.move_to_end`` per hit hashed the key a second time: ~0.3-0.5 us of the
  ~25 us eager ``a + b``, measured inside the call.)
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import torch
from jax._src.array import ArrayImpl as _ArrayImplClass

from . import _checks
from ._compile_log import compiling
from ._precision import dtype_and_precision, recording
from ._registry import op_name
from ._stats import Stats, record_compile
from ._tensor import _DTYPES, _device_of
from ._x64 import x64

_ArrayImpl = type(jnp.zeros(()))


class NotCacheable(Exception):
    """An argument or result the cache cannot key on or return."""


class Op:
    """An op as its signatures name it: hashed by identity. (An ``OpOverload``'s own
    ``__hash__`` is Python code, and a hit hashes its key twice: the lookup, the LRU move.)

    ``context()`` is the last part of each of its keys: the default dtype (it takes part in
    promotion), and also PyTorch's float32 matmul precision once a trace of the op read it
    (``_precision``: products and convolutions; ``compile_entry`` switches it)."""

    __slots__ = ("func", "context")

    def __init__(self, func):
        self.func = func
        self.context: Callable[[], object] = torch.get_default_dtype


class OpCache:
    """One environment's compiled executables, LRU-bounded by ``config.op_cache_size``."""

    def __init__(self, env: Any):
        self.config = env.config
        self.env = env
        self.stats: Stats = getattr(env, "_stats", None) or Stats()
        self.entries: OrderedDict[Any, Any] = OrderedDict()
        self.seen: OrderedDict[Any, int] = OrderedDict()  # signatures not compiled yet: calls
        self.refused: OrderedDict[Any, str] = OrderedDict()  # signature -> why it is never compiled
        self.uncacheable: dict[Any, str] = {}  # op -> why some signature of it was refused
        self.checked: set[Any] = set()  # ops compiled with their value checks recorded
        self.ops: dict[Any, Op] = {}  # op overload -> its Op, the first item of its keys

    def op(self, func) -> Op:
        """The ``Op`` that names ``func`` in signatures (one per op overload)."""
        op = self.ops.get(func)
        if op is None:
            op = self.ops[func] = Op(func)
        return op

    def clear(self) -> None:
        self.entries.clear()
        self.seen.clear()
        self.refused.clear()
        self.uncacheable.clear()
        self.checked.clear()

    def capacity(self) -> int:
        return int(getattr(self.config, "op_cache_size", 0) or 0)

    def min_calls(self) -> int:
        return max(1, int(getattr(self.config, "op_cache_min_calls", 2) or 1))

    def note_seen(self, key) -> int:
        """Count one uncompiled call of ``key``; returns how many there were."""
        seen = self.seen
        n = seen.pop(key, 0) + 1
        seen[key] = n
        if len(seen) > 4 * max(self.capacity(), 64):
            seen.popitem(last=False)
        return n

    def insert(self, key, entry) -> None:
        """Add ``entry``, first evicting by second chance while the cache is full: the oldest
        entry goes, unless it was hit since it was last passed over; then it moves to the back
        with its bit cleared. Each pass clears a bit, so one is found within a round. The new
        entry goes in afterwards, unmarked: its own next hit marks it."""
        entries = self.entries
        self.seen.pop(key, None)
        capacity = self.capacity()
        if capacity < 1:
            return
        if key not in entries:
            while len(entries) >= capacity:
                oldest_key, oldest = entries.popitem(last=False)
                if oldest.used:
                    oldest.used = False
                    entries[oldest_key] = oldest
        entries[key] = entry

    def refuse(self, key, func, why: str) -> None:
        """Never compile the signature ``key`` of ``func`` (its calls then run plainly)."""
        refused = self.refused
        refused[key] = why
        refused.move_to_end(key)
        if len(refused) > 4 * max(self.capacity(), 64):  # bounded as ``seen``: one-off shapes
            refused.popitem(last=False)
        self.seen.pop(key, None)
        self.uncacheable[func] = why


def cacheable_op(func) -> bool:
    """Whether ``func``'s lowering may be cached at all (functional ATen/prims overloads).

    Ops tagged ``nondeterministic_seeded`` are not passed by: whether one is random can hang
    on its arguments (attention's ``dropout_p``; in eval, GPT-2's attention is a seeded op
    that draws nothing), and a lowering that draws a key is found when traced (``compile_entry``).
    """
    schema = getattr(func, "_schema", None)
    if schema is None or schema.is_mutable:
        return False
    if getattr(func, "namespace", None) not in ("aten", "prims"):
        return False  # custom ops (call_jax, third parties) may run arbitrary Python
    return not getattr(func, "is_view", False)


# -- signatures ---------------------------------------------------------------------------------

_TRUE, _FALSE = object(), object()
_STATIC_TYPES = frozenset(
    {
        type(None),
        int,
        str,
        torch.dtype,
        torch.device,
        torch.layout,
        torch.memory_format,
        type(Ellipsis),
    }
)


def _piece(x, leaves: list):
    """The part of a signature one argument contributes; arrays go to ``leaves``."""
    t = type(x)
    if t is _ArrayImpl:
        leaves.append(x)
        return x.aval  # shape, dtype and weak_type (the sharding is checked by the call)
    if t is Pending:
        leaves.append(x.root)
        return (Pending, x.recipe, x.root.aval)
    if t in _STATIC_TYPES:
        return x
    if t is float:
        # Tagged (2.0 is not 2). By value, but 0.0 == -0.0 and nan != nan: those by their
        # text, which tells the zeros apart and lets nan equal nan (hex() costs ~4 us a call
        # between two launches: only for them).
        return (float, x) if x == x and x != 0.0 else (float, x.hex())
    if t is bool:
        return _TRUE if x else _FALSE
    if t is list or t is tuple:
        return (t, *[_piece(y, leaves) for y in x])
    if t is complex:
        return (complex, x.real.hex(), x.imag.hex())
    raise NotCacheable(t)  # tracers (inside a JAX trace), generators, other objects


class Pending:
    """A transposing view not computed yet, passed to a cached op instead of its value.

    The op's executable gets the root array and applies the view itself, so XLA folds the
    transpose into the op (a matmul's dimension numbers) instead of copying it first. Made by
    ``_unwrap``'s unwrapper for views ``view_impl`` created deferred (``compute.recipe``).
    """

    __slots__ = ("tensor", "root", "compute", "recipe")

    def __init__(self, tensor, root, compute, recipe):
        self.tensor = tensor
        self.root = root
        self.compute = compute
        self.recipe = recipe  # (view op, its other arguments): what the signature keys on


def materialize(jargs):
    """``jargs`` with each ``Pending`` view computed (for a lowering run plainly), also inside
    a list argument (``cat``'s tensors)."""
    return [
        x.tensor._value() if type(x) is Pending else (materialize(x) if type(x) is list else x)
        for x in jargs
    ]


def signature(op, jargs, jkwargs, leaves: list):
    """The cache key of one call, filling ``leaves`` with its input arrays in order.

    ``op`` names the op (its ``OpCache.op``); ``_cached_op.cached_impl`` builds the same key
    straight from the call's Tensors on its hot path (``hit_key``): the two must agree.
    """
    key = [op]
    for a in jargs:
        key.append(_piece(a, leaves))
    if jkwargs:
        for name, value in jkwargs.items():
            key.append(name)
            key.append(_piece(value, leaves))
    # The default dtype takes part in promotion (int tensor * 1.5): torch.set_default_dtype
    # must not be answered by an executable compiled under the previous default (nor a new
    # matmul precision by one compiled under the previous mode: see Op).
    key.append(op.context())
    return tuple(key)


class _Slot:
    """Where an input array goes in an argument template (the arrays themselves are not kept:
    an executable outlives the call that compiled it)."""

    __slots__ = ()


_SLOT = _Slot()


class _ViewSlot:
    """A slot whose array is a ``Pending`` view's root: the view is applied inside the trace."""

    __slots__ = ("compute",)

    def __init__(self, compute):
        self.compute = compute


def _template(x) -> Any:
    t = type(x)
    if t is _ArrayImpl:
        return _SLOT
    if t is Pending:
        return _ViewSlot(x.compute)
    if t is list or t is tuple:
        return t(_template(y) for y in x)
    return x


def _fill(x, it) -> Any:
    """A template with each slot replaced by the next of ``it`` (the order ``_piece`` took)."""
    if x is _SLOT:
        return next(it)
    t = type(x)
    if t is _ViewSlot:
        return x.compute(next(it))
    if t is list or t is tuple:
        return t(_fill(y, it) for y in x)
    return x


def _check_outputs(out, top: bool = True) -> None:
    if top and not jax.tree_util.tree_leaves(out):
        # An op with no array result runs for what it does on the host (PyTorch's
        # _linalg_check_errors raises from the values; NumPy reads them through the buffer
        # protocol, which the host-read probe cannot see): compiled, it would do nothing.
        raise NotCacheable("the lowering returns no arrays (it runs for its side effects)")
    t = type(out)
    if t is list or t is tuple:
        for y in out:
            _check_outputs(y, False)
    elif out is not None and not isinstance(out, jax.Array) and t not in (int, float, bool):
        # (A Python number is a static result, as attention's max_q: see _Statics.)
        raise NotCacheable(f"the lowering returned a {t.__name__}")


_ARRAY = object()


class _Statics:
    """The Python numbers among a lowering's results (attention's ``max_q``, ``max_k``), learnt
    when it is traced: they depend only on the signature, so the executable returns just the
    arrays and ``rebuild`` puts the numbers back (a jitted function's Python numbers would come
    back as arrays). Left unset for the usual results, all arrays, which need no rebuild."""

    __slots__ = ("treedef", "values")

    def __init__(self):
        self.treedef = None
        self.values: list = []

    def split(self, out):
        """``out``, or its arrays alone (recording the rest) where it holds Python numbers."""
        flat, treedef = jax.tree_util.tree_flatten(out)
        if all(isinstance(x, jax.Array) for x in flat):
            return out
        self.treedef = treedef
        self.values = [_ARRAY if isinstance(x, jax.Array) else x for x in flat]
        return [x for x in flat if isinstance(x, jax.Array)]

    def rebuilding(self, call):
        """``call`` with its array results put back among the recorded numbers."""
        treedef, values = self.treedef, self.values
        if treedef is None:
            return call

        def rebuilt(*arrays):
            it = iter(call(*arrays))
            return treedef.unflatten([next(it) if v is _ARRAY else v for v in values])

        return rebuilt


# -- code that runs once -------------------------------------------------------------------------

_once = threading.local()


@contextlib.contextmanager
def compiling_nothing():
    """Within the block (this thread) the cache serves what it holds and compiles nothing new.

    For code that runs once: ``torchlax.jit``'s first call of a training step (its trace runs
    ops on the step counts the optimizers create; a refused first trace runs eagerly). There,
    a signature seen twice (the same op in two layers) would compile an executable used once
    or never again. Its calls still count towards ``op_cache_min_calls``.
    """
    before = getattr(_once, "active", False)
    _once.active = True
    try:
        yield
    finally:
        _once.active = before


def compiling_suspended() -> bool:
    return getattr(_once, "active", False)


# -- host reads ---------------------------------------------------------------------------------


class _HostReads:
    """Counts reads of array values into Python/NumPy while a probe is installed.

    ``count`` counts every read; ``other`` those not made by a value check of ``_checks``.
    """

    count = 0
    other = 0
    depth = 0
    # The originals (None where this JAX lacks one: its probe is then never installed).
    value: Any = _ArrayImplClass.__dict__.get("_value")
    array: Any = _ArrayImplClass.__dict__.get("__array__")
    to_host: Any = _ArrayImplClass.__dict__.get("copy_to_host_async")


def _note_read() -> None:
    _HostReads.count += 1
    if not _checks.reading_values():
        _HostReads.other += 1


def _counting_value(self):
    _note_read()
    return _HostReads.value.fget(self)


def _counting_array(self, *args, **kwargs):
    _note_read()
    return _HostReads.array(self, *args, **kwargs)


def _counting_to_host(self, *args, **kwargs):
    _note_read()
    return _HostReads.to_host(self, *args, **kwargs)


_PROBES = tuple(
    (name, counting)
    for name, original, counting in (
        ("_value", _HostReads.value, property(_counting_value)),
        ("__array__", _HostReads.array, _counting_array),
        ("copy_to_host_async", _HostReads.to_host, _counting_to_host),
    )
    if original is not None
)


@contextlib.contextmanager
def count_host_reads():
    """Within the block, ``_HostReads.count`` grows with every device-to-host read.

    (JAX's transfer guard would be the public way, but it does not guard CPU arrays.)
    """
    if _HostReads.depth == 0:
        for name, counting in _PROBES:
            setattr(_ArrayImplClass, name, counting)
    _HostReads.depth += 1
    try:
        yield _HostReads
    finally:
        _HostReads.depth -= 1
        if _HostReads.depth == 0:
            for name, _ in _PROBES:
                setattr(_ArrayImplClass, name, getattr(_HostReads, _ORIGINAL_ATTR[name]))


_ORIGINAL_ATTR = {"_value": "value", "__array__": "array", "copy_to_host_async": "to_host"}


def run_probed(cache: OpCache, key, func, fn, jargs, jkwargs):
    """Run the lowering plainly; a signature that read a value on the host is never compiled,
    an op whose only reads were its value checks is compiled with the checks recorded."""
    with count_host_reads() as reads:
        before, other_before = reads.count, reads.other
        try:
            return fn(*jargs, **jkwargs)
        finally:
            # Also when it raised: a value check read the value and failed; compiled without
            # recording, the check would be traced away for the next call.
            if reads.other != other_before:
                cache.refuse(key, func, "its lowering reads values on the host")
            elif reads.count != before:
                cache.checked.add(func)


# -- compiling ----------------------------------------------------------------------------------


@functools.cache
def _scope_key():
    with x64():
        return jax.random.key(0)


class Entry:
    """A compiled signature: the executable, and a ``jax.jit`` for inputs it does not take.

    ``meta`` is (shape, torch dtype, torch device) of a single-array result, learnt from the
    first one: a hit wraps its result without reading them off the new array. ``used``: hit
    since the cache last passed over it (``OpCache.insert``'s second chance).
    """

    __slots__ = ("call", "traced", "meta", "checked", "compiled", "statics", "used")

    def __init__(self, call, traced, checked: bool = False, statics: _Statics | None = None):
        self.traced = traced
        self.checked = checked
        self.statics = statics or _Statics()
        self.compiled = call
        self.call = self._finished(call)
        self.meta = None
        self.used = False

    def _finished(self, call):
        """``call`` raising its recorded checks' errors and returning the lowering's results."""
        return self.statics.rebuilding(_raising(call) if self.checked else call)

    def launch_directly(self) -> None:
        """After the first call: call JAX's C++ launcher of the executable itself.

        ``Compiled.__call__`` is a Python frame around it (~2 us a hit on a loaded machine);
        JAX creates the launcher on that first call and keeps it as ``_call`` (JAX's private
        name: where it is absent, the call stays as it was).
        """
        launch = cpp_launcher(self.compiled)  # (None after relax: a jax.jit now)
        if launch is not None:
            self.call = self._finished(launch)

    def learn(self, out) -> None:
        if type(out) is _ArrayImpl:
            dtype = _DTYPES.get(out.dtype)
            if dtype is not None:
                self.meta = (tuple(out.shape), dtype, _device_of(out))

    def relax(self):
        """Called with inputs on other devices (or shardings): use ``jax.jit``'s own cache."""
        self.call = self._finished(jax.jit(self.traced))
        self.compiled = None  # (launch_directly leaves the jit alone)
        self.meta = None  # results may land elsewhere now
        return self.call


def cpp_launcher(executable) -> Any:
    """The C++ launcher JAX made for a compiled executable on its first call and keeps as
    ``_call`` (JAX's private name; ``jax.stages.Compiled.__call__`` is a Python frame around
    it), or None: not a ``jax.stages.Compiled`` (a ``jax.jit`` fallback), not called yet, or a
    JAX without it. The op cache's and the compiled programs' entries launch through it."""
    if isinstance(executable, jax.stages.Compiled):
        return getattr(executable, "_call", None)
    return None


def _raising(call):
    """``call`` of a program compiled with ``_checks.checked``: raises what its checks found
    (one read of the error flags per call, as the eager check's own read), else the outputs."""

    def checked_call(*arrays):
        error, out = call(*arrays)
        _checks.raise_error(error)
        return out

    return checked_call


def compile_entry(cache: OpCache, key, func, fn, jargs, jkwargs, leaves):
    """Trace ``fn`` with abstract inputs and compile it; ``None`` refuses the signature ``key``.

    The entry goes into the cache under ``keyed(cache, func, key)``: its trace may have
    switched the op's keys to include the matmul precision."""
    args_template = _template(list(jargs))
    kwargs_template = {k: _template(v) for k, v in jkwargs.items()}

    statics = _Statics()

    def traced(*arrays):
        it = iter(arrays)
        out = fn(*_fill(args_template, it), **{k: _fill(v, it) for k, v in kwargs_template.items()})
        _check_outputs(out)
        return statics.split(out)

    checked = func in cache.checked
    if checked:
        traced = _checks.checked(traced)
    env = cache.env
    start = time.perf_counter()
    try:
        with env.prng_key_scope(_scope_key()) as scope, recording() as reads:
            lowered = jax.jit(traced).lower(*leaves)
        if reads.precision is not None:  # this op's keys tell the matmul precisions apart
            cache.op(func).context = dtype_and_precision
        if scope.drawn:  # a random op: a key baked into the executable would never change
            cache.refuse(key, func, "its lowering draws PRNG keys")
            return None
        with compiling(op_name(func), level=None):  # record_compile logs it
            compiled = lowered.compile()
    except Exception as exc:  # a host read, a data-dependent shape, a Python result, ...
        cache.refuse(
            key,
            func,
            f"its lowering does not trace with abstract inputs "
            f"({type(exc).__name__}: {str(exc)[:200]})",
        )
        return None
    record_compile(op_name(func), time.perf_counter() - start, env)
    return Entry(compiled, traced, checked, statics)


def keyed(cache: OpCache, func, key: tuple) -> tuple:
    """``key`` (built before ``func`` was traced) with its op's context as it is now."""
    return (*key[:-1], cache.op(func).context())
