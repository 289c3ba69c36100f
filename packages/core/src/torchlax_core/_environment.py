"""The environment: configuration, lowering tables, PRNG state and device placement.

``Environment.dispatch`` is the eager hot path: one dict lookup for the op's resolved
implementation, then the call. Everything else (asking plugins, deriving in-place, ``out=``
and view behaviour from the functional lowering) happens once per op in ``_resolve``.
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
import torch

from . import _privateuse1, _tensor
from ._dispatch import (
    derived_mutation_impl,
    functional_counterpart,
    inplace_view_counterpart,
    inplace_view_impl,
    lowering_impl,
)
from ._errors import OpNotLoweredError
from ._registry import Lowering, PluginHost, PluginRecord, Tables, op_name

_x64 = jax.enable_x64


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


class Environment:
    """Configuration, lowering tables, PRNG state and device placement for torchlax.

    Most programs use the one ``torchlax.default_env()`` returns. A separate environment
    (``Environment(autoload=False)``) is useful in tests of the registry.
    """

    def __init__(self, config: Config | None = None, *, autoload: bool | None = None,
                 strict_plugins: bool | None = None):
        self.config = config or Config()
        self._host = PluginHost(autoload=autoload, strict=strict_plugins)
        from . import _builtins

        for name, plugin in _builtins.BUILTIN_PLUGINS.items():
            self._host.register(plugin, name, distribution="torchlax-core")
        self._host.load_entry_points()
        self._host.pm.hook.torchlax_configure.call_historic(kwargs={"config": self.config})
        self._tables: Tables = Tables()
        self._resolved: dict[Any, Callable] = {}
        self._placements: dict[Any, Any] = {}
        self._key_stack: list[jax.Array] = []
        self._warned: set[Any] = set()
        self._rebuild()

    # -- plugins ------------------------------------------------------------------------------

    @property
    def plugin_manager(self):
        """The underlying ``pluggy.PluginManager``."""
        return self._host.pm

    def register_plugin(self, plugin: Any, name: str | None = None) -> str | None:
        """Register a plugin object or module now; its registrations take effect at once.

        Returns the plugin's name, or ``None`` if it is blocked or failed (and was reported).
        """
        registered = self._host.register(plugin, name)
        self._rebuild()
        return registered

    def unregister_plugin(self, plugin_or_name: Any) -> None:
        """Remove a plugin; ops it lowered go back to their previous owner (or to none)."""
        self._host.unregister(plugin_or_name)
        self._rebuild()

    def plugins(self) -> list[PluginRecord]:
        """Every plugin this environment knows of: loaded, blocked or failed."""
        return list(self._host.records.values())

    def _rebuild(self) -> None:
        self._tables = self._host.build_tables()
        self._resolved = {}
        self._placements = {}
        _tensor.set_function_overrides(self, self._tables.functions)
        _privateuse1.register_factory_kernels(self._tables)
        _privateuse1.register_composite_overrides(self._tables)

    # -- introspection ------------------------------------------------------------------------

    def lowering_for(self, op: Any) -> Lowering | None:
        """The table entry that will handle ``op``, with the name of the plugin that owns it.

        ``op`` is an ATen ``OpOverload``/``OpOverloadPacket`` or a torch-level function. Returns
        ``None`` when nothing lowers it (the fallback, if on, would then run it).
        """
        t = self._tables
        if isinstance(op, torch._ops.OpOverload):
            candidates = (t.lowerings, op), (t.lowerings, op.overloadpacket), (
                t.decompositions, op), (t.decompositions, op.overloadpacket)
            for table, key in candidates:
                if key in table:
                    return table[key]
            functional = functional_counterpart(op)
            return self.lowering_for(functional) if functional is not None else None
        if isinstance(op, torch._ops.OpOverloadPacket):
            return t.lowerings.get(op) or t.decompositions.get(op)
        return t.functions.get(op)

    def lowering_counts(self) -> dict[str, dict[str, int]]:
        """How many lowerings, decompositions and function overrides each plugin provides."""
        return self._tables.counts_by_plugin()

    # -- dispatch -----------------------------------------------------------------------------

    def dispatch(self, func, args: tuple, kwargs: dict):
        impl = self._resolved.get(func)
        if impl is None:
            impl = self._resolve(func)
        return impl(args, kwargs)

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
        self._resolved[func] = impl
        return impl

    def _implementation_for(self, func) -> Callable | None:
        t = self._tables
        packet = getattr(func, "overloadpacket", None)
        entry = t.lowerings.get(func) or (packet is not None and t.lowerings.get(packet)) or None
        if entry is not None:
            return lowering_impl(func, entry.fn)
        entry = t.decompositions.get(func) or (packet is not None and t.decompositions.get(packet)) or None
        if entry is not None:
            fn = entry.fn
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
        if isinstance(func, torch._ops.OpOverload) and torch._C._dispatch_has_kernel_for_dispatch_key(
                func.name(), "CompositeImplicitAutograd"):
            # Reached below autograd (from inside a decomposition): run PyTorch's own composite.
            return lambda args, kwargs: func.decompose(*args, **kwargs)
        fallback = self._host.pm.hook.torchlax_fallback(op=func, env=self)
        if fallback is not None:
            return lambda args, kwargs: fallback(*args, **kwargs)
        return None

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
            key, sub = jax.random.split(self._key_stack[-1])
            self._key_stack[-1] = key
            return sub
        gen = generator if generator is not None else torch.default_generator
        seed = int(torch.randint(0, 2**62, (), generator=gen, device=gen.device))
        with _x64(True):
            return jax.random.key(seed)

    @contextlib.contextmanager
    def prng_key_scope(self, key: jax.Array) -> Iterator[None]:
        """Draw random keys from ``key`` (for example a traced jit argument) inside the block."""
        self._key_stack.append(key)
        try:
            yield
        finally:
            self._key_stack.pop()

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


# -- the current environment --------------------------------------------------------------------

_lock = threading.Lock()
_default: Environment | None = None
_stack: list[Environment] = []
_globally_enabled = False
_x64_before_global: bool | None = None


def default_env() -> Environment:
    """The process-wide environment, created (and its plugins loaded) on first use."""
    global _default
    if _default is None:
        with _lock:
            if _default is None:
                _default = Environment()
    return _default


def current_env() -> Environment:
    """The innermost ``torchlax.enable(env)`` environment, else the default one."""
    return _stack[-1] if _stack else (_default or default_env())


_tensor._current_env = current_env  # Tensor.__torch_dispatch__ calls it on every op


def is_enabled() -> bool:
    """Whether ``device="jax"`` tensors may be created here (inside ``enable`` or globally)."""
    return _globally_enabled or bool(_stack)


@contextlib.contextmanager
def enable(env: Environment | None = None) -> Iterator[Environment]:
    """Scope torchlax: inside, ``device="jax"`` creates torchlax Tensors.

    ``torch.randn(2, 3, device="jax")``, ``tensor.to("jax")`` and ``module.to("jax")`` then
    work; CPU code keeps running on the CPU. JAX's 64-bit mode is on within the block, so
    plain JAX code there sees int64/float64 as torch does; outside it JAX is unaffected.
    """
    env = env or default_env()
    _stack.append(env)
    swap_before = torch.__future__.get_swap_module_params_on_conversion()
    # module.to("jax") then swaps each parameter's contents in place (as for CUDA, where it
    # sets .data): the Parameter objects stay, so tied weights stay tied.
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        with _x64(True):
            yield env
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swap_before)
        _stack.pop()


def enable_globally(env: Environment | None = None) -> Environment:
    """Enable torchlax for the rest of the process (undo with ``disable_globally``).

    Also turns on JAX's 64-bit mode process-wide, so that plain JAX code handed torchlax's
    int64/float64 arrays keeps their dtypes. Prefer the scoped ``enable()`` to leave plain JAX
    code outside it untouched.
    """
    global _globally_enabled, _default, _x64_before_global
    if env is not None:
        _default = env
    if not _globally_enabled:
        _x64_before_global = bool(jax.config.jax_enable_x64)
        jax.config.update("jax_enable_x64", True)
        torch.__future__.set_swap_module_params_on_conversion(True)  # see enable()
    _globally_enabled = True
    return default_env()


def disable_globally() -> None:
    """Undo ``enable_globally`` (and restore JAX's 64-bit setting)."""
    global _globally_enabled, _x64_before_global
    if _globally_enabled and _x64_before_global is not None:
        jax.config.update("jax_enable_x64", _x64_before_global)
        torch.__future__.set_swap_module_params_on_conversion(False)
    _globally_enabled = False
    _x64_before_global = None
