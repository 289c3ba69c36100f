"""Plugin loading and the lowering tables the hooks fill.

An environment owns one pluggy ``PluginManager``. ``build_tables`` calls each plugin's
registration hooks once, in load order, and returns plain dicts; dispatch only reads them.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import traceback
import warnings
from collections.abc import Callable
from typing import Any

import pluggy
import torch

from . import hookspecs
from ._errors import PluginConflictError, PluginError
from ._logging import get_logger

_log = get_logger("plugins")

# Distributions whose entry-point plugins load before any third party's, so that a third
# party's ``override=True`` lands after the built-in lowering it replaces.
_FIRST_PARTY = frozenset(
    {
        "torchlax-core",
        "torchlax-ops",
        "torchlax-interop",
        "torchlax-dynamo",
        "torchlax-export",
        "torchlax",
    }
)


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def blocked_plugin_names() -> set[str]:
    value = os.environ.get("TORCHLAX_BLOCK_PLUGINS", "")
    return {name.strip() for name in value.split(",") if name.strip()}


def op_name(op: Any) -> str:
    """The name a user sees: ``aten.add.Tensor``, ``aten.add`` or ``torch.nn.functional.gelu``."""
    if isinstance(op, torch._ops.OpOverload | torch._ops.OpOverloadPacket):
        return str(op)
    module = getattr(op, "__module__", None) or ""
    qualname = getattr(op, "__qualname__", None) or getattr(op, "__name__", repr(op))
    if module.startswith("torch._C"):
        module = "torch"
    return f"{module}.{qualname}" if module else qualname


@dataclasses.dataclass(frozen=True)
class PluginRecord:
    """What ``doctor`` and error messages say about one plugin."""

    name: str
    status: str  # "loaded", "blocked", "failed"
    distribution: str | None = None
    version: str | None = None
    error: str | None = None  # the traceback, for a failed plugin


@dataclasses.dataclass(frozen=True)
class Lowering:
    """One table entry: who registered ``fn`` for ``op``, and what kind of function it is.

    ``kind`` is ``"lowering"`` (takes and returns jax.Arrays), ``"decomposition"`` (takes and
    returns torch-level tensors) or ``"function"`` (a torch-level function override).
    """

    op: Any
    fn: Callable
    plugin: str
    kind: str


@dataclasses.dataclass
class Tables:
    lowerings: dict[Any, Lowering] = dataclasses.field(default_factory=dict)
    decompositions: dict[Any, Lowering] = dataclasses.field(default_factory=dict)
    functions: dict[Any, Lowering] = dataclasses.field(default_factory=dict)

    def table(self, kind: str) -> dict[Any, Lowering]:
        return {
            "lowering": self.lowerings,
            "decomposition": self.decompositions,
            "function": self.functions,
        }[kind]

    def counts_by_plugin(self) -> dict[str, dict[str, int]]:
        counts: dict[str, dict[str, int]] = {}
        for kind in ("lowering", "decomposition", "function"):
            for entry in self.table(kind).values():
                per = counts.setdefault(entry.plugin, {})
                per[kind] = per.get(kind, 0) + 1
        return counts


class Registration:
    """The object a plugin's registration hook receives (named ``registry`` in the hookspecs).

    Entries are staged and applied only when the plugin's hook returns, so a plugin that
    raises halfway leaves nothing behind.
    """

    def __init__(self, plugin: str):
        self.plugin = plugin
        self._staged: list[tuple[str, Any, Callable, bool]] = []

    def register_lowering(self, op: Any, fn: Callable, *, override: bool = False) -> None:
        """Lower ATen ``op`` (an ``OpOverload`` or a whole ``OpOverloadPacket``) with ``fn``."""
        self._stage("lowering", op, fn, override)

    def register_decomposition(self, op: Any, fn: Callable, *, override: bool = False) -> None:
        """Implement ATen ``op`` with a torch-level function of other ops."""
        self._stage("decomposition", op, fn, override)

    def register_function(
        self, torch_fn: Callable, fn: Callable, *, override: bool = False
    ) -> None:
        """Replace torch-level ``torch_fn`` (e.g. ``F.gelu``) on torchlax Tensors."""
        self._stage("function", torch_fn, fn, override)

    def lowering(self, *ops: Any, override: bool = False):
        """Decorator form of ``register_lowering`` for one or more ops."""

        def decorate(fn):
            for op in ops:
                self.register_lowering(op, fn, override=override)
            return fn

        return decorate

    def _stage(self, kind: str, op: Any, fn: Callable, override: bool) -> None:
        if kind != "function" and not isinstance(
            op, torch._ops.OpOverload | torch._ops.OpOverloadPacket
        ):
            raise TypeError(
                f"Plugin {self.plugin!r} passed {op!r} to register_{kind}; it takes an ATen op "
                "such as torch.ops.aten.add.Tensor (one overload) or torch.ops.aten.add (all). "
                "Use register_function for a torch-level function."
            )
        if not callable(fn):
            raise TypeError(
                f"Plugin {self.plugin!r} registered {fn!r} for {op_name(op)}; it must be callable."
            )
        self._staged.append((kind, op, fn, override))

    def apply(self, tables: Tables) -> None:
        # Every entry is checked before any is written: a conflict leaves the tables untouched.
        for kind, op, _fn, override in self._staged:
            current = tables.table(kind).get(op)
            if current is not None and not override and current.plugin != self.plugin:
                raise PluginConflictError(
                    f"Plugins {current.plugin!r} and {self.plugin!r} both register a {kind} for "
                    f"{op_name(op)}. Pass override=True in {self.plugin!r} to replace the one "
                    f"from {current.plugin!r}, or block one of them with "
                    f"TORCHLAX_BLOCK_PLUGINS={self.plugin}.",
                    plugins=(current.plugin, self.plugin),
                )
        for kind, op, fn, _override in self._staged:
            current = tables.table(kind).get(op)
            contract = getattr(current.fn, "torchlax_contract", None) if current else None
            if contract is not None and current is not None and current.plugin != self.plugin:
                # An override replaces the computation, not PyTorch's input contract (the
                # dtypes its CPU kernels reject, declared by torchlax-ops' lowerings).
                fn = contract(fn)
            tables.table(kind)[op] = Lowering(op=op, fn=fn, plugin=self.plugin, kind=kind)


def _checked_fallback(answer: Any, who: str, op: Any) -> Callable:
    if not callable(answer):
        raise PluginError(
            f"The torchlax_fallback hook of {who} answered {answer!r} for {op_name(op)}; it must "
            "return a callable impl(*args, **kwargs) (taking and returning torch-level values), "
            "or None to let the next plugin answer."
        )
    return answer


def _distribution_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


class PluginHost:
    """The pluggy manager plus the bookkeeping ``doctor`` shows."""

    def __init__(self, *, autoload: bool | None = None, strict: bool | None = None):
        self.pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        self.autoload = (
            (not _env_flag("TORCHLAX_DISABLE_PLUGIN_AUTOLOAD")) if autoload is None else autoload
        )
        self.strict = _env_flag("TORCHLAX_STRICT_PLUGINS") if strict is None else strict
        self.records: dict[str, PluginRecord] = {}
        self._entry_points_loaded = False
        for name in blocked_plugin_names():
            self.pm.set_blocked(name)

    # -- loading ------------------------------------------------------------------------------

    def register(
        self,
        plugin: Any,
        name: str | None = None,
        *,
        distribution=None,
        version=None,
        explicit: bool = False,
    ) -> str | None:
        """Add ``plugin`` to the manager (its tables are built by the next ``build_tables``).

        ``explicit`` (``Environment.register_plugin``): a plugin that fails raises
        ``PluginError`` and leaves nothing behind. Otherwise (entry points) it is reported
        and skipped, or raises in strict mode.
        """
        name = name or self.pm.get_canonical_name(plugin)
        if distribution is not None and version is None:
            version = _distribution_version(distribution)
        if self.pm.is_blocked(name):
            self.records[name] = PluginRecord(name, "blocked", distribution, version)
            _log.info("plugin %r blocked (TORCHLAX_BLOCK_PLUGINS)", name)
            return None
        if self.pm.has_plugin(name) or self.pm.is_registered(plugin):
            exc = PluginError(
                f"torchlax plugin {name!r} is already registered (as "
                f"{self.pm.get_name(plugin) or name!r}); unregister it first, or register it "
                "under another name."
            )
            return self._fail(name, exc, distribution, version, explicit)
        try:
            # pluggy checks every hookimpl's arguments against its hookspec before it changes
            # anything, so a rejected plugin leaves the manager as it was.
            self.pm.register(plugin, name)
        except pluggy.PluginValidationError as exc:
            return self._fail(name, exc, distribution, version, explicit)
        except Exception as exc:  # e.g. a torchlax_configure hook (historic: runs now) raised
            if self.pm.is_registered(plugin):
                self.pm.unregister(plugin)
            return self._fail(name, exc, distribution, version, explicit)
        try:
            self.pm.check_pending()  # a hook name no hookspec has (a misspelt hook)
        except pluggy.PluginValidationError as exc:
            self.pm.unregister(plugin)
            return self._fail(name, exc, distribution, version, explicit)
        self.records[name] = PluginRecord(name, "loaded", distribution, version)
        _log.info(
            "plugin %r loaded%s",
            name,
            f" from {distribution} {version or ''}".rstrip() if distribution else "",
        )
        return name

    def unregister(self, plugin_or_name: Any) -> None:
        if isinstance(plugin_or_name, str):
            plugin = self.pm.get_plugin(plugin_or_name)
            name = plugin_or_name
        else:
            plugin = plugin_or_name
            name = self.pm.get_name(plugin)
        if plugin is None or name is None:
            raise ValueError(f"No plugin {plugin_or_name!r} is registered.")
        self.pm.unregister(plugin)
        self.records.pop(name, None)

    def is_first_party(self, name: str) -> bool:
        """Whether plugin ``name`` comes from torchlax's own distributions (core's built-ins too)."""
        record = self.records.get(name)
        return record is not None and record.distribution in _FIRST_PARTY

    def load_entry_points(self) -> None:
        if self._entry_points_loaded:
            return
        self._entry_points_loaded = True
        if not self.autoload:
            return
        eps = importlib.metadata.entry_points(group=hookspecs.ENTRY_POINT_GROUP)

        def order(ep):
            dist = ep.dist.name if ep.dist is not None else ""
            return (dist not in _FIRST_PARTY, ep.name)

        for ep in sorted(eps, key=order):
            dist = ep.dist.name if ep.dist is not None else None
            version = ep.dist.version if ep.dist is not None else None
            if self.pm.is_blocked(ep.name):
                self.records[ep.name] = PluginRecord(ep.name, "blocked", dist, version)
                _log.info(
                    "plugin %r (entry point of %s) blocked (TORCHLAX_BLOCK_PLUGINS)", ep.name, dist
                )
                continue
            if self.pm.get_plugin(ep.name) is not None:
                continue
            try:
                plugin = ep.load()
            except Exception as exc:  # a broken plugin must not break torchlax
                self._report_failure(ep.name, exc, dist, version)
                continue
            self.register(plugin, ep.name, distribution=dist, version=version)

    def _fail(self, name: str, exc: BaseException, distribution, version, explicit: bool) -> None:
        if explicit:
            if isinstance(exc, PluginError):
                raise exc
            raise PluginError(
                f"torchlax plugin {name!r} could not be registered ({type(exc).__name__}): "
                f"{exc}\nNothing of it was registered; fix the plugin and register it again."
            ) from exc
        self._report_failure(name, exc, distribution, version)
        return None

    def _report_failure(
        self, name: str, exc: BaseException, distribution=None, version=None
    ) -> None:
        tb = "".join(traceback.format_exception(exc))
        self.records[name] = PluginRecord(name, "failed", distribution, version, tb)
        _log.error(
            "torchlax plugin %r failed and was skipped: %s: %s", name, type(exc).__name__, exc
        )
        if self.strict:
            raise PluginError(f"torchlax plugin {name!r} failed to load:\n{tb}") from exc
        warnings.warn(
            f"torchlax plugin {name!r} failed and was skipped (set TORCHLAX_STRICT_PLUGINS=1 to "
            f"make this an error):\n{tb}",
            RuntimeWarning,
            stacklevel=3,
        )

    # -- tables -------------------------------------------------------------------------------

    def build_tables(self, new_plugin: str | None = None) -> Tables:
        """Call every registration hook in load order and collect the tables.

        A plugin whose hook raises or that claims an op another plugin owns (without
        ``override=True``) is dropped: ``new_plugin`` (being registered explicitly) raises
        ``PluginError``; another is reported and skipped (strict mode: raises), and the tables
        are built again without it.
        """
        tables = Tables()
        hooks = self.pm.hook
        for hook_name in ("torchlax_register_lowerings", "torchlax_register_decompositions"):
            # get_hookimpls() is in load order; calling each one ourselves tells us its owner.
            for impl in getattr(hooks, hook_name).get_hookimpls():
                registration = Registration(impl.plugin_name)
                try:
                    impl.function(registry=registration)
                    registration.apply(tables)
                except Exception as exc:
                    culprit = impl.plugin_name
                    if isinstance(exc, PluginConflictError) and new_plugin in exc.plugins:
                        culprit = new_plugin  # the newcomer loses, whichever hook ran first
                    if culprit == new_plugin:
                        if isinstance(exc, PluginError):
                            raise
                        raise PluginError(
                            f"torchlax plugin {culprit!r} failed in {hook_name} "
                            f"({type(exc).__name__}: {exc}); nothing of it was registered."
                        ) from exc
                    self.pm.unregister(name=culprit)
                    known = self.records.get(culprit)
                    self._report_failure(
                        culprit,
                        exc,
                        known.distribution if known else None,
                        known.version if known else None,
                    )
                    return self.build_tables(new_plugin)
        _log.debug("lowering tables built: %s", tables.counts_by_plugin())
        return tables

    def fallback_for(
        self, op: Any, env: Any, *, skip: frozenset[str] = frozenset()
    ) -> Callable | None:
        """The first ``torchlax_fallback`` answer for ``op``, checked to be callable.

        ``skip`` names plugins not to ask (``"torchlax.fallback"``: PyTorch's own kernels).
        """
        hook = self.pm.hook.torchlax_fallback
        impls = hook.get_hookimpls()
        if not skip and any(impl.hookwrapper or impl.wrapper for impl in impls):
            return _checked_fallback(hook(op=op, env=env), "a torchlax_fallback hook", op)
        values = {"op": op, "env": env}
        for impl in reversed(impls):  # pluggy's call order: last registered first
            if impl.plugin_name in skip or impl.hookwrapper or impl.wrapper:
                continue
            answer = impl.function(**{arg: values[arg] for arg in impl.argnames})
            if answer is not None:
                return _checked_fallback(answer, f"plugin {impl.plugin_name!r}", op)
        return None

    def loaded_plugin_names(self) -> list[str]:
        # Blocked names sit in pluggy's table with no plugin object.
        return [name for name, plugin in self.pm.list_name_plugin() if plugin is not None]
