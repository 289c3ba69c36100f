"""One compiled program: a function over flat jax arrays and a key, compiled per signature.

``torchlax.jit``, the ``torch.compile`` backend and export each turn PyTorch code into a
function of flat ``jax.Array`` inputs and a PRNG key. What happens around that function is
the same for all three and lives here (docs/architecture.md, "Compiled programs"):

- The cache: one entry per input signature (the caller's key: avals, static values). An
  entry is traced once (under the program's lock: concurrent first calls of one signature
  trace and compile once), compiled on first use, and counted in
  ``current_env().stats()`` (slow compilations are logged once, as the op cache does). The
  cache is bounded (least recently used entries go first).
- The key input: whether the program draws random keys is learned by tracing each signature
  (``KeyScope.drawn``), so a deterministic signature is called with the constant
  ``unused_key()`` and a random one with a fresh key from the environment's generator.
- Donation of the arguments the caller names (state replaced by the program's outputs).
- Checked mode: value checks recorded while tracing are raised after the call, before the
  caller writes anything back.
- A value of another, finished trace that the function reads (JAX lifts it as an input no
  call passes, or refuses it): a ``JitError`` naming the program and what to do.
- What tracing learned beyond arrays (output structure, which inputs were mutated): the
  function returns ``(results, info)``; ``info`` is kept on the entry.
- Write-back into the caller's tensors (``write_back``) and the output layout
  (``output_tensors``).
"""

from __future__ import annotations

import collections
import operator
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import jax
import jax.core
import torch

from . import _compile_log
from ._checks import checked, raise_error
from ._current import current_env
from ._errors import JitError
from ._layouts import viewed_back
from ._opcache import cpp_launcher
from ._precision import current_precision, recording
from ._program import unused_key, unused_key_data
from ._stats import record_compile
from ._tensor import (
    _STRIDED,
    Tensor,
    _ArrayImpl,
    _device_of,
    _make,
    _make_wrapper_subclass,
    _Storage,
    spans_storage,
)
from ._x64 import x64


def signature(arrays: Sequence[jax.Array]) -> tuple:
    """The part of a program's cache key its array inputs give: shape, dtype, weak type."""
    return tuple((a.shape, a.dtype, getattr(a, "weak_type", False)) for a in arrays)


