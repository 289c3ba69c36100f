"""``call_jax``: run a JAX function from PyTorch code, with autograd and ``torch.compile``.

The JAX function is called through one PyTorch custom op, ``torchlax_interop::call_jax(str
key, Tensor[] inputs) -> Tensor[]``. ``key`` names an entry of a registry holding the function
and the non-tensor parts of the call, so the op itself only carries a string and tensors:

* eagerly on CPU (or CUDA) tensors its kernel shares the tensors with JAX through DLPack;
* on torchlax Tensors it reaches torchlax's dispatch, whose lowering (plugin ``interop``)
  calls the function on the arrays directly, traced or not;
* under ``torch.compile`` its fake kernel answers shapes and dtypes with ``jax.eval_shape``,
  so Dynamo never traces into JAX and the graph does not break.

Its backward is a second op, ``call_jax_vjp``, which runs ``jax.vjp`` of the function at the
saved inputs (the forward is recomputed, nothing JAX-side outlives the forward).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch.utils import _pytree as pytree
from torchlax_core import jax_dtype, torch_dtype
from torchlax_core.internal import x64

from ._arguments import check_call_jax_result
from ._dlpack import check_shared_writes

# Marks a tensor's place among the arguments: a plain string, so that Dynamo can hand the
# argument skeleton to ``_register`` as a constant.
_SLOT = "\x00torchlax_interop:tensor\x00"


class _Entry:
    """One registered call shape: the function, and how to rebuild its arguments."""

    def __init__(self, fn: Callable, in_spec, statics: tuple):
        self.in_spec = in_spec  # torch TreeSpec of (args, kwargs)
        self.statics = statics  # each leaf: its value, or _SLOT for a tensor passed to the op
        self.signature = (str(in_spec), statics)
        self.out_spec: Any = None  # torch TreeSpec of the result, known once the function ran
        self.pinned: Callable | None = None
        try:
            # Eager calls hold the function only weakly, so a lambda made per call does not
            # pile up here; the entry goes when the function does.
            self._ref = weakref.ref(fn)
        except TypeError:
            self._ref, self.pinned = None, fn

    @property
    def fn(self) -> Callable:
        fn = self.pinned if self.pinned is not None else self._ref()  # pyright: ignore[reportOptionalCall]  (_ref is None only when the function is pinned)
        if fn is None:
            raise RuntimeError(
                "torchlax.call_jax: the JAX function of this call was garbage collected."
            )
        return fn

    def pin(self) -> None:
        """Hold the function for good (a compiled graph refers to it by key)."""
        self.pinned = self.fn


_ENTRIES: dict[str, _Entry] = {}


def _register(fn: Callable, skeleton: Any, pin: bool) -> str:
    """The registry key for calling ``fn`` with this argument skeleton.

    Dynamo runs this for real while tracing and keeps its result as a constant, so the entry
    exists when the op's fake kernel looks it up; a compiled graph refers to the function by
    key for good, so it is pinned then (``pin``).
    """
    statics, in_spec = pytree.tree_flatten(skeleton)
    statics = tuple(statics)
    try:
        signature = hash((str(in_spec), statics))
    except TypeError:
        raise TypeError(
            "torchlax.call_jax passes non-tensor arguments to the JAX function as static "
            "values, which must be hashable; got an unhashable one. Pass arrays as torch "
            "tensors, and other values as hashable Python objects (tuples, not lists)."
        ) from None
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    base = f"{name}@{id(fn):x}/{signature & 0xFFFFFFFFFFFF:x}"
    key, n = base, 0
    while True:
        entry = _ENTRIES.get(key)
        if entry is None:
            entry = _ENTRIES[key] = _Entry(fn, in_spec, statics)
            if pin:
                entry.pin()
            elif entry._ref is not None:
                weakref.finalize(fn, _ENTRIES.pop, key, None)
            return key
        if entry.signature == (str(in_spec), statics) and entry.fn is fn:
            if pin:
                entry.pin()
            return key
        n += 1  # a hash collision
        key = f"{base}#{n}"


# What ``torch.compiler.assume_constant_result`` does, without its ``import torch._dynamo``
# (seconds at import time, for every user, whether they compile or not).
_register._dynamo_marked_constant = True  # pyright: ignore[reportFunctionMemberAccess]  (the marker Dynamo reads)


def call_jax(jax_fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """Call ``jax_fn`` on the tensors in ``args``/``kwargs`` and return its results as tensors.

    Tensors anywhere in the argument pytrees become ``jax.Array`` arguments; every other leaf
    is passed unchanged and treated as static (it must be hashable). Results come back as the
    kind of tensors given: torchlax Tensors for torchlax Tensors (no copy), plain tensors on
    the same device for CPU/CUDA tensors (shared through DLPack; a result that is one of the
    inputs is copied, because an op's outputs may not alias its inputs). The result keeps the
    pytree structure ``jax_fn`` returned (tuples, lists, dicts, namedtuples).

    ``loss.backward()`` works through the call: the backward runs ``jax.vjp`` of ``jax_fn``.
    Inside ``torch.compile(fullgraph=True)`` the call is one opaque custom op whose shapes come
    from ``jax.eval_shape``: no graph break. JAX runs with 64-bit types enabled, so int64 and
    float64 tensors keep their dtypes.
    """
    flat, in_spec = pytree.tree_flatten((args, kwargs))
    tensors = [x for x in flat if isinstance(x, torch.Tensor)]
    skeleton = pytree.tree_unflatten(
        [_SLOT if isinstance(x, torch.Tensor) else x for x in flat], in_spec
    )
    key = _register(jax_fn, skeleton, torch.compiler.is_compiling())
    outputs = torch.ops.torchlax_interop.call_jax(key, tensors)
    return pytree.tree_unflatten(outputs, _ENTRIES[key].out_spec)


# -- running the function on arrays -----------------------------------------------------------------


def _call(entry: _Entry, arrays) -> Any:
    it = iter(arrays)
    flat = [next(it) if isinstance(s, str) and s == _SLOT else s for s in entry.statics]
    args, kwargs = pytree.tree_unflatten(flat, entry.in_spec)
    return entry.fn(*args, **kwargs)


def _flat_fn(key: str) -> Callable:
    """The function as arrays -> flat list of arrays; records the result's structure."""
    entry = _ENTRIES[key]

    def flat_fn(*arrays):
        result = _call(entry, arrays)
        check_call_jax_result(entry.fn, result)
        leaves, treedef = jax.tree_util.tree_flatten(result)
        placeholder = jax.tree_util.tree_unflatten(treedef, [0] * len(leaves))
        entry.out_spec = pytree.tree_flatten(placeholder)[1]
        return [jnp.asarray(leaf) for leaf in leaves]

    return flat_fn


def run_jax(key: str, arrays: list) -> list:
    """Forward on arrays (the lowering for torchlax Tensors, and the CPU kernel's core); called
    in 64-bit mode (``run_op``'s for the lowering, the kernel's own)."""
    return _flat_fn(key)(*arrays)


def run_jax_vjp(key: str, arrays: list, cotangents: list) -> list:
    """Gradients w.r.t. ``arrays`` for the given output cotangents (None means zeros); called
    in 64-bit mode, as ``run_jax``."""
    outputs, vjp = jax.vjp(_flat_fn(key), *arrays)
    cts = [_cotangent(out, ct) for out, ct in zip(outputs, cotangents, strict=True)]
    grads = vjp(cts)
    return [_gradient(g, a) for g, a in zip(grads, arrays, strict=True)]


def _differentiable(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.inexact)


def _cotangent(out, ct):
    if not _differentiable(out.dtype):
        return np.zeros(out.shape, dtype=jax.dtypes.float0)
    if ct is None:
        return jnp.zeros(out.shape, out.dtype)
    return ct.astype(out.dtype)


def _gradient(grad, array):
    if grad.dtype == jax.dtypes.float0:
        return jnp.zeros(array.shape, array.dtype)
    return grad


# -- the custom ops ---------------------------------------------------------------------------------


def _borrow(tensor: torch.Tensor) -> jax.Array:
    """Share ``tensor`` with JAX for the length of one kernel (it is not made copy-on-write)."""
    tensor = tensor.detach()
    if tensor.numel() == 0:
        return jnp.zeros(tuple(tensor.shape), jax_dtype(tensor.dtype))
    return jnp.from_dlpack(tensor.resolve_conj().resolve_neg().contiguous())


def _give_back(arrays: list, inputs: list[jax.Array]) -> list[torch.Tensor]:
    """The results as torch tensors sharing their memory, except where that would alias."""
    taken = {a.unsafe_buffer_pointer() for a in inputs if a.size and len(a.devices()) == 1}
    jax.block_until_ready(arrays)
    results = []
    for array in arrays:
        if len(array.devices()) != 1:
            array = jax.device_put(array, next(iter(array.devices())))
        elif array.size and array.unsafe_buffer_pointer() in taken:
            array = jnp.array(array, copy=True)
        if array.size:
            taken.add(array.unsafe_buffer_pointer())
        results.append(torch.from_dlpack(array))
    return results


@torch.library.custom_op("torchlax_interop::call_jax", mutates_args=())
def _call_jax_op(key: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    check_shared_writes()
    with x64():
        arrays = [_borrow(t) for t in inputs]
        return _give_back(run_jax(key, arrays), arrays)


@_call_jax_op.register_fake
def _call_jax_fake(key: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    _ENTRIES[key].pin()
    with x64():
        structs = [_struct(t) for t in inputs]
        outputs = jax.eval_shape(_flat_fn(key), *structs)
    device = inputs[0].device if inputs else torch.device("cpu")
    return [torch.empty(o.shape, dtype=torch_dtype(o.dtype), device=device) for o in outputs]


@torch.library.custom_op("torchlax_interop::call_jax_vjp", mutates_args=())
def _call_jax_vjp_op(
    key: str, inputs: list[torch.Tensor], cotangents: list[torch.Tensor | None]
) -> list[torch.Tensor]:
    with x64():
        arrays = [_borrow(t) for t in inputs]
        cts = [None if c is None else _borrow(c) for c in cotangents]
        return _give_back(run_jax_vjp(key, arrays, cts), arrays + [c for c in cts if c is not None])


@_call_jax_vjp_op.register_fake
def _call_jax_vjp_fake(key, inputs, cotangents):
    return [torch.empty_like(t) for t in inputs]


def _struct(tensor: torch.Tensor) -> jax.ShapeDtypeStruct:
    # Symbolic sizes are specialized: JAX shapes are static.
    return jax.ShapeDtypeStruct(tuple(int(s) for s in tensor.shape), jax_dtype(tensor.dtype))


def _setup_context(ctx, inputs, output):
    key, tensors = inputs
    ctx.key = key
    ctx.fn = _ENTRIES[key].fn  # alive until the backward has run
    ctx.differentiable = [t.is_floating_point() or t.is_complex() for t in tensors]
    ctx.save_for_backward(*tensors)


def _backward(ctx, grads):
    tensors = list(ctx.saved_tensors)
    cotangents = [None if g is None else g for g in grads]
    input_grads = torch.ops.torchlax_interop.call_jax_vjp(ctx.key, tensors, cotangents)
    return None, [g if d else None for g, d in zip(input_grads, ctx.differentiable, strict=True)]


torch.library.register_autograd(
    "torchlax_interop::call_jax", _backward, setup_context=_setup_context
)
