"""The plugins torchlax-core ships: ordinary named plugins, so each can be blocked or replaced.

- ``torchlax.device``: maps ``jax``, ``jax:N``, ``cpu``, ``cuda`` and ``None`` to JAX devices.
- ``torchlax.transfer``: the ops at the device boundary (``copy_``, ``_to_copy``, ``empty``,
  ``_local_scalar_dense``, ``is_pinned``) that ``.to()``, ``.cpu()``, ``.item()`` and factories need.
- ``torchlax.fallback``: runs unlowered ops with PyTorch on the CPU when
  ``Config.fallback_to_torch`` is on (``jax.pure_callback`` under tracing).
"""

from __future__ import annotations

import math

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import torch
from torch.utils import _pytree as pytree

from ._checks import check_sizes
from ._current import current_env
from ._dtypes import jax_dtype
from ._host_put import put
from ._layouts import memory_order, memory_ordered_array, stored_in_order
from ._logging import get_logger
from ._mutation import resize_, resize_as_, set_storage_, set_tensor_
from ._registry import op_name
from ._tensor import Tensor, _from_cpu, _to_cpu
from .hookspecs import hookimpl

aten = torch.ops.aten
_log = get_logger()


# -- torchlax.device --------------------------------------------------------------------------


class DevicePlacement:
    @hookimpl(trylast=True)
    def torchlax_device_placement(self, device, env):
        # Process-local devices, as torch's cuda:N: in a multi-process run (jax.distributed)
        # jax.devices() lists every process's devices, most of which this one cannot use.
        if device is None:
            return jax.local_devices()[0]
        if device.type == "jax":
            devices = jax.local_devices()
            index = device.index or 0
            if index >= len(devices):
                raise ValueError(
                    f"Device jax:{index} does not exist: JAX sees {len(devices)} device(s) "
                    f"({', '.join(str(d) for d in devices)})."
                )
            return devices[index]
        if device.type == "cpu":
            return jax.local_devices(backend="cpu")[device.index or 0]
        if device.type == "cuda":
            return cuda_device(device)
        return None


def cuda_device(device: torch.device) -> jax.Device:  # pyright: ignore[reportInvalidTypeForm]  (jax.Device is a run-time alias of jaxlib's class)
    """The JAX GPU device that is torch's ``device`` (``cuda`` or ``cuda:N``).

    Matched on the physical ordinal both libraries number CUDA devices by (after
    ``CUDA_VISIBLE_DEVICES``): torch's index and JAX's ``local_hardware_id``, which DLPack
    also uses, so data placed here is where ``from_torch`` of a tensor on ``device`` lands.
    """
    try:
        gpus = jax.local_devices(backend="gpu")
    except RuntimeError:
        raise ValueError(
            f"device='{device}' was asked of torchlax, but JAX sees no GPU. Install JAX's CUDA "
            'plugin with `pip install "torchlax[cuda]"` (in this repository: '
            "`uv sync --group cuda`), or use device='jax'."
        ) from None
    index = device.index
    if index is None:  # as torch: the current CUDA device
        index = torch.cuda.current_device() if torch.cuda.is_available() else 0
    for gpu in gpus:
        if gpu.local_hardware_id == index:
            return gpu
    raise ValueError(
        f"Device {device} has no JAX counterpart: JAX sees the GPUs "
        f"{', '.join(f'{d} (CUDA ordinal {d.local_hardware_id})' for d in gpus)}. Check that "
        "PyTorch and JAX see the same CUDA_VISIBLE_DEVICES."
    )


# -- torchlax.transfer ------------------------------------------------------------------------


# Up to this many bytes an empty tensor's zeros are made on the host and put on the device
# (~10 us) instead of dispatched to XLA as jnp.zeros (~130 us of JAX's eager dispatch); above
# it moving the bytes would cost more than computing them there.
_HOST_ZEROS_BYTES = 1 << 12


