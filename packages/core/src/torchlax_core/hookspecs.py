"""The torchlax hook specifications: everything a plugin can provide.

torchlax is assembled from plugins managed by pluggy_. Each plugin is a module or object with
functions named after the hooks below and marked with ``@torchlax_core.hookimpl``. Plugins are
found through the ``torchlax`` entry-point group::

    # pyproject.toml of a third-party package
    [project.entry-points.torchlax]
    my_plugin = "my_package.torchlax_plugin"

and can also be registered at run time with ``torchlax.default_env().register_plugin(obj)``.
The built-in lowerings (package ``torchlax-ops``) register through the very same entry point.

Hooks are called once, when an environment builds its tables (and again whenever a plugin is
registered or unregistered). The eager hot path never calls a hook: it looks the op up in the
tables the hooks filled.

Environment variables:

``TORCHLAX_DISABLE_PLUGIN_AUTOLOAD=1``
    Load no entry-point plugins (only the built-in ones of ``torchlax-core``).
``TORCHLAX_BLOCK_PLUGINS=name1,name2``
    Never load the named plugins (entry-point names, or built-in plugin names such as
    ``torchlax.device``).
``TORCHLAX_STRICT_PLUGINS=1``
    Raise if a plugin fails to import or register, instead of reporting it and going on.

.. _pluggy: https://pluggy.readthedocs.io
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from ._environment import Config, Environment
    from ._registry import Registration

PROJECT_NAME = "torchlax"
ENTRY_POINT_GROUP = "torchlax"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def torchlax_register_lowerings(registry: Registration) -> None:
    """Register lowerings, decompositions and torch-level overrides: the one registration hook.

    Call, as often as needed:

    - ``registry.register_lowering(op, fn, override=False)`` where ``op`` is an ATen
      ``OpOverload`` (``torch.ops.aten.add.Tensor``) or a whole ``OpOverloadPacket``
      (``torch.ops.aten.add``, every overload). ``fn`` receives the op's arguments as the
      schema orders them, with every tensor replaced by its ``jax.Array``, and returns
      ``jax.Array`` values in the schema's output structure. Lower the functional overload
      only: in-place (``add_``) and ``out=`` variants and view aliasing are derived by the core.
    - ``registry.register_decomposition(op, fn, override=False)``: a torch-level function (for
      example from ``torch._decomp``) that implements ``op`` in terms of other ATen ops; it runs
      on torchlax Tensors, so each op it calls is dispatched again. A lowering of the same op
      wins over a decomposition.
    - ``registry.register_function(torch_fn, fn, override=False)`` to replace a torch-level
      function (``torch.nn.functional.scaled_dot_product_attention``) when called on torchlax
      Tensors. ``fn`` receives and returns torch-level values (torchlax Tensors). It is skipped
      while autograd records the call, so an override can never cost autograd.

    Registering an op another plugin already owns raises ``PluginConflictError`` naming both,
    unless ``override=True``. Plugins register in load order: built-ins, then entry points
    sorted by name, then plugins registered at run time; with ``override=True`` the later wins.
    An override replaces the computation but keeps the input contract the replaced function
    declares (its ``torchlax_contract`` attribute: torchlax-ops' lowerings raise as PyTorch
    does for the dtypes PyTorch's CPU kernels reject, such as ``softmax`` of integers).
    """


_DECOMPOSITIONS_HOOK_DEPRECATED = DeprecationWarning(
    "The torchlax hook torchlax_register_decompositions is deprecated and will be removed in "
    "torchlax 0.3: call registry.register_decomposition(op, fn) from your "
    "torchlax_register_lowerings hook instead (it receives the same registry)."
)


@hookspec(warn_on_impl=_DECOMPOSITIONS_HOOK_DEPRECATED)
def torchlax_register_decompositions(registry: Registration) -> None:
    """Deprecated: register decompositions from ``torchlax_register_lowerings`` instead.

    Still called after every ``torchlax_register_lowerings`` hook, with the same kind of
    ``registry``; implementing it warns (``DeprecationWarning``) when the plugin is registered.
    """


@hookspec(firstresult=True)
def torchlax_fallback(op: Any, env: Environment) -> Any:
    """Provide an implementation for an op nobody lowered, or ``None`` to decline.

    Called once per op, the first time the op reaches the environment without a lowering or
    decomposition. Return a callable ``impl(*args, **kwargs)`` taking and returning torch-level
    values (torchlax Tensors); it is cached for the op. The first non-``None`` answer wins.
    The built-in implementation (plugin ``torchlax.fallback``) runs the op with PyTorch on the
    CPU when ``Config.fallback_to_torch`` is on.
    """


@hookspec(firstresult=True)
def torchlax_device_placement(device: Any, env: Environment) -> Any:
    """Map a torch device request to where JAX should put the data.

    ``device`` is a ``torch.device`` (``jax``, ``jax:1``, ``cuda``, ``cpu``, ...) or ``None``
    (no device named: the default). Return a ``jax.Device`` or a ``jax.sharding.Sharding``, or
    ``None`` to let the next plugin answer. The built-in plugin ``torchlax.device`` maps
    ``jax:i`` to ``jax.local_devices()[i]`` and ``None``/``jax`` to the default device. Answers are
    cached per device; registering or unregistering a plugin clears the cache.
    """


@hookspec(historic=True)
def torchlax_configure(config: Config) -> None:
    """Adjust an environment's configuration when it is created.

    Historic: a plugin registered later is still called for environments created earlier.
    """