class Entry:
    """One signature of a program: its trace, what tracing learned, its executable."""

    __slots__ = (
        "info",
        "random",
        "jaxpr",
        "out_tree",
        "_traced",
        "_jitted",
        "_executable",
        "_launch",
        "_unused_key",
        "_program",
        "precision",
        "_pending",
    )

    def __init__(
        self,
        program: CompiledProgram,
        traced,
        jitted,
        info,
        random: bool,
        precision: str | None = None,
    ):
        self._program = program
        # The float32 matmul precision its trace read (None: it read none), see ``stale``
        self.precision = precision
        # The traced program as a closed jaxpr (only with ``keep_jaxpr``): a pure function of
        # the flat inputs and key, which callers can transform (differentiate) without
        # running the traced Python again; ``out_tree`` is its results' pytree structure.
        self.jaxpr = traced.jaxpr if program.keep_jaxpr else None
        self.out_tree = traced.out_tree if program.keep_jaxpr else None
        self._traced = traced  # jax's Traced stage, until compiled
        self._jitted = jitted  # the jax.jit function (the fallback for inputs on other devices)
        self._executable = None
        # A compilation running in another thread (``CompiledProgram.compile_ahead``)
        self._pending: _Pending | None = None
        # The executable's C++ launcher, once its first call made it (see ``launch_directly``)
        self._launch: Callable | None = None
        self.info = info
        self.random = random
        # The key input of every call if the program draws none (``run`` reads it directly)
        self._unused_key = None if random else self.key()

    def stale(self) -> bool:
        """Whether the float32 matmul precision its trace read has changed since: a caller
        that repeats this entry without ``CompiledProgram.entry`` (which keys on the mode)
        must look it up again."""
        precision = self.precision
        return precision is not None and precision != current_precision()

    def key(self, env=None) -> Any:
        """This call's key input: fresh from the generator if the program draws any."""
        if self._program.key_data:
            if self.random:
                return (env or current_env()).next_prng_key_data()
            return unused_key_data()
        return (env or current_env()).next_prng_key() if self.random else unused_key()

    @property
    def executable(self) -> Callable:
        executable = self._executable
        if executable is None:
            executable = self._program._compile(self)
        return executable

    def compile_ahead(self, *, progress: bool = True) -> None:
        """Start compiling it in another thread (``CompiledProgram.compile_ahead``)."""
        self._program.compile_ahead(self, progress=progress)

    def wait_compiled(self) -> BaseException | None:
        """Wait for a compilation started by ``compile_ahead``; return its error (which stays
        for the call that needs the executable to raise), None if it succeeded or none ran."""
        pending = self._pending
        if pending is None:
            return None
        pending.done.wait()
        return pending.error

    def launch_directly(self) -> None:
        """After the executable's first call: call JAX's C++ launcher of it itself.

        ``jax.stages.Compiled.__call__`` is a Python frame around that launcher (which it
        creates on its first call and keeps as ``_call``, JAX's private name); calling the
        launcher saves that frame and this entry's ``executable`` lookup, ~4 us of a repeated
        forward's ~20 us launch (the op cache's ``Entry.launch_directly`` does the same). Where
        ``_call`` is absent, or the executable was replaced by the ``jax.jit`` fallback, calls
        stay as they were. The launcher takes the same pytree of inputs and donates the same.
        """
        self._launch = cpp_launcher(self._executable)

    def plain_launch(self) -> tuple[Callable, Any] | None:
        """``(launch, key)``: ``launch(*args, key)`` is what ``CompiledProgram.run(entry,
        *args)`` does for this entry when nothing goes wrong, with nothing around it (JAX's
        C++ launcher of the executable and the constant key input), for a caller that repeats
        one call and checks its inputs itself. ``torchlax.jit``'s repeated forward calls it:
        ``run``'s frame, its key and launcher lookups and its ``try`` are a part of a call that
        costs what JAX's whole call costs.

        None where ``run`` does more: a program that draws keys (a fresh key each call) or
        reads its checks, an entry not launched yet, or one launched through the ``jax.jit``
        fallback. A launch that raises (inputs on other devices, tracers of an outer trace, a
        deleted array) has done nothing: the caller then goes through ``run``, which handles
        or raises it."""
        if self.random or self._program.checks or self._launch is None:
            return None
        return self._launch, self._unused_key


