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
device ``jax`` from it without touching its data. Two hooks route it there:

- ``VariableBuilder._wrap`` sends a torchlax Tensor straight to ``wrap_tensor`` (the path of
  ``torch.Tensor`` and traceable subclasses), instead of the user-defined-object path;
- ``infer_subclass_type`` answers ``None`` for it, so Dynamo does not model it as a
  ``__torch_function__`` subclass (``TensorWithTFOverrideVariable``).

Guards keep the distinction: ``TENSOR_MATCH`` checks the Python type and the dispatch keys,
so a graph compiled for torchlax Tensors never runs on CPU tensors and the reverse (each gets
its own compile). The real torchlax Tensors reach the compiled graph at run time, where
``_program`` reads their arrays. Nothing changes for other tensors or other backends; a
torchlax Tensor given to another backend (inductor) reaches that backend as a ``jax`` device
tensor, which it rejects as it would any unknown device.

At run time AOT autograd checks that each tangent reaching a compiled backward has the type
it traced with (a plain tensor, for a fakeified torchlax Tensor) and otherwise asks the
tangent's ``__coerce_same_metadata_as_tangent__``. A torchlax Tensor *is* the tensor the
backward program wants, so torchlax's Tensor answers with itself (added here, unless the
class defines it).

Installed when ``torchlax_dynamo`` is imported (that is, when ``torch.compile`` looks the
backend up), and idempotent.
"""

from __future__ import annotations

from torchlax_core import Tensor

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

    if not hasattr(Tensor, "__coerce_same_metadata_as_tangent__"):
        Tensor.__coerce_same_metadata_as_tangent__ = _same_tangent

    builder.VariableBuilder._wrap = _wrap
    builder.infer_subclass_type = _infer_subclass_type
    _installed.append((wrap, infer_subclass_type))


def _same_tangent(self, expected_metadata=None, expected_type=None):
    return self
