"""The tables this package fills at import time; ``_plugin`` hands them to the registry.

One lowering is a short stanza in the module of its op family::

    @lowering(aten.add.Tensor, aten.add.Scalar, promote=Promotion.DEFAULT, args=("self", "other"))
    def add(self, other, *, alpha=1):
        return jnp.add(self, other * alpha if alpha != 1 else other)

``lowering`` records the function for the given ``OpOverload``s (or whole packets) and
declares, bound to the op's schema argument names, PyTorch's type promotion (``promote=``, one
of ``ELEMENTWISE_TYPE_PROMOTION_KIND``) or half precision computed in float32 (``opmath=True``,
what PyTorch's ``pw_cast_for_opmath`` declares; ``results=`` says which results round back to
what, e.g. layer norm's float32 statistics for a half input with float32 parameters), so the
body sees its arguments already cast;
``_plugin.torchlax_register_lowerings`` registers every record through the public registry,
exactly as a third-party plugin would.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ._aten import MISSING, Missing
from ._promotion import Promotion, declared

LOWERINGS: list[tuple[Any, Callable]] = []
DECOMPOSITIONS: list[tuple[Any, Callable]] = []
FUNCTIONS: list[tuple[Any, Callable]] = []
# Ops of other libraries (torchvision, transformers) by qualified name ("torchvision::nms"):
# each exists only once its library is imported, which may be after the tables were built, so
# the plugin's ``torchlax_fallback`` hook answers for them on first use. (kind, fn) with kind
# "lowering" (jax.Arrays in and out) or "decomposition" (torch-level).
NAMED: dict[str, tuple[str, Callable]] = {}


def op_name(op: Any) -> str:
    """A Python name for ``op``: ``aten.eq`` -> ``eq``, ``aten._foreach_add.List`` ->
    ``_foreach_add_List`` (the overload joins unless it is ``default``)."""
    if isinstance(op, torch._ops.OpOverload):
        overload = op._overloadname
        return op._opname if overload == "default" else f"{op._opname}_{overload}"
    return op.__name__


def where(op: Any) -> list[str]:
    """Where ``op`` (an ``OpOverload`` or its name, ``"aten.add.Tensor"``) is lowered: one
    ``"path/to/family.py:line name (lowering)"`` per table entry for it or its packet (for a
    packet, also those of its overloads)."""
    import inspect
    import pathlib

    from . import _lowerings  # noqa: F401  (fills the tables)

    if isinstance(op, str):
        namespace, name, *overload = op.removeprefix("torch.ops.").split(".")
        packet = getattr(getattr(torch.ops, namespace), name)
        op = getattr(packet, overload[0]) if overload else packet
    packet = getattr(op, "overloadpacket", op)
    found = []
    for kind, table in (("lowering", LOWERINGS), ("decomposition", DECOMPOSITIONS)):
        for key, fn in table:
            if key is op or key is packet or getattr(key, "overloadpacket", None) is op:
                body = inspect.unwrap(fn)
                path = pathlib.Path(inspect.getsourcefile(body) or "?")
                line = inspect.getsourcelines(body)[1]
                found.append(f"{path}:{line} {fn.__name__} ({kind})")
    # An in-place ``foo_`` or an ``out=`` overload has no entry of its own: the core derives it
    # from the functional op, so point there.
    name = packet.__name__
    overload = getattr(op, "_overloadname", None)
    if not found and (name.endswith("_") or overload == "out"):
        functional = getattr(torch.ops.aten, name.removesuffix("_"), None)
        if overload not in (None, "out") and functional is not None:
            functional = getattr(functional, overload, functional)  # add_.Tensor -> add.Tensor
        if functional is not None and functional is not op:
            found = [f"{entry} (derived: {op} from it)" for entry in where(functional)]
    return found


def named(name: str, fn: Callable) -> Callable:
    """``fn`` (made by a factory or in a loop) renamed ``name``, the name of the op it lowers.

    Its code object is renamed too: a traceback prints the code's name, not ``__name__``, so
    without it every lowering made by one factory would show as that factory's inner function.
    """
    fn.__name__ = fn.__qualname__ = name
    fn.__code__ = fn.__code__.replace(co_name=name, co_qualname=name)
    return fn


def lowering(
    *ops: Any,
    promote: Promotion | None = None,
    args: Sequence[str] | None = None,
    opmath: bool = False,
    results: Sequence[Any] | None = None,
) -> Callable[[Callable], Callable]:
    """Record ``fn`` as the JAX lowering of each of ``ops`` (jax.Arrays in and out).

    ``promote``: PyTorch's promotion kind for the schema arguments ``args`` (their computation
    dtype, float32 for half precision, goes in; the result dtype comes out). ``opmath``: without
    ``promote``, float16/bfloat16 arguments among ``args`` (default: every positional tensor
    or scalar argument of the schema) are
    computed in float32 and float32 results cast back to their common dtype. ``results`` (with
    ``opmath``): one entry per schema result saying where a float32 result rounds to instead:
    ``None`` the common dtype; a dtype (``jnp.float32``: kept, e.g. a logsumexp); or the name
    of a schema argument: a tensor's dtype as passed (``"input"``: layer norm's output), a
    ``ScalarType`` argument's dtype when given (``"dtype"``: PyTorch casts the arguments to it
    first, and so does the wrapper), a ``bool`` argument's float32 when true
    (``"half_to_float"``). The name bound in the module is the lowering of ``ops[0]``, so a
    direct call promotes too.
    """

    def record(fn: Callable) -> Callable:
        present = _present(ops)
        if promote is None and not opmath and results is None:
            LOWERINGS.extend((op, fn) for op in present)
            return fn
        wrapped = [declared(op, fn, promote, args, opmath, results) for op in present]
        LOWERINGS.extend(zip(present, wrapped, strict=True))
        # (every op missing from this torch: the plain function, which no table holds)
        return wrapped[0] if wrapped else fn

    return record


def _present(ops: Sequence[Any]) -> list[Any]:
    """``ops`` less those the installed torch lacks (``_aten.Missing``), noted in ``MISSING``."""
    for op in ops:
        if isinstance(op, Missing) and op.name not in MISSING:
            MISSING.append(op.name)
    return [op for op in ops if not isinstance(op, Missing)]


def decomposition(*ops: Any) -> Callable[[Callable], Callable]:
    """Record a torch-level implementation of ``ops`` (torchlax Tensors in and out)."""

    def record(fn: Callable) -> Callable:
        for op in _present(ops):
            DECOMPOSITIONS.append((op, fn))
        return fn

    return record


def function(*torch_fns: Any) -> Callable[[Callable], Callable]:
    """Record a torch-level override of ``torch_fns`` (skipped while autograd records)."""

    def record(fn: Callable) -> Callable:
        for torch_fn in torch_fns:
            FUNCTIONS.append((torch_fn, fn))
        return fn

    return record


def named_lowering(*names: str) -> Callable[[Callable], Callable]:
    """Record ``fn`` as the JAX lowering of other libraries' ops, named ``"namespace::op"``."""

    def record(fn: Callable) -> Callable:
        for name in names:
            NAMED[name] = ("lowering", fn)
        return fn

    return record


def named_decomposition(*names: str) -> Callable[[Callable], Callable]:
    """Record a torch-level implementation of other libraries' ops, named ``"namespace::op"``."""

    def record(fn: Callable) -> Callable:
        for name in names:
            NAMED[name] = ("decomposition", fn)
        return fn

    return record
