"""The environment: configuration, lowering tables, PRNG state and device placement.

Ops run through ``_run.run_op``: one dict lookup in ``_resolved`` for the op's implementation,
then the call. Everything else (asking plugins, deriving in-place, ``out=`` and view
behaviour from the functional lowering) happens once per op in ``_resolve``. Which
environment is current (``enable``, ``current_env``) lives in ``_current``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.core
import torch
import torch.utils._pytree

from . import _builtins, _opcache, _plugin_checks, _privateuse1, _program, _stats, _tensor
from ._current import _current_scopes, _scoped, _Scopes
from ._current import current_env as current_env
from ._current import default_env as default_env
from ._current import disable_globally as disable_globally
from ._current import enable as enable
from ._current import enable_globally as enable_globally
from ._current import is_enabled as is_enabled
from ._dispatch import lowering_impl
from ._errors import OpNotLoweredError
from ._mutation import derived_mutation_impl, functional_counterpart
from ._overlap import overlap_checked
from ._registry import Lowering, PluginHost, PluginRecord, Tables, op_name
from ._run import run_op
from ._views import inplace_view_counterpart, inplace_view_impl
from ._x64 import x64


@dataclasses.dataclass
class Config:
    """Settings of one environment. Plugins may adjust them in ``torchlax_configure``."""

    #: Run ops that have no lowering with PyTorch on the CPU (``jax.pure_callback`` under jit)
    #: instead of raising ``OpNotLoweredError``. Each such op warns once. Env: TORCHLAX_FALLBACK=1.
    fallback_to_torch: bool = dataclasses.field(
        default_factory=lambda: os.environ.get("TORCHLAX_FALLBACK", "") == "1"
    )
    #: Compiled programs (``torchlax.jit``, ``torch.compile``) check what eager ops check (an
    #: index out of range, ...) with ``jax.experimental.checkify`` and raise PyTorch's error
    #: after the call; off, they return JAX's clamped or filled values. Eager ops always check.
    #: Env: TORCHLAX_CHECKS=1.
    checked: bool = dataclasses.field(
        default_factory=lambda: os.environ.get("TORCHLAX_CHECKS", "") == "1"
    )
    #: Compiled executables the eager op cache keeps (one per op call signature, LRU); 0 turns
    #: the cache off. Env: TORCHLAX_OP_CACHE_SIZE.
    op_cache_size: int = dataclasses.field(
        default_factory=lambda: int(os.environ.get("TORCHLAX_OP_CACHE_SIZE", "") or 4096)
    )
    #: The call of a signature on which the op cache compiles it (earlier calls run the
    #: lowering op by op). 1 compiles on the first call (tests use it to exercise the cache).
    #: Env: TORCHLAX_OP_CACHE_MIN_CALLS.
    op_cache_min_calls: int = dataclasses.field(
        default_factory=lambda: int(os.environ.get("TORCHLAX_OP_CACHE_MIN_CALLS", "") or 2)
    )
    #: An XLA compilation slower than this (seconds) is logged once, with its name and time,
    #: through the ``torchlax`` logger (shown with TORCHLAX_LOG=info).
    slow_compile_seconds: float = 2.0


class Environment:
    """Configuration, lowering tables, PRNG state and device placement for torchlax.

    Most programs use the one ``torchlax.default_env()`` returns. A separate environment
    (``Environment(autoload=False)``) is useful in tests of the registry.
    """

    def __init__(
        self,
        config: Config | None = None,
        *,
        autoload: bool | None = None,
        strict_plugins: bool | None = None,
    ):
        self.config = config or Config()
        # Serialises plugin (un)registration and table rebuilds; dispatch never takes it.
        self._lock = threading.RLock()
        self._host = PluginHost(autoload=autoload, strict=strict_plugins)
        for name, plugin in _builtins.BUILTIN_PLUGINS.items():
            self._host.register(plugin, name, distribution="torchlax-core")
        self._host.load_entry_points()
        self._host.pm.hook.torchlax_configure.call_historic(kwargs={"config": self.config})
        self._tables: Tables = Tables()
        self._resolved: dict[Any, Callable] = {}
        self._placements: dict[Any, Any] = {}
        self._warned: set[Any] = set()
        self._stats = _stats.Stats()
        self._op_cache = _opcache.OpCache(self)
        self._rebuild()

    # -- plugins ------------------------------------------------------------------------------

    @property
    def plugin_manager(self):
        """The underlying ``pluggy.PluginManager``."""
        return self._host.pm

    def register_plugin(self, plugin: Any, name: str | None = None) -> str | None:
        """Register a plugin object or module now; its registrations take effect at once.

        Returns the plugin's name, or ``None`` if it is blocked (``TORCHLAX_BLOCK_PLUGINS``).
        A plugin that cannot be registered (a hook argument its hookspec lacks, an unknown
        hook, a registration hook that raises, an op another plugin owns without
        ``override=True``) raises ``PluginError`` naming it, and the environment stays as it
        was: nothing of the plugin is registered.
        """
        with self._lock:
            registered = self._host.register(plugin, name, explicit=True)
            if registered is None:
                return None
            try:
                self._rebuild(new_plugin=registered)
            except BaseException:
                self._host.unregister(registered)  # the tables were never swapped
                raise
            return registered

    def unregister_plugin(self, plugin_or_name: Any) -> None:
        """Remove a plugin; ops it lowered go back to their previous owner (or to none)."""
        with self._lock:
            self._host.unregister(plugin_or_name)
            self._rebuild()

    def plugins(self) -> list[PluginRecord]:
        """Every plugin this environment knows of: loaded, blocked or failed."""
        return list(self._host.records.values())

    def _rebuild(self, new_plugin: str | None = None) -> None:
        # The new tables and empty caches are swapped in whole: a thread dispatching meanwhile
        # keeps the dicts it already read. Torch's kernel registrations are process-wide.
        with self._lock, _kernels_lock:
            tables = self._host.build_tables(new_plugin)
            self._tables = tables
            self._resolved = {}
            self._placements = {}
            self._op_cache.clear()  # executables of lowerings that may have changed owner
            _tensor.set_function_overrides(self, tables.functions)
            _privateuse1.register_factory_kernels(tables)
            _privateuse1.register_composite_overrides(tables)

    # -- introspection ------------------------------------------------------------------------

    def lowering_for(self, op: Any) -> Lowering | None:
        """The table entry that will handle ``op``, with the name of the plugin that owns it.

        ``op`` is an ATen ``OpOverload``/``OpOverloadPacket`` or a torch-level function. Returns
        ``None`` when nothing lowers it (the fallback, if on, would then run it).
        """
        t = self._tables
        if isinstance(op, torch._ops.OpOverload):
            candidates = (
                (t.lowerings, op),
                (t.lowerings, op.overloadpacket),
                (t.decompositions, op),
                (t.decompositions, op.overloadpacket),
            )
            for table, key in candidates:
                if key in table:
                    return table[key]
            functional = functional_counterpart(op)
            return self.lowering_for(functional) if functional is not None else None
        if isinstance(op, torch._ops.OpOverloadPacket):
            return t.lowerings.get(op) or t.decompositions.get(op)
        return t.functions.get(op)

    def plugin_fallback_for(self, op: Any) -> Callable | None:
        """What a plugin's ``torchlax_fallback`` hook runs for ``op``, or ``None``.

        PyTorch's own kernels (the built-in ``torchlax.fallback``, when
        ``Config.fallback_to_torch`` is on) are not asked: this is for ops a plugin implements
        by name (torchvision's, Dynamo's ``prims::fma``), which a compiled program can trace.
        """
        return self._host.fallback_for(op, self, skip=frozenset({"torchlax.fallback"}))

    def stats(self) -> dict[str, Any]:
        """Counters of this environment: the eager op cache and XLA compilations.

        ``op_cache_hits``/``op_cache_misses`` (eager ops served by / looked up and not found in
        the cache), ``op_cache_size`` (executables held), ``op_cache_uncacheable`` (ops with a
        signature that is never compiled, with why: the other signatures are), ``compilations`` and ``compile_seconds`` (every XLA compilation
        torchlax reported: eager ops and compiled programs) and ``slowest_compile``.
        """
        s, cache = self._stats, self._op_cache
        return {
            "op_cache_hits": s.hits,
            "op_cache_misses": s.misses,
            "op_cache_size": len(cache.entries),
            "op_cache_capacity": cache.capacity(),
            "op_cache_uncacheable": {op_name(f): why for f, why in cache.uncacheable.items()},
            "compilations": s.compilations,
            "compile_seconds": s.compile_seconds,
            "slowest_compile": s.slowest,
        }

    def lowering_counts(self) -> dict[str, dict[str, int]]:
        """How many lowerings, decompositions and function overrides each plugin provides."""
        return self._tables.counts_by_plugin()

    # -- dispatch -----------------------------------------------------------------------------

    def dispatch(self, func, args: tuple, kwargs: dict):
        """Run ATen op ``func`` on torchlax Tensors here (``_run.run_op``), raising its errors."""
        return run_op(self, func, args, kwargs, from_dispatcher=False)

    def call_function(self, func, types, args, kwargs):
        if self._tables.functions:
            entry = self._tables.functions.get(func)
            if entry is not None and not _records_autograd(args, kwargs):
                return entry.fn(*args, **kwargs)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    def _resolve(self, func) -> Callable:
        impl = self._implementation_for(func)
        if impl is None:
            raise self._not_lowered(func)
        impl = overlap_checked(func, impl)  # a write into an expand()ed view, as PyTorch
        self._resolved[func] = impl
        return impl

    def _implementation_for(self, func) -> Callable | None:
        t = self._tables
        packet = getattr(func, "overloadpacket", None)
        entry = t.lowerings.get(func) or (packet is not None and t.lowerings.get(packet)) or None
        if entry is not None:
            return lowering_impl(func, self._checked(func, entry), self._op_cache)
        entry = (
            t.decompositions.get(func)
            or (packet is not None and t.decompositions.get(packet))
            or None
        )
        if entry is not None:
            fn = self._checked(func, entry)
            return lambda args, kwargs: fn(*args, **kwargs)
        view_op = inplace_view_counterpart(func)  # squeeze_, transpose_, as_strided_
        if view_op is not None:
            view = t.lowerings.get(view_op) or t.lowerings.get(view_op.overloadpacket)
            if view is not None:
                return inplace_view_impl(func, view_op, view.fn)
        functional = functional_counterpart(func)
        if functional is not None:
            inner = self._implementation_for(functional)
            if inner is not None:
                return derived_mutation_impl(func, functional, inner)
        if isinstance(
            func, torch._ops.OpOverload
        ) and torch._C._dispatch_has_kernel_for_dispatch_key(
            func.name(), "CompositeImplicitAutograd"
        ):
            # Reached below autograd (from inside a decomposition): run PyTorch's own composite.
            return lambda args, kwargs: func.decompose(*args, **kwargs)
        fallback = self._host.fallback_for(func, self)
        if fallback is not None:
            return lambda args, kwargs: fallback(*args, **kwargs)
        return None

    def _checked(self, func, entry: Lowering) -> Callable:
        """``entry.fn``, checked against ``func``'s meta kernel if a third party wrote it.

        torchlax's own lowerings are tested against PyTorch and run unwrapped (the hot path
        pays nothing); another plugin's outputs are checked once per input signature.
        """
        if self._host.is_first_party(entry.plugin):
            return entry.fn
        return _plugin_checks.checked(func, entry)

    def _not_lowered(self, func) -> OpNotLoweredError:
        name = op_name(func)
        schema = getattr(func, "_schema", None)
        asked = ", ".join(self._host.loaded_plugin_names()) or "none"
        lines = [f"torchlax has no JAX lowering for {name}."]
        if schema is not None:
            lines.append(f"  schema: {schema}")
        lines.append(f"  plugins asked: {asked}")
        if importlib.util.find_spec("torchlax_ops") is None:
            lines.append(
                "The built-in lowerings live in the package torchlax-ops, which is not installed: "
                "run `pip install torchlax-ops` (or install the umbrella package `torchlax`)."
            )
        elif "ops" not in self._host.loaded_plugin_names():
            lines.append(
                "The built-in lowerings (plugin 'ops' of torchlax-ops) are not loaded: check "
                "TORCHLAX_DISABLE_PLUGIN_AUTOLOAD and TORCHLAX_BLOCK_PLUGINS."
            )
        target = f"torch.ops.{name}" if isinstance(func, torch._ops.OpOverload) else name
        lines += [
            "To lower it yourself, register a plugin:",
            "",
            "    @torchlax_core.hookimpl",
            "    def torchlax_register_lowerings(registry):",
            f"        registry.register_lowering({target}, my_jax_function)",
            "",
            "    torchlax.default_env().register_plugin(sys.modules[__name__])",
            "",
            "or run unlowered ops with PyTorch on the CPU: "
            "torchlax.default_env().config.fallback_to_torch = True. "
            "torchlax.explain(fn, *example_args) lists every op a program lacks at once.",
        ]
        return OpNotLoweredError("\n".join(lines), op=func)

    # -- devices ------------------------------------------------------------------------------

    def placement(self, device: torch.device | str | None):
        """Where data for torch ``device`` goes: a ``jax.Device`` or ``jax.sharding.Sharding``."""
        if isinstance(device, str):
            device = torch.device(device)
        try:
            return self._placements[device]
        except KeyError:
            pass
        target = self._host.pm.hook.torchlax_device_placement(device=device, env=self)
        if target is None:
            raise ValueError(
                f"No torchlax plugin can place data on device {device}. Use device='jax' (or "
                "'jax:N'), or register a torchlax_device_placement hook for it."
            )
        self._placements[device] = target
        return target

    def clear_placement_cache(self) -> None:
        """Forget cached placements; call it after changing what a placement hook answers."""
        self._placements.clear()

    def place(self, array: jax.Array, device) -> jax.Array:
        target = self.placement(device)
        if isinstance(array, jax.core.Tracer):
            return array
        if isinstance(target, jax.Device):
            if array.devices() == {target}:
                return array
        return jax.device_put(array, target)

    # -- randomness ---------------------------------------------------------------------------

    def next_prng_key(self, generator: torch.Generator | None = None) -> jax.Array:
        """A fresh JAX PRNG key for one random op.

        Eagerly the key's seed is drawn from ``generator`` (default: torch's global CPU
        generator), so ``torch.manual_seed`` and ``torch.Generator`` arguments work as in
        PyTorch. Inside ``prng_key_scope`` (used by ``torchlax.jit``) keys are split from the
        key passed into the traced program, so randomness is an input, never a constant.
        """
        if self._key_stack:
            return self._key_stack[-1].split()
        if _program.staging():
            raise RuntimeError(
                "A random op ran while JAX traces a program, outside any key scope: its key "
                "would be a constant of the compiled program, giving the same numbers on every "
                "call. Compile PyTorch code with torchlax.jit or torch.compile(backend="
                "'torchlax') (they pass a fresh key per call), or, under your own jax.jit, pass "
                "a key in and wrap the call in `with torchlax.current_env().prng_key_scope(key):`."
            )
        seed = _next_seed(generator)
        with x64():
            if _program.default_prng_is_threefry():
                return _program.threefry_key(seed)
            return jax.random.key(seed)

    def next_prng_key_data(self, generator: torch.Generator | None = None) -> Any:
        """``jax.random.key_data(self.next_prng_key(generator))``: the raw data of a fresh key,
        for a program whose key input is key data. Eagerly, with JAX's default threefry
        implementation, it is made on the host from the same seed (a numpy array: no JAX
        dispatch per call), with the very bits ``next_prng_key`` would give."""
        if self._key_stack or _program.staging() or not _program.default_prng_is_threefry():
            with x64():
                return jax.random.key_data(self.next_prng_key(generator))
        seed = _next_seed(generator)
        return _program.threefry_key_data(seed)

    @contextlib.contextmanager
    def prng_key_scope(self, key: jax.Array) -> Iterator[_program.KeyScope]:
        """Draw random keys from ``key`` (for example a traced jit argument) inside the block.

        Yields a ``KeyScope`` whose ``drawn`` tells afterwards whether any op drew a key.
        """
        scope = _program.KeyScope(key)
        scopes = _current_scopes()
        with _scoped(_Scopes(scopes.envs, (*scopes.keys, (self, scope)))):
            yield scope

    @property
    def _key_stack(self) -> tuple[_program.KeyScope, ...]:
        """The key scopes of this environment open in the current thread, innermost last."""
        return tuple(scope for env, scope in _current_scopes().keys if env is self)

    def warn_once(self, key: Any, message: str, category=UserWarning) -> None:
        if key not in self._warned:
            self._warned.add(key)
            import warnings

            warnings.warn(message, category, stacklevel=4)


def _records_autograd(args, kwargs) -> bool:
    if not torch.is_grad_enabled():
        return False
    flat, _ = torch.utils._pytree.tree_flatten((args, kwargs))
    return any(isinstance(x, torch.Tensor) and x.requires_grad for x in flat)


_kernels_lock = threading.RLock()  # table rebuilds register torch kernels, process-wide


def _next_seed(generator: torch.Generator | None) -> int:
    """A seed for a fresh JAX key, drawn from ``generator`` (torch's default one if None), so
    keys repeat under ``torch.manual_seed``."""
    gen = generator if generator is not None else torch.default_generator
    return int(torch.randint(0, 2**62, (), generator=gen, device=gen.device))