def _empty(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    # XLA has no uninitialised memory; an "empty" tensor is zeros.
    dtype = jax_dtype(dtype or torch.get_default_dtype())
    check_sizes(size, dtype.itemsize)  # before XLA, which aborts on an overflowing shape
    shape = tuple(size)
    if math.prod(shape) * dtype.itemsize <= _HOST_ZEROS_BYTES:
        return Tensor(put(np.zeros(shape, dtype)))
    return Tensor(jnp.zeros(shape, dtype))


def _empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    # empty_like and .to() of a transposed tensor ask for its strides (preserve_format)
    if any(n > 1 and s < 0 for n, s in zip(size, stride, strict=False)):
        # PyTorch's storage size computation overflows on a negative stride of a real dim.
        raise RuntimeError(
            f"Storage size calculation overflowed with sizes={list(size)} and "
            f"strides={list(stride)}"
        )
    order = memory_order(tuple(size), tuple(stride))
    if order is None:
        return _empty(size, dtype=dtype)
    stored = _empty([size[d] for d in order], dtype=dtype)._value()
    return stored_in_order(stored, order, stride)


def _copy_(self, src, non_blocking=False):
    if not isinstance(self, Tensor):  # cpu_tensor.copy_(torchlax_tensor)
        return self.copy_(_to_cpu(src._value()), non_blocking)
    before = self._storage.array
    placement = _committed_placement(before)
    if isinstance(src, Tensor):
        value = src._value()
    else:  # straight onto the destination's devices (each device gets only its shard)
        whole = self._view is None and tuple(src.shape) == tuple(self.shape)
        value = _from_cpu(src, placement if whole else None)
    value = jnp.broadcast_to(value.astype(jax_dtype(self.dtype)), tuple(self.shape))
    self._write(value)
    after = self._storage.array
    if placement is not None and getattr(after, "sharding", placement) != placement:
        # PyTorch's copy_ keeps the destination's device; here: its committed layout, so that
        # load_state_dict (param.copy_(loaded)) leaves a sharded model sharded.
        self._storage.array = jax.device_put(after, placement)
        if self._view is not None:
            self._view.seen = None  # read again from the re-placed root
    return self


def _committed_placement(array):
    """The sharding a write into ``array`` must keep (None: uncommitted, or traced)."""
    if isinstance(array, jax.core.Tracer) or not getattr(array, "committed", False):
        return None
    return array.sharding


def _to_copy(
    self,
    *,
    dtype=None,
    layout=None,
    device=None,
    pin_memory=None,
    non_blocking=False,
    memory_format=None,
):
    # PyTorch's preserve_format: a dense transposed/permuted tensor keeps its strides.
    keep = memory_format is None or memory_format is torch.preserve_format
    if not isinstance(self, Tensor):  # cpu_tensor.to("jax"): one copy, straight into JAX
        target = torch.device(device) if device is not None else torch.device("jax")
        source = self if dtype is None else self.to(dtype)
        placement = current_env().placement(target)
        order = memory_order(tuple(source.shape), source.stride()) if keep else None
        if order is None:
            return Tensor(_from_cpu(source, placement))
        # permuted to memory order the source is contiguous: copied as it lies in memory
        return stored_in_order(_from_cpu(source.permute(order), placement), order, source.stride())
    in_order = memory_ordered_array(self) if keep else None
    if device is not None and torch.device(device).type != "jax":
        if in_order is None:
            out = _to_cpu(self._value())
        else:  # the memory-order copy, given the source's strides (not a view of it)
            stored = _to_cpu(in_order[0])
            out = torch.empty(0, dtype=stored.dtype).set_(
                stored.untyped_storage(), 0, self.shape, self.stride()
            )
        return out.to(device=device, dtype=dtype or out.dtype)
    value = self._value() if in_order is None else in_order[0]
    if dtype is not None:
        value = value.astype(jax_dtype(dtype))
    elif device is None:
        value = jnp.array(value, copy=True)
    if device is not None:
        value = current_env().place(value, torch.device(device))
    if in_order is None:
        return Tensor(value)
    return stored_in_order(value, in_order[1], self.stride())


def _local_scalar_dense(self):
    return self.item()


def _identity(self):
    return self


def _is_pinned(self, device=None):
    # Pinned memory is page-locked host memory; a JAX array is not in it (as a CUDA tensor's
    # is_pinned() is False). torch.distributed.checkpoint asks it of every tensor it saves.
    return False


def _lift_fresh(self):
    return self


class Transfer:
    @hookimpl
    def torchlax_register_lowerings(self, registry):
        # Torch-level: these move data between torch and JAX, so they see torch tensors.
        registry.register_decomposition(aten.empty.memory_format, _empty)
        registry.register_decomposition(aten.empty_strided.default, _empty_strided)
        registry.register_decomposition(aten.copy_.default, _copy_)
        registry.register_decomposition(aten._to_copy.default, _to_copy)
        registry.register_decomposition(aten._local_scalar_dense.default, _local_scalar_dense)
        registry.register_decomposition(aten.lift_fresh.default, _lift_fresh)
        registry.register_decomposition(aten.is_pinned.default, _is_pinned)
        # Change the tensor's own sizes (as the in-place view ops do), so they live in the core.
        registry.register_decomposition(aten.resize_.default, resize_)
        registry.register_decomposition(aten.resize_as_.default, resize_as_)
        registry.register_decomposition(aten.set_.source_Storage, set_storage_)
        registry.register_decomposition(aten.set_.source_Storage_storage_offset, set_storage_)
        registry.register_decomposition(aten.set_.source_Tensor, set_tensor_)
        # Autograd itself detaches (module.to, Parameter, .grad): alias views of the input.
        registry.register_lowering(aten.detach.default, _identity)
        registry.register_lowering(aten.alias.default, _identity)


# -- torchlax.fallback ------------------------------------------------------------------------


def _to_torch_cpu(x):
    return _to_cpu(x._value()) if isinstance(x, Tensor) else x


def _mutated_positions(op) -> list[int]:
    schema = getattr(op, "_schema", None)
    if schema is None:
        return []
    return [
        i
        for i, a in enumerate(schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    ]


def _cpu_fallback(op, env):
    name = op_name(op)
    mutated = _mutated_positions(op)

    def run(*args, **kwargs):
        flat, spec = pytree.tree_flatten((args, kwargs))
        traced = any(
            isinstance(x, Tensor) and isinstance(x._value(), jax.core.Tracer) for x in flat
        )
        if ("fallback", op) not in env._warned:
            _log.info(
                "fallback: %s runs with PyTorch on the CPU%s",
                name,
                " through jax.pure_callback" if traced else "",
            )
        env.warn_once(
            ("fallback", op),
            f"torchlax: {name} has no JAX lowering; running it with PyTorch on the CPU "
            "(config.fallback_to_torch; inside a compiled program through jax.pure_callback, "
            "a host round trip per call). Register a lowering to keep it on XLA.",
        )
        if traced:
            return _traced_fallback(op, args, flat, spec, mutated)
        cpu_args, cpu_kwargs = pytree.tree_unflatten([_to_torch_cpu(x) for x in flat], spec)
        out = op(*cpu_args, **cpu_kwargs)
        for i in mutated:  # write the CPU result of an in-place op back into the jax tensor
            if i < len(args) and isinstance(args[i], Tensor):
                args[i]._write(_from_cpu(cpu_args[i]))
        if mutated and isinstance(out, torch.Tensor) and len(args) and out is cpu_args[0]:
            return args[0]
        return pytree.tree_map(
            lambda t: Tensor(_from_cpu(t)) if isinstance(t, torch.Tensor) else t, out
        )

    return run


def _output_structure(op, flat, spec, positions):
    """The op's outputs as fake tensors, from its meta or fake kernel (no values needed).

    ``FakeTensorMode`` covers more than the ``meta`` device: custom ops' fake impls, and ops
    with no meta kernel at all, whose output metadata it takes from running the CPU kernel
    on zeros of the input shapes (``allow_fallback_kernels``).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_fallback_kernels=True)
    values = list(flat)
    with mode:
        for i in positions:
            t = flat[i]
            values[i] = torch.empty_strided(
                tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="cpu"
            )
        fake_args, fake_kwargs = pytree.tree_unflatten(values, spec)
        try:
            return op(*fake_args, **fake_kwargs)
        except Exception as exc:
            raise NotImplementedError(
                f"torchlax cannot run {op_name(op)} inside a compiled program with "
                "config.fallback_to_torch: jax.pure_callback needs the output shapes before "
                f"the values exist, and PyTorch's meta/fake kernel for it failed ({exc}). Run "
                "it outside torchlax.jit / torch.compile, or register a JAX lowering for it."
            ) from exc


def _traced_fallback(op, args, flat, spec, mutated):
    """Run ``op`` with PyTorch on the host from inside a JAX trace (``jax.pure_callback``).

    Results are the op's tensor outputs and then the new values of the arguments it writes in
    place, which are written back into those torchlax Tensors.
    """
    positions = [i for i, x in enumerate(flat) if isinstance(x, Tensor)]
    arrays = [flat[i]._value() for i in positions]
    fake_out = _output_structure(op, flat, spec, positions)
    out_flat, out_spec = pytree.tree_flatten(fake_out)
    tensor_outs = [k for k, t in enumerate(out_flat) if isinstance(t, torch.Tensor)]
    written = [i for i in mutated if i < len(args) and isinstance(args[i], Tensor)]
    shapes = [
        jax.ShapeDtypeStruct(tuple(out_flat[k].shape), jax_dtype(out_flat[k].dtype))
        for k in tensor_outs
    ]
    shapes += [
        jax.ShapeDtypeStruct(tuple(args[i].shape), jax_dtype(args[i].dtype)) for i in written
    ]

    def host(*host_arrays):
        values = list(flat)
        for i, a in zip(positions, host_arrays, strict=True):
            values[i] = _to_cpu(jnp.asarray(a)).clone()  # the op may write into it
        host_args, host_kwargs = pytree.tree_unflatten(values, spec)
        res = pytree.tree_leaves(op(*host_args, **host_kwargs))
        res = [r for r in res if isinstance(r, torch.Tensor)] + [host_args[i] for i in written]
        return [
            jax.device_get(_from_cpu(r.detach().resolve_conj().resolve_neg().contiguous()))
            for r in res
        ]

    results = jax.pure_callback(host, shapes, *arrays)
    outs = results[: len(tensor_outs)]
    for i, new in zip(written, results[len(tensor_outs) :], strict=True):
        args[i]._write(new)
    if (
        written
        and len(tensor_outs) == 1
        and written[0] == 0
        and not isinstance(fake_out, tuple | list)
    ):
        return args[0]  # an in-place op returns its (now written) self
    out_values = list(out_flat)
    for k, r in zip(tensor_outs, outs, strict=True):
        out_values[k] = Tensor(r)
    return pytree.tree_unflatten(out_values, out_spec)


class Fallback:
    @hookimpl(trylast=True)
    def torchlax_fallback(self, op, env):
        if not env.config.fallback_to_torch or not isinstance(op, torch._ops.OpOverload):
            return None
        return _cpu_fallback(op, env)


BUILTIN_PLUGINS = {
    "torchlax.device": DevicePlacement(),
    "torchlax.transfer": Transfer(),
    "torchlax.fallback": Fallback(),
}