class CompiledProgram:
    """``fn`` compiled once per input signature, with its key, donation and checks handled.

    ``fn(static, *arrays)`` runs on tracers, inside a key scope of the program's key input
    (random ops split their keys from it), and returns ``(results, info)``: ``results``
    a pytree of arrays, ``info`` whatever the caller wants to remember about this signature
    (plain Python, learned while tracing). ``static`` is the caller's per-signature static
    value (``None`` if it has none). ``donate_argnums`` index ``arrays``. ``keep_jaxpr``
    keeps each entry's traced program as ``Entry.jaxpr`` (and ``Entry.out_tree``).
    """

    def __init__(
        self,
        name: str,
        fn: Callable,
        *,
        donate_argnums: Sequence[int] = (),
        checks: bool = False,
        max_signatures: int = 64,
        key_data: bool = False,
        env=None,
        keep_jaxpr: bool = False,
    ):
        self.name = name
        self.fn = fn
        self.donate_argnums = tuple(donate_argnums)
        self.checks = checks
        self.max_signatures = max_signatures
        # The key input as raw uint32 key data (a portable artifact's input) instead of a key.
        self.key_data = key_data
        self.env = env
        self.keep_jaxpr = keep_jaxpr
        self.traces = 0
        self.compilations = 0
        self._last_avals: tuple | None = None  # the latest trace's inputs (recompile reasons)
        self._entries: OrderedDict[Hashable, Entry] = OrderedDict()
        self._lock = threading.RLock()

    def entry(self, sig: Hashable, args: Sequence, static: Any = None) -> Entry:
        """The entry of signature ``sig`` (traced now with ``args`` if new) under the float32
        matmul precision now: the lowerings read it while tracing (``_precision``)."""
        sig = (sig, current_precision())
        entry = self._entries.get(sig)
        if entry is not None:
            try:
                self._entries.move_to_end(sig)
            except KeyError:  # evicted by another thread meanwhile: it stays valid for this call
                pass
            return entry
        with self._lock:
            entry = self._entries.get(sig)
            if entry is None:
                entry = self._trace(args, static)
                self._entries[sig] = entry
                while len(self._entries) > self.max_signatures:
                    self._entries.popitem(last=False)
        return entry

    def __call__(self, sig: Hashable, *args, static: Any = None):
        """Run the program on ``args``; return ``(results, entry)``.

        Check errors (checked mode) are raised here, before the caller uses any result.
        """
        entry = self.entry(sig, args, static)
        results = self.run(entry, *args)
        return results, entry

    def run(self, entry: Entry, *args, key: jax.Array | None = None):
        """Run ``entry`` on ``args`` with ``key`` (default: this call's, ``entry.key()``).

        It may be called outside JAX's 64-bit mode (``torchlax.jit``'s repeated forward is):
        launching a compiled executable does not read the mode, and what traces or compiles
        here switches it on itself."""
        if key is None:
            key = entry._unused_key
            if key is None:
                key = entry.key(self.env)
        launch = entry._launch
        try:
            if launch is not None:
                results = launch(*args, key)
            else:
                results = entry.executable(*args, key)
                entry.launch_directly()
        except ValueError as exc:
            if "sharding" not in str(exc):
                raise
            # Inputs on other devices than at compile time: jax.jit places the program anew
            # (in 64-bit mode, as it was traced: a caller may launch outside it, see below).
            entry._executable = entry._jitted
            entry._launch = None
            with x64():
                results = entry._jitted(*args, key)
        except TypeError:
            if not any(isinstance(a, jax.core.Tracer) for a in jax.tree.leaves(args)):
                raise
            # Called inside another JAX trace (call_torch under jax.jit): inline the program.
            with x64():
                results = entry._jitted(*args, key)
        if self.checks:
            error, results = results
            raise_error(error)
        return results

    def executables(self) -> dict:
        """(signature, matmul precision) -> compiled executable, for the entries compiled so
        far."""
        return {sig: e._executable for sig, e in list(self._entries.items()) if e._executable}

    def entries(self) -> list[Entry]:
        """Its entries (traced signatures), least recently used first."""
        return list(self._entries.values())

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    # -- building ---------------------------------------------------------------------------

    def jitted(self, static: Any = None, *, with_key: bool = True, learned: list | None = None):
        """``fn`` as a ``jax.jit`` function of ``(*arrays, key)`` (or of ``arrays`` alone,
        ``with_key=False``, for a program known to draw no key), with the program's donation
        and checks. Each trace puts ``[info, drawn]`` into ``learned``."""
        env = self.env or current_env()
        learned = [] if learned is None else learned

        def traced(*flat):
            if with_key:
                *arrays, key = flat
                if self.key_data:
                    key = jax.random.wrap_key_data(key)
            else:
                arrays, key = flat, unused_key()
            with env.prng_key_scope(key) as scope:
                results, info = self.fn(static, *arrays)
            learned[:] = [info, scope.drawn]
            return results

        fn = checked(traced) if self.checks else traced
        # Donation is off in checked mode: a failed call must leave the inputs as they were.
        donate = () if self.checks else self.donate_argnums
        return jax.jit(fn, donate_argnums=donate)

    def key_input(self) -> Any:
        """An example of the key input (traced with; its aval is the program's)."""
        return unused_key_data() if self.key_data else unused_key()

    def _trace(self, args: Sequence, static) -> Entry:
        learned: list = []
        jitted = self.jitted(static, learned=learned)
        start = time.perf_counter()
        try:
            with x64(), recording() as reads:
                trace = jitted.trace(*args, self.key_input())
        except jax.errors.UnexpectedTracerError as exc:  # (one JAX did not take as an input)
            raise JitError(
                f"{self.name}: a tensor from another (finished) trace reached this program. A "
                "value computed inside a compiled function was kept outside it (stored on an "
                "object torchlax does not track as state, or a global list). Return such values "
                "from the function instead, or keep them in a module buffer, an optimizer or a "
                "torchlax Tensor the function closes over."
            ) from exc
        self.traces += 1
        avals = _compile_log.avals_of(args)
        _compile_log.traced(
            self.name, time.perf_counter() - start, avals, self._last_avals, self.traces
        )
        self._last_avals = avals
        lifted = len(trace.jaxpr.in_avals) - len(jax.tree.leaves(args)) - 1
        if lifted > 0:
            # JAX takes a value of a finished trace that the function reads (a tracer kept in
            # an object the caller did not pass in) as an extra input no call passes: the
            # executable would refuse every call with "compiled for N inputs".
            raise JitError(
                f"{self.name}: the traced function reads {lifted} value(s) computed inside an "
                "earlier trace of a compiled function and kept outside it (a tensor created or "
                "written during that trace and stored on an object that is not part of the "
                "program's state, e.g. an optimizer or a module the function reaches only "
                "through another object). Pass such modules and optimizers as arguments or "
                "close over them directly, or return the values instead of storing them."
            )
        info, random = learned
        return Entry(self, trace, jitted, info, random, reads.precision)

    def compile_ahead(self, entry: Entry, *, progress: bool = True) -> None:
        """Start compiling ``entry`` in another thread, so that the caller can trace (or
        compile) something else meanwhile: XLA's compiler releases the GIL.

        It is lowered here, in the caller's thread (lowering reads the thread's JAX
        configuration, and holds the GIL anyway); ``entry.executable`` then waits for the
        compilation. If it fails, the first caller that needs the executable raises its
        error, and a later one compiles again. ``progress``: whether a terminal shows a
        progress line while it runs long (one compilation at a time should)."""
        with self._lock:
            if entry._executable is not None or entry._pending is not None:
                return
            env = self.env or current_env()
            with x64():
                lowered = entry._traced.lower()
            pending = entry._pending = _Pending()
        thread = threading.Thread(
            target=self._compile_lowered,
            args=(entry, lowered, pending, env, progress),
            name=f"torchlax-compile {self.name}",
            daemon=True,
        )
        thread.start()

    def _compile_lowered(self, entry: Entry, lowered, pending: _Pending, env, progress: bool):
        try:
            try:
                after = -1.0 if progress else None
                with _compile_log.compiling(self.name, progress_after=after) as compilation, x64():
                    executable = lowered.compile()
            except BaseException as exc:  # noqa: BLE001  (raised by the call that needs it)
                pending.error = exc
                return
            with self._lock:
                entry._executable = executable
                entry._traced = None
                entry._pending = None
                self.compilations += 1
            record_compile(self.name, compilation.seconds, env, logged=True)
        finally:
            pending.done.set()

    def _compile(self, entry: Entry):
        while True:
            with self._lock:
                if entry._executable is not None:
                    return entry._executable
                pending = entry._pending
                if pending is None:
                    with _compile_log.compiling(self.name) as compilation, x64():
                        entry._executable = entry._traced.lower().compile()
                    entry._traced = None
                    self.compilations += 1
                    record_compile(self.name, compilation.seconds, self.env, logged=True)
                    return entry._executable
            pending.done.wait()  # (outside the lock: the compiling thread takes it to finish)
            with self._lock:
                if pending.error is not None and entry._pending is pending:
                    entry._pending = None  # raised once; a later call compiles again
                    raise pending.error


