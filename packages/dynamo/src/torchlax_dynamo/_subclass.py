"""Let Dynamo treat a torchlax Tensor as an ordinary tensor on device ``jax``.

Left alone, Dynamo (torch 2.14) turns a tensor whose class overrides ``__torch_dispatch__`` and
is not a *traceable* wrapper subclass (no ``__tensor_flatten__``) into a user-defined object
and traces into ``__torch_function__``/``__torch_dispatch__`` - that is, into torchlax's
dispatcher and JAX itself, which fails. Making torchlax's Tensor traceable does not fit either:
a traceable subclass must flatten into inner *torch* tensors, and a torchlax Tensor holds a
``jax.Array``.

What works is what Dynamo already does for a tensor of another backend (an XLA or CUDA tensor):
fakeify it from its metadata. A torchlax Tensor has honest sizes, strides, dtype and device
(``jax:N``, the PrivateUse1 device), so Dynamo's ``MetaConverter`` makes a ``FakeTensor`` on
device ``jax`` from it without touching its data. Three hooks route it there:

- ``VariableBuilder._wrap`` sends a torchlax Tensor straight to ``wrap_tensor`` (the path of
  ``torch.Tensor`` and traceable subclasses), instead of the user-defined-object path;
- ``infer_subclass_type`` answers ``None`` for it, so Dynamo does not model it as a
  ``__torch_function__`` subclass (``TensorWithTFOverrideVariable``);
- ``clone_input`` (used for a real tensor Dynamo installs as a graph attribute: a module
  buffer it treats as a constant) clones a torchlax Tensor by sharing its array - JAX arrays are
  immutable, so that is a true clone - instead of PyTorch's ``empty`` + ``as_strided_`` +
  ``copy_`` recipe, which resizes a tensor in place (torchlax Tensors cannot).

Guards keep the distinction: ``TENSOR_MATCH`` checks the Python type and the dispatch keys,
so a graph compiled for torchlax Tensors never runs on CPU tensors and the reverse (each gets
its own compile). The real torchlax Tensors reach the compiled graph at run time, where
``_program`` reads their arrays. Nothing changes for other tensors or other backends; a
torchlax Tensor given to another backend (inductor) reaches that backend as a ``jax`` device
tensor, which it rejects as it would any unknown device.

Fake tensors and ``torch.tensor(data, device=x.device)``: PyTorch builds such a tensor for
real on its device and then *lifts* it into the fake world. On the ``jax`` device the real
tensor is a torchlax Tensor, which FakeTensorMode does not recognise and so never lifts: a
real tensor would leak into the fake trace. PyTorch already has the remedy, used when no
accelerator is available (``FakeTensorMode.avoid_device_init``): build the data on the CPU,
lift it, and move the fake tensor. FakeTensorMode takes the ``jax`` PrivateUse1 device for an accelerator that
can hold real data, so its availability check (``fake_tensor._is_privateuse1_backend_available``)
answers False for torchlax's device; CUDA and other PrivateUse1 backends are unaffected.

Optimizer state on the device: for a CUDA model, Dynamo sets an optimizer's ``capturable`` flag
before it creates the state (``OptimizerVariable._set_capturable``), so that ``step`` counters
are created on the parameters' device instead of the CPU. It does the same for parameters that
are all torchlax Tensors (a fourth hook): a CPU ``step`` next to ``jax`` parameters would
cross over on every call of the compiled optimizer step and, worse, reading the new value
back would wait for the whole program. torch.optim lists the PrivateUse1 device as
capturable-capable, so a later eager ``step()`` works the same way.

At run time AOT autograd checks that each tangent reaching a compiled backward has the type
it traced with (a plain tensor, for a fakeified torchlax Tensor) and otherwise asks the
tangent's ``__coerce_same_metadata_as_tangent__``. A torchlax Tensor *is* the tensor the
backward program wants, so torchlax's Tensor answers with itself (``torchlax_core.Tensor``
defines it).

Installed when ``torchlax_dynamo`` is imported (that is, when ``torch.compile`` looks the
backend up), and idempotent.
"""

from __future__ import annotations

import torch
from torchlax_core import Tensor
from torchlax_core.internal import array_of

_installed = []


def install() -> None:
    if _installed:
        return
    from torch._dynamo.variables import builder

    wrap = builder.VariableBuilder._wrap
    infer_subclass_type = builder.infer_subclass_type

    def _wrap(self, value):
        if isinstance(value, Tensor):
            return self.wrap_tensor(value)
        return wrap(self, value)

    def _infer_subclass_type(value):
        if isinstance(value, Tensor):
            return None
        return infer_subclass_type(value)

    clone_input = builder.clone_input

    def _clone_input(value, *args, **kwargs):
        if isinstance(value, Tensor):
            return _clone(value)
        return clone_input(value, *args, **kwargs)

    from torch._subclasses import fake_tensor

    privateuse1_available = fake_tensor._is_privateuse1_backend_available

    def _materialising_device_available():
        # torchlax's "jax" device holds only torchlax Tensors, never real data fake mode can lift.
        if torch._C._get_privateuse1_backend_name() == "jax":
            return False
        return privateuse1_available()

    fake_tensor._is_privateuse1_backend_available = _materialising_device_available

    builder.VariableBuilder._wrap = _wrap
    builder.infer_subclass_type = _infer_subclass_type
    builder.clone_input = _clone_input
    _install_capturable_state()
    _installed.append((wrap, infer_subclass_type, clone_input))


def _install_capturable_state() -> None:
    from torch._dynamo.variables.optimizer import OptimizerVariable

    set_capturable = OptimizerVariable._set_capturable

    def _set_capturable(self, tx):
        optimizer = self.value
        for group in optimizer.param_groups:
            params = group.get("params", [])
            if (
                "capturable" in group
                and params
                and all(isinstance(p, Tensor) for p in params)
                and all(p not in optimizer.state for p in params)
            ):
                group["capturable"] = True  # what Dynamo does for CUDA parameters
        return set_capturable(self, tx)

    OptimizerVariable._set_capturable = _set_capturable


def _clone(value: Tensor) -> Tensor:
    from torch._dynamo.utils import copy_dynamo_tensor_attributes

    clone = Tensor(array_of(value), requires_grad=value.requires_grad and value.is_leaf)
    copy_dynamo_tensor_attributes(value, clone)
    return clone
