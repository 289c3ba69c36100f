"""Make ``"jax"`` a torch device type, with no effect on code that does not use it.

PyTorch reserves one dispatch key, PrivateUse1, for an out-of-tree backend. torchlax names it
``jax`` so ``torch.device("jax", 1)`` parses, gives it the Python-side device module, hooks and
device guard autograd needs, and routes every ATen op that reaches it (factories called with
``device="jax"``, and the ``empty``/``copy_`` pair behind ``cpu_tensor.to("jax")``) to the
current environment. Only tensors on the ``jax`` device can reach these kernels, so CPU, CUDA
and other backends are untouched.
"""

from __future__ import annotations

import os

import jax
import torch

from . import _autocast
from ._current import current_env
from ._run import run_op

# Kernels are entered from PyTorch's dispatcher, also while torch.compile runs code eagerly (a
# graph break, loss.backward()): Dynamo must not try to compile them and the JAX they run.
from ._tensor import Tensor, _hide_from_dynamo

BACKEND = "jax"
_state = {"set_up": False, "fallback": None, "aten": None, "factories": set(), "composites": set()}


class _DeviceModule:
    """What ``torch.jax`` answers; the counts come from JAX."""

    def is_initialized(self) -> bool:
        return True

    def _lazy_init(self) -> None:
        # PyTorch calls this before the first factory call with device="jax" in a process.
        # Creating the environment then (loading its plugins, which registers the factory
        # kernels) lets that very call take the same path as every later one: otherwise the
        # first torch.arange(5, device="jax") would run ATen's empty-then-out= composite.
        current_env()

    def is_available(self) -> bool:
        # What torch.accelerator.is_available() answers. False keeps CPU programs as they are
        # without torchlax: DataLoader(pin_memory=True) over CPU tensors then skips pinning (as
        # on a CPU-only PyTorch) instead of asking the jax device for pinned host memory, which
        # it has none of. The jax device itself is always usable.
        return False

    def current_device(self) -> int:
        return 0

    def manual_seed(self, seed: int) -> None:
        # torchlax's keys are drawn from the CPU generator (see get_rng_state).
        torch.manual_seed(seed)

    def seed(self) -> None:
        torch.seed()

    def initial_seed(self) -> int:
        return torch.initial_seed()

    def synchronize(self, device=None) -> None:
        """Wait for every computation queued on the JAX devices (``jax.effects_barrier``)."""
        jax.effects_barrier()
        for array in jax.live_arrays():
            array.block_until_ready()

    def memory_allocated(self, device=None) -> int:
        """Bytes held by live JAX arrays on ``device`` (default: jax:0)."""
        target = _jax_device(device)
        total = 0
        for array in jax.live_arrays():
            try:
                shards = array.addressable_shards
            except Exception:  # a deleted array
                continue
            total += sum(s.data.nbytes for s in shards if s.device == target)
        return total

    def memory_stats(self, device=None) -> dict:
        """The JAX device's own allocator statistics (empty where the backend keeps none)."""
        return _jax_device(device).memory_stats() or {}

    def _is_in_bad_fork(self) -> bool:
        return False

    def get_rng_state(self, device=None) -> torch.Tensor:
        # torchlax's keys are drawn from the CPU generator: that is the "jax" RNG state too
        # (torch.random.fork_rng saves and restores it per device).
        return torch.get_rng_state()

    def set_rng_state(self, new_state: torch.Tensor, device=None) -> None:
        torch.set_rng_state(new_state)

    def manual_seed_all(self, seed: int) -> None:
        # torch.manual_seed calls this after seeding the CPU generator, which torchlax's keys
        # are drawn from: nothing left to do (calling torch.manual_seed here would recurse).
        pass

    def device_count(self) -> int:
        return len(jax.devices())

    def get_amp_supported_dtype(self):
        return [torch.float16, torch.bfloat16]


def _jax_device(device):
    index = 0
    if device is not None:
        index = device if isinstance(device, int) else (torch.device(device).index or 0)
    return jax.local_devices()[index]