class _Pending:
    """A compilation running in another thread: set ``done`` when it ends, with ``error``."""

    __slots__ = ("done", "error")

    def __init__(self):
        self.done = threading.Event()
        self.error: BaseException | None = None


# -- the caller's side: outputs and write-back ---------------------------------------------------


def output_tensors(
    arrays: Sequence[jax.Array],
    on_jax: bool,
    to_torch: Callable[[list, list], list],
    devices: Sequence[torch.device | None] | None = None,
    orders: Sequence[tuple[int, ...] | None] = (),
) -> list[torch.Tensor]:
    """A program's array results as the caller's tensors.

    Each goes where ``devices`` says (a graph's fake outputs know their device; ``None``: as
    the call was): ``jax`` gives a torchlax Tensor; ``cpu``/``cuda`` a torch tensor from
    ``to_torch(arrays, devices)`` (DLPack: sharing the XLA buffer, no copy). One returned in
    memory order (``orders``, per array: ``returned_in_memory_order``'s, or None) is viewed
    back with eager's strides (``viewed_back``).
    """
    out = _placed(arrays, on_jax, to_torch, devices)
    for i, order in enumerate(orders):
        if order is not None:
            out[i] = viewed_back(out[i], order)
    return out


def _placed(arrays: Sequence[jax.Array], on_jax: bool, to_torch: Callable, devices) -> list:
    if devices is None:
        if on_jax:
            return [_wrap_result(a) for a in arrays]
        return to_torch(list(arrays), [None] * len(arrays))
    out: list = [None] * len(arrays)
    rest = []
    for i, (array, device) in enumerate(zip(arrays, devices, strict=True)):
        if device is None:
            if on_jax:
                out[i] = _wrap_result(array)
            else:
                rest.append(i)
        elif device.type == "jax":
            out[i] = _wrap_result(array)
        else:
            rest.append(i)
    if rest:
        converted = to_torch([arrays[i] for i in rest], [devices[i] for i in rest])
        for i, tensor in zip(rest, converted, strict=True):
            out[i] = tensor
    return out


