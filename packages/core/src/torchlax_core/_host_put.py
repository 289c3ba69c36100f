"""Put host (NumPy) data on one JAX device, without ``jax.device_put``'s Python layers.

``jax.device_put`` of a small NumPy array costs ~70 us of Python (argument flattening, the
sharding and copy-semantics dispatch, a deferred result handler) around a ~5 us call into
JAX's runtime. ``torch.tensor(data, device="jax")``, ``torch.empty(0, device="jax")`` and
``cpu_tensor.to("jax")`` each pay one, and transformers makes several per forward
(``DynamicCache``'s empty tensors). ``put`` makes that one runtime call itself, with the same
result as ``jax.device_put``: a new array of the host array's dtype (int64/float64 kept, as in
JAX's 64-bit mode), uncommitted on the default device unless another device is named. Where
the runtime call is missing or refuses its arguments (another JAX version), ``jax.device_put``
does it, as it does a put onto a sharding over several devices (each gets only its shard).

At the bottom of the core: it imports no other core module but ``_x64``.
"""

from __future__ import annotations

import jax
import numpy as np
from jax._src import core as _jax_core
from jax._src.interpreters.pxla import get_default_device
from jax.sharding import Sharding, SingleDeviceSharding

from ._x64 import x64, x64_flag

try:  # JAX's private runtime entry point (what jax.device_put itself ends in)
    from jax._src.lib import xla_client as _xla_client

    _batched_device_put = _xla_client.batched_device_put
except (ImportError, AttributeError):  # pragma: no cover - another JAX layout
    _batched_device_put = None

_shardings: dict = {}  # device -> SingleDeviceSharding (building one costs ~5 us)


def put(host: np.ndarray, device=None) -> jax.Array:
    """A new array on ``device`` (a ``jax.Device`` or a ``Sharding``; ``None``: the default
    device) holding ``host``'s elements, as ``jax.device_put(host, device)`` in 64-bit mode.

    On the default device the array is uncommitted, as JAX's own default placement: it then
    combines with arrays sharded over a mesh (JAX moves it), as a tensor on PyTorch's default
    device does.

    ``host`` must be an array no one else holds: on a CPU device the runtime may keep it as the
    array's buffer instead of copying it (JAX's zero-copy host buffers), so a later write to
    ``host`` would show through.
    """
    if x64_flag.value:
        return _put(host, device)
    with x64():  # keep int64/float64: outside 64-bit mode JAX narrows them on the way in
        return _put(host, device)


def _put(host: np.ndarray, device) -> jax.Array:
    if isinstance(device, Sharding):
        if len(device.device_set) > 1:  # each device receives only its shard of ``host``
            return jax.device_put(host, device)
        (device,) = device.device_set
    default = get_default_device()
    committed = device is not None and device != default
    if not committed:
        device = default
    if _batched_device_put is not None:
        sharding = _shardings.get(device)
        if sharding is None:
            sharding = SingleDeviceSharding(device)
            if len(_shardings) < 256:
                _shardings[device] = sharding
        try:
            aval = _jax_core.ShapedArray(host.shape, host.dtype)
            return _batched_device_put(aval, sharding, [host], [device], committed)
        except (TypeError, ValueError):  # arguments this JAX's runtime call does not take
            pass
    return jax.device_put(host, device if committed else None)
