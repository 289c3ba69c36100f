"""Build a module on ``meta``, then create its weights directly sharded on a mesh.

``materialize`` traces each weight's initialisation (the owning module's ``reset_parameters``
or a given initializer, on torchlax Tensors) inside one ``jax.jit`` whose ``out_shardings`` are
the rules' shardings: XLA partitions the initialisation, so every device computes its own
shard and no device ever holds a whole sharded weight.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import torch
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from torchlax_core import Tensor, current_env, enable, jax_dtype
from torchlax_core.internal import array_of, x64

from ._rules import Rules, SpecFn, spec_for

Initializer = Callable[[str, torch.Tensor], None]

_RESET_METHODS = ("reset_parameters", "_reset_parameters")


def init_on_meta(builder: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """``builder()`` run under ``torch.device("meta")``: a module whose weights hold no data."""
    with torch.device("meta"):
        return builder()


def _entries(module: torch.nn.Module):
    """``(name, owner, leaf, kind, tensor)`` for each distinct parameter and buffer."""
    seen: dict[int, str] = {}
    entries, aliases = [], {}
    for kind, named in (
        ("parameter", module.named_parameters(remove_duplicate=False)),
        ("buffer", module.named_buffers(remove_duplicate=False)),
    ):
        for name, tensor in named:
            path, _, leaf = name.rpartition(".")
            owner = module.get_submodule(path) if path else module
            if id(tensor) in seen:
                aliases[name] = (seen[id(tensor)], owner, leaf, kind)
                continue
            seen[id(tensor)] = name
            entries.append((name, owner, leaf, kind, tensor))
    return entries, aliases


def _reset_method(owner: torch.nn.Module):
    for method in _RESET_METHODS:
        fn = getattr(owner, method, None)
        if callable(fn):
            return fn
    return None


def materialize(
    module: torch.nn.Module,
    mesh: Mesh,
    rules: Rules | SpecFn | PartitionSpec = (),
    init_fn: Initializer | None = None,
    *,
    seed: int | None = None,
) -> dict[str, PartitionSpec]:
    """Give every ``meta`` parameter and buffer of ``module`` sharded data, created in place.

    Each tensor is laid out as ``NamedSharding(mesh, spec)`` with ``spec`` from ``rules``
    (see ``shard``). Values come from ``init_fn(name, tensor)`` if given (it initialises the
    torchlax Tensor in place, e.g. ``lambda n, t: torch.nn.init.normal_(t, std=0.02)``), else
    from the owning submodule's ``reset_parameters`` (PyTorch's own initialisation). Random
    draws come from ``seed`` (default: drawn from torch's global generator, so
    ``torch.manual_seed`` makes it reproducible). Tensors already holding data are left alone.
    Returns the specs used, by name.
    """
    entries, aliases = _entries(module)
    todo = [e for e in entries if e[4].device.type == "meta"]
    specs = {name: spec_for(name, tuple(t.shape), mesh, rules) for name, _, _, _, t in todo}
    owners = {}
    if init_fn is None:
        for name, owner, _, _, _ in todo:
            if _reset_method(owner) is None:
                raise ValueError(
                    f"materialize() cannot initialise {name}: its module "
                    f"({type(owner).__name__}) has no reset_parameters(). Pass "
                    "init_fn=lambda name, tensor: ... to initialise such tensors."
                )
            owners.setdefault(id(owner), owner)
    env = current_env()

    def init(key):
        with enable(env), env.prng_key_scope(key), torch.no_grad():
            placeholders = {}
            for name, owner, leaf, kind, tensor in todo:
                t = Tensor(jnp.zeros(tuple(tensor.shape), jax_dtype(tensor.dtype)))
                placeholders[name] = t
                _assign(owner, leaf, kind, t, tensor.requires_grad)
            try:
                if init_fn is not None:
                    for name, t in placeholders.items():
                        init_fn(name, t)
                else:
                    for owner in owners.values():
                        _reset_method(owner)()  # pyright: ignore[reportOptionalCall]  (checked above: every owner has one)
                # reset_parameters may replace a tensor rather than write into it.
                return {
                    name: array_of(_current(owner, leaf, kind))
                    for name, owner, leaf, kind, _ in todo
                }
            finally:
                for _name, owner, leaf, kind, tensor in todo:
                    _assign(owner, leaf, kind, tensor, tensor.requires_grad)

    shardings = {name: NamedSharding(mesh, spec) for name, spec in specs.items()}
    if seed is None:
        seed = int(torch.randint(0, 2**62, (), generator=torch.default_generator))
    with x64():
        key = jax.random.key(seed)
        arrays = jax.jit(init, out_shardings=shardings)(key)
    for name, owner, leaf, kind, tensor in todo:
        _assign(owner, leaf, kind, Tensor(arrays[name]), tensor.requires_grad)
    for target, owner, leaf, kind in aliases.values():
        source_path, _, source_leaf = target.rpartition(".")
        source = module.get_submodule(source_path) if source_path else module
        shared = (source._parameters if kind == "parameter" else source._buffers)[source_leaf]
        (owner._parameters if kind == "parameter" else owner._buffers)[leaf] = shared
    return specs


def _assign(
    owner: torch.nn.Module, leaf: str, kind: str, tensor: torch.Tensor, requires_grad: bool
) -> None:
    if kind == "parameter":
        if not isinstance(tensor, torch.nn.Parameter):
            tensor = torch.nn.Parameter(tensor, requires_grad=requires_grad)
        owner._parameters[leaf] = tensor
    else:
        owner._buffers[leaf] = tensor


def _current(owner: torch.nn.Module, leaf: str, kind: str) -> Tensor:
    table = owner._parameters if kind == "parameter" else owner._buffers
    value = table[leaf]
    if not isinstance(value, Tensor):
        raise TypeError(
            f"materialize(): after initialisation {type(owner).__name__}.{leaf} is a "
            f"{type(value).__name__} on {getattr(value, 'device', 'no device')}, not a torchlax Tensor; its initializer "
            "must write into the tensor in place."
        )
    return value


def shard_shapes(tensor: torch.Tensor | jax.Array) -> list[tuple[int, ...]]:
    """The shape of each device's shard of a torchlax Tensor (one entry per device)."""
    if isinstance(tensor, Tensor):
        tensor = array_of(tensor)
    elif isinstance(tensor, torch.Tensor):
        raise TypeError(
            f"shard_shapes() takes a torchlax Tensor or a jax.Array, not a tensor on "
            f"{tensor.device}: move it to the jax device first (tensor.to('jax'))."
        )
    return [tuple(s.data.shape) for s in tensor.addressable_shards]