# An executable's results share one sharding object from call to call: the torch device of the
# last one seen is remembered by identity (the core's general lookup hashes and compares the
# sharding). One tuple, replaced whole, so a racing thread reads a consistent pair.
_last_result_device: tuple = (None, None)


def wrap_results(arrays: Sequence[jax.Array]) -> list[Tensor]:
    """A program's array results as torchlax Tensors (``output_tensors`` where every result
    goes to the jax device)."""
    return [_wrap_result(a) for a in arrays]


def result_specs(tensors: Sequence[Tensor], arrays: Sequence[jax.Array]) -> list[tuple]:
    """What ``wrap_results_like`` needs to wrap the next results of the executable that made
    ``arrays`` (wrapped as ``tensors``): an executable's results have the same shapes, dtypes
    and sharding object on every call."""
    return [
        (t.shape, t.dtype, t.device, getattr(a, "sharding", None))
        for t, a in zip(tensors, arrays, strict=True)
    ]


def wrap_results_like(arrays: Sequence[jax.Array], specs: Sequence[tuple]) -> list[Tensor]:
    """``wrap_results``, for the results of an executable whose earlier results gave ``specs``
    (``result_specs``): each tensor is made from them, without reading the array's shape,
    dtype and device (an array placed otherwise, by a fallback path, is wrapped as usual)."""
    out = []
    for array, (shape, dtype, device, sharding) in zip(arrays, specs, strict=True):
        if type(array) is not _ArrayImpl or array.sharding is not sharding:
            out.append(_wrap_result(array))
            continue
        tensor = _make_wrapper_subclass(Tensor, shape, None, None, None, dtype, _STRIDED, device)
        tensor._storage = _Storage(array)
        tensor._view = None
        out.append(tensor)
    return out


def _wrap_result(array: jax.Array) -> Tensor:
    """A program's result as a torchlax Tensor (on the hot path of every compiled call)."""
    global _last_result_device
    if type(array) is not _ArrayImpl:  # a tracer (a program inlined into an outer JAX trace)
        return _make(array)
    sharding = array.sharding
    last_sharding, device = _last_result_device
    if sharding is not last_sharding:
        device = _device_of(array)
        _last_result_device = (sharding, device)
    return _make(array, device=device)


def write_back(dst: torch.Tensor, array: jax.Array, to_torch: Callable = torch.from_dlpack) -> None:
    """Write a program's new value of an input it mutated into the caller's tensor, in place.

    A torchlax Tensor takes the new array (no copy; through a view, its base is written); a
    torch tensor is ``copy_``-ed into (its ``_version`` bumps as for any in-place write).
    """
    if isinstance(dst, Tensor):
        dst._write(array)
        return
    with torch.no_grad():
        dst.copy_(to_torch(array))


# -- exclusive arrays (what a compiled program may donate; see ``_tensor._Storage``) ----------