class _Hooks(torch._C._acc.PrivateUse1Hooks):  # pyright: ignore[reportAttributeAccessIssue]  (torch._C's stubs omit _acc)
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _DeviceGuard(torch._C._acc.DeviceGuard):  # pyright: ignore[reportAttributeAccessIssue]  (torch._C's stubs omit _acc)
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1  # pyright: ignore[reportAttributeAccessIssue]  (torch._C's stubs omit _autograd)


def set_up() -> None:
    """Name PrivateUse1 ``jax`` and install the kernels (idempotent)."""
    if _state["set_up"]:
        return
    current = torch._C._get_privateuse1_backend_name()
    if current == "privateuseone":
        torch.utils.rename_privateuse1_backend(BACKEND)
    elif current != BACKEND:
        raise RuntimeError(
            f"torchlax needs PyTorch's PrivateUse1 device slot to name its 'jax' device, but "
            f"another library already named it {current!r}. Import torchlax in a process without "
            "that library."
        )
    if getattr(torch, BACKEND, None) is None:
        torch._register_device_module(BACKEND, _DeviceModule())  # pyright: ignore[reportArgumentType]  (torch only reads attributes of the device module)
        torch._C._acc.register_python_privateuseone_hook(_Hooks())  # pyright: ignore[reportAttributeAccessIssue]  (torch._C's stubs omit _acc)
        torch._C._acc.register_python_privateuseone_device_guard(_DeviceGuard())  # pyright: ignore[reportAttributeAccessIssue]  (torch._C's stubs omit _acc)
    library = torch.library.Library("_", "IMPL")  # noqa: TOR901 - a fallback, not an op
    _hide_from_dynamo(_kernel)
    library.fallback(_kernel, "PrivateUse1", with_keyset=True)
    _state["fallback"] = library
    _state["aten"] = torch.library.Library("aten", "IMPL")  # noqa: TOR901
    # Ops that reach the jax device with Python dispatch turned off (torch.tensor(...,
    # device="jax") builds its result that way) need explicit kernels; the fallback cannot
    # serve them.
    for name in ("copy_", "_copy_from", "_to_copy", "lift_fresh", "_local_scalar_dense"):
        op = getattr(torch.ops.aten, name).default
        _state["aten"].impl(name, _make_factory_kernel(op, check=False), "PrivateUse1")
    _autocast.install()
    _state["set_up"] = True


_forked = []  # set in a child forked after JAX started (a DataLoader worker)


def _note_fork() -> None:
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():
        _forked.append(True)


os.register_at_fork(after_in_child=_note_fork)


# JAX warns at every fork after it started ("os.fork() was called ... JAX is multithreaded"), and
# Python shows it again whenever anything touches the warning filters in between: a DataLoader
# would log it per worker and epoch. torchlax lets it through at the first such fork and hides
# it at the later ones, with a filter that is there during the fork only. (Hooks registered
# after JAX's run before it, so the filter is in place when JAX warns.)
_FORK_WARNING: dict = {"shown": False, "hiding": None}


def _before_fork() -> None:
    from jax._src import xla_bridge

    if not xla_bridge.backends_are_initialized():
        return
    if not _FORK_WARNING["shown"]:
        _FORK_WARNING["shown"] = True
        return
    import warnings

    hiding = warnings.catch_warnings()  # restores the filters as they were after the fork
    hiding.__enter__()
    warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
    _FORK_WARNING["hiding"] = hiding


def _after_fork_in_parent() -> None:
    hiding, _FORK_WARNING["hiding"] = _FORK_WARNING["hiding"], None
    if hiding is not None:
        hiding.__exit__(None, None, None)


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent)


def _check_not_forked(op) -> None:
    raise RuntimeError(
        f"{op} was asked to create a tensor on the jax device in a process forked after JAX "
        "had started (for example a DataLoader worker): JAX's runtime does not survive fork, so "
        "this would crash. Create CPU tensors in the Dataset and move each batch to 'jax' in "
        "the main process, or use DataLoader(..., multiprocessing_context='spawn', "
        "persistent_workers=True)."
    )