def peek_array(tensor: Tensor) -> jax.Array:
    """``array_of(tensor)``, except that an exclusive storage stays exclusive: for a compiled
    program that hands none of its inputs' arrays out (it tracks its own outputs)."""
    if tensor._view is None:
        # A root (every state tensor of a training step): its storage's array, flag untouched
        # (a root's ``_value`` would only clear a flag that is then already clear).
        return tensor._storage.array
    if is_exclusive(tensor):
        return tensor._peek()
    return tensor._value()


def root_values(tensors: Sequence[Tensor]) -> list[jax.Array]:
    """``[t.jax() for t in tensors]`` for root torchlax Tensors (the caller checked that none
    is a view): each storage's array, marked handed out as ``jax()`` marks it, without
    ``jax()``'s three Python frames per tensor (a repeated ``torchlax.jit`` call's
    arguments, on every call)."""
    storages = list(map(_STORAGE, tensors))
    for storage in storages:
        storage.exclusive = False
    return list(map(_STORAGE_ARRAY, storages))


_STORAGE = operator.attrgetter("_storage")
_STORAGE_ARRAY = operator.attrgetter("array")


def peek_arrays(tensors: Sequence[Tensor]) -> list[jax.Array]:
    """``peek_array`` of each torchlax Tensor (a compiled call's inputs, on every call: a
    training step passes its whole state)."""
    return list(map(peek_array, tensors))


def is_exclusive(tensor: Tensor) -> bool:
    """Whether ``tensor`` spans its whole storage (no view, or an identity view) and nothing
    outside that storage has seen its array since a compiled program wrote it: the array can
    be donated to XLA without anyone left to read it."""
    return tensor._storage.exclusive and spans_storage(tensor)


def set_exclusive(tensor: Tensor) -> None:
    """Record that ``tensor``'s storage now holds an array no one outside it has seen (a
    compiled program just wrote it there, and handed it out nowhere else)."""
    if spans_storage(tensor):
        tensor._storage.exclusive = True


def donatable(arrays: list, exclusive: Sequence[bool], kept: Sequence = ()) -> list:
    """The arrays a compiled call donates, as it may donate them: each as it is where its
    storage holds it exclusively (``exclusive``, in order: ``is_exclusive``, or the storage's
    flag) and the call passes it nowhere else (at another position of ``arrays``, or among
    ``kept``, its arrays not donated), else a copy.

    So an array someone can still read (taken with ``t.jax()`` or DLPack, returned unchanged
    by a ``clone()``'s lowering, passed twice) stays valid when the program deletes what it
    was given; the caller writes the program's results back into the storages, marking them
    exclusive (``write_back_all``), so a training loop copies on its first step only. The
    copy is ``device_put`` (no program compiled per shape). ``arrays`` is returned itself
    where nothing needs a copy."""
    copied = [not alone for alone in exclusive]
    ids = list(map(id, arrays))
    if len(set(ids).union(map(id, kept))) < len(ids) + len(kept):
        counts = collections.Counter(ids)
        counts.update(map(id, kept))
        copied = [c or counts[i] > 1 for c, i in zip(copied, ids, strict=True)]
    if not any(copied):
        return arrays
    # One device_put of the list: a training step whose state the user read copies hundreds
    # of arrays, and JAX batches a list's transfers (a third of the host time of one each).
    at = [i for i, c in enumerate(copied) if c]
    result = list(arrays)
    for i, copy in zip(at, jax.device_put([arrays[i] for i in at], may_alias=False), strict=True):
        result[i] = copy
    return result


def write_back_all(
    tensors: Sequence[Tensor], arrays: Sequence[jax.Array], exclusive: Sequence[bool]
) -> None:
    """``write_back`` of each of ``arrays`` into the torchlax Tensor at its position, in one
    loop (a training step writes every state tensor: the hot path), marking the storage
    exclusive where ``exclusive`` says the program handed that array out nowhere else.

    A root takes its new array directly; a view goes through ``Tensor._write`` (its base is
    written), and only one spanning its storage can mark it exclusive.
    """
    for tensor, array, alone in zip(tensors, arrays, exclusive, strict=True):
        storage = tensor._storage
        if tensor._view is None:
            storage.array = array
            storage.exclusive = alone
        else:
            tensor._write(array)  # clears the flag
            if alone:
                set_exclusive(tensor)