def _kernel(keyset, op, *args, **kwargs):
    if _forked:
        _check_not_forked(op)
    env = current_env()
    return _place(env, run_op(env, op, args, kwargs), kwargs.get("device"))


def _place(env, out, device):
    if isinstance(out, Tensor) and device is not None:
        placed = env.place(out._value(), device)
        if placed is not out._elem:
            return Tensor(placed)
    return out


def register_factory_kernels(tables) -> None:
    """Send factory ops with a lowering straight to torchlax when ``device="jax"``.

    Factories such as ``arange`` have a backend-independent kernel that would otherwise
    allocate an empty tensor and fill it through ``out=``; a PrivateUse1 kernel takes the whole
    call instead. Kernels are registered once per op for the life of the process.
    """
    if not _state["set_up"]:
        return
    library = _state["aten"]
    for op in list(tables.lowerings) + list(tables.decompositions):
        overloads = (
            [getattr(op, name) for name in op.overloads()]
            if isinstance(op, torch._ops.OpOverloadPacket)
            else [op]
        )
        for overload in overloads:
            if overload in _state["factories"] or not _is_factory(overload):
                continue
            name = overload._schema.name
            qualified = name + (
                "." + overload._overloadname if overload._overloadname != "default" else ""
            )
            try:
                library.impl(
                    qualified.split("::", 1)[1], _make_factory_kernel(overload), "PrivateUse1"
                )
            except RuntimeError:
                continue  # a C++ kernel already exists for this key
            _state["factories"].add(overload)


def register_composite_overrides(tables) -> None:
    """Let a decomposition replace PyTorch's own composite (CompositeImplicitAutograd) kernel.

    Such ops (``cov``, ...) never reach ``__torch_dispatch__``: PyTorch runs their composite
    above autograd. A kernel at the jax device's autograd key runs the current environment's
    decomposition instead (torch-level, so autograd records its ops), else the composite.
    """
    if not _state["set_up"]:
        return
    library = _state["aten"]
    for op in tables.decompositions:
        overloads = (
            [getattr(op, name) for name in op.overloads()]
            if isinstance(op, torch._ops.OpOverloadPacket)
            else [op]
        )
        for overload in overloads:
            if overload in _state[
                "composites"
            ] or not torch._C._dispatch_has_kernel_for_dispatch_key(
                overload.name(), "CompositeImplicitAutograd"
            ):
                continue
            name = overload._schema.name.split("::", 1)[1]
            if overload._overloadname != "default":
                name += "." + overload._overloadname
            library.impl(name, _make_composite_kernel(overload), "AutogradPrivateUse1")
            _state["composites"].add(overload)


def _make_composite_kernel(op):
    def kernel(*args, **kwargs):
        decompositions = current_env()._tables.decompositions
        entry = decompositions.get(op) or decompositions.get(op.overloadpacket)
        if entry is None:
            return op.decompose(*args, **kwargs)
        return entry.fn(*args, **kwargs)

    _hide_from_dynamo(kernel)
    return kernel


def _is_factory(op) -> bool:
    schema = op._schema
    if schema.is_mutable or op.namespace != "aten":
        return False
    names = {a.name for a in schema.arguments}
    has_tensor = any("Tensor" in str(a.type) for a in schema.arguments)
    return "device" in names and not has_tensor


def _make_factory_kernel(op, check=True):
    if not check:

        def kernel(*args, **kwargs):  # pyright: ignore[reportRedeclaration]  (one definition per branch)
            if _forked:
                _check_not_forked(op)
            return run_op(current_env(), op, args, kwargs)

        _hide_from_dynamo(kernel)
        return kernel

    def kernel(*args, **kwargs):
        return _kernel(None, op, *args, **kwargs)

    _hide_from_dynamo(kernel)
    return kernel
