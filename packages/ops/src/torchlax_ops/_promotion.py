"""PyTorch's type promotion for lowerings, declared with a decorator.

jnp promotes differently (weak types, int64 + float32 -> float64 under x64, ...). A lowering
declares which arguments take part and which of PyTorch's promotion kinds applies; the
decorator casts those arguments to the computation dtype and the result to PyTorch's result
dtype. Results are cached per (kind, argument dtypes/ranks, default dtype), so the hot path is
a dict lookup.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as Promotion
from torch._prims_common import elementwise_dtypes
from torchlax_core import DtypeNotImplementedError, UnsupportedDtypeError, jax_dtype, torch_dtype
from torchlax_core.internal import scalar_type_name

from ._aten import Missing
from ._recompute import recomputed

__all__ = [
    "HALF",
    "Promotion",
    "accumulator",
    "declared",
    "elementwise",
    "opmath_dtype",
    "result_dtypes",
    "to_jax_dtype",
    "up",
]

_cache: dict[tuple, tuple[np.dtype, np.dtype]] = {}
_ArrayImpl = type(jnp.zeros(()))
_placeholders: dict[tuple, torch.Tensor] = {}
_default_dtype = torch.get_default_dtype


def _signature(x):
    if isinstance(x, jax.Array | np.ndarray):
        return (x.dtype, x.ndim > 0)
    if isinstance(x, bool | int | float | complex):
        return type(x)
    if isinstance(x, np.generic):
        return (x.dtype, False)
    return None


def _placeholder(sig):
    if isinstance(sig, type):
        return sig(1)
    dtype, has_dims = sig
    key = (dtype, has_dims)
    t = _placeholders.get(key)
    if t is None:
        t = torch.empty((1,) if has_dims else (), dtype=torch_dtype(dtype), device="meta")
        _placeholders[key] = t
    return t


def result_dtypes(values: Sequence, kind: Promotion) -> tuple[np.dtype, np.dtype]:
    """(computation dtype, result dtype) as PyTorch computes them, as JAX dtypes."""
    sigs = tuple(s for s in map(_signature, values) if s is not None)
    # The default dtype takes part (int tensor * 1.5, int / int): torch.set_default_dtype must
    # not be answered from a cache filled under the previous default.
    key = (kind, sigs, _default_dtype())
    hit = _cache.get(key)
    if hit is None:
        compute, result = elementwise_dtypes(*map(_placeholder, sigs), type_promotion_kind=kind)
        hit = (jax_dtype(compute), jax_dtype(result))
        _cache[key] = hit
    return hit


def to_jax_dtype(dtype: torch.dtype | None):
    return None if dtype is None else jax_dtype(dtype)


def _cast(x, dtype):
    if isinstance(x, jax.Array | np.ndarray | np.generic):
        return x if x.dtype == dtype else x.astype(dtype)
    if isinstance(x, int) and not isinstance(x, bool) and jnp.issubdtype(dtype, jnp.integer):
        # Wrapped into the integer type as C casts it (uint8 + 1000 adds 232), as PyTorch does.
        return jnp.asarray(np.asarray(x, dtype=np.int64).astype(dtype))
    if isinstance(x, bool | int | float | complex):
        # A Python scalar joins the computation dtype exactly (no weak-type surprises).
        return jnp.asarray(x, dtype=dtype)
    return x


def elementwise(
    args: Sequence[str], kind: Promotion = Promotion.DEFAULT, *, cast_result: bool = True
) -> Callable[[Callable], Callable]:
    """Promote the named arguments (bound by ``fn``'s Python signature) as PyTorch does.

    Only for an op whose schema does not exist when the tables are built (``prims::fma``,
    defined once torch._inductor is imported): a lowering declares its promotion in its
    registration instead (``@lowering(op, promote=..., args=...)``), bound to the op's schema,
    and a helper of a registered op binds to that op's schema with ``declared``.
    The wrapped function sees them cast to the computation dtype (PyTorch's "opmath" dtype:
    float32 for half-precision inputs) and its result is cast to the result dtype.
    """

    def decorate(fn: Callable) -> Callable:
        params = list(inspect.signature(fn).parameters)
        pairs = tuple((params.index(a), a) for a in args)
        return _promoting(fn, pairs, kind, cast_result=cast_result, op=fn.__name__)

    return decorate


def declared(
    op: Any,
    fn: Callable,
    promote: Promotion | None,
    args: Sequence[str] | None,
    opmath: bool,
    results: Sequence[Any] | None = None,
) -> Callable:
    """``fn`` promoting the arguments ``args`` of ``op``'s schema as ``promote`` says, or (no
    ``promote``) computing half precision in float32 when ``opmath`` (pw_cast_for_opmath), each
    result rounding back as ``results`` says (see ``lowering``).

    Arguments are bound by the schema's names and positions, so the lowering's own parameter
    names do not matter; ``args`` defaults to every positional tensor or scalar argument.
    """
    if isinstance(op, Missing):  # not in this torch (skipped by the tables): no schema to bind
        return fn
    schema = _schema_of(op)
    names = [a.name for a in schema.arguments]
    if args is None:
        args = [a.name for a in schema.arguments if not a.kwarg_only and _is_value(a)]
    missing = [a for a in args if a not in names]
    if missing:
        raise ValueError(
            f"The lowering {fn.__name__} of {op} declares the arguments {missing}, which its "
            f"schema does not have ({', '.join(names)}): name the schema's arguments."
        )
    kwarg_only = {a.name for a in schema.arguments if a.kwarg_only}

    def position(name: str) -> int:
        # A keyword-only argument never arrives by position: give it a position no call reaches.
        return len(names) + 99 if name in kwarg_only else names.index(name)

    pairs = tuple((position(a), a) for a in args)
    if results is not None and (promote is not None or not opmath):
        raise ValueError(
            f"The lowering {fn.__name__} of {op} declares results= without opmath=True: "
            "results= says how opmath's float32 results round back; declare opmath=True."
        )
    if promote is not None:
        return _promoting(fn, pairs, promote, cast_result=True, op=str(op))
    if opmath:
        rules = None if results is None else _result_rules(op, fn, schema, results, position)
        return _in_opmath(fn, pairs, rules)
    return fn


# How a result of an opmath lowering rounds back (``_result_rules``): to the opmath arguments'
# common dtype, to a fixed dtype, or as a schema argument says.
_COMMON, _FIXED, _LIKE, _DTYPE, _FLOAT32_IF = range(5)


def _result_rules(op, fn, schema, results, position) -> tuple[tuple[int, Any, str | None], ...]:
    """(kind, fixed dtype or argument position, argument name) per schema result."""
    where = f"The lowering {fn.__name__} of {op}"
    if len(results) != len(schema.returns):
        raise ValueError(
            f"{where} declares {len(results)} results=, but its schema returns "
            f"{len(schema.returns)} values: give one entry (None for the default) per result."
        )
    # real_type: ScalarType, which .type reads as int.
    types = {a.name: str(a.real_type) for a in schema.arguments}
    rules = []
    for entry in results:
        if entry is None:
            rules.append((_COMMON, None, None))
        elif not isinstance(entry, str):
            rules.append((_FIXED, np.dtype(entry), None))
        elif types.get(entry) in ("Tensor", "Optional[Tensor]"):
            rules.append((_LIKE, position(entry), entry))
        elif types.get(entry) in ("ScalarType", "Optional[ScalarType]"):
            rules.append((_DTYPE, position(entry), entry))
        elif types.get(entry) == "bool":
            rules.append((_FLOAT32_IF, position(entry), entry))
        else:
            raise ValueError(
                f"{where} declares the result rule {entry!r}, which is not one of its schema's "
                f"tensor, ScalarType or bool arguments ({', '.join(types)}): name one of them, "
                "give a dtype, or None."
            )
    return tuple(rules)


_VALUE_TYPES = {"Tensor", "Optional[Tensor]", "number", "Optional[number]"}


def _is_value(argument) -> bool:
    """A tensor or scalar argument: what PyTorch's promotion reads by default."""
    return str(argument.type) in _VALUE_TYPES


def _schema_of(op: Any) -> torch.FunctionSchema:
    if isinstance(op, torch._ops.OpOverloadPacket):
        # A packet's lowering serves every overload; they share their leading arguments.
        return getattr(op, op.overloads()[0])._schema
    return op._schema


def _promoting(
    fn: Callable,
    pairs: tuple[tuple[int, str], ...],
    kind: Promotion,
    *,
    cast_result: bool,
    op: str,
) -> Callable:
    # Per lowering: (dtype, has-dims) of each promoted array -> (compute, result). The hot
    # path is then one tuple and one dict lookup for the common all-arrays call.
    fast_cache: dict[tuple, tuple[np.dtype, np.dtype]] = {}

    @functools.wraps(fn)
    def promoted(*call_args, **call_kwargs):
        n_args = len(call_args)
        values = [call_args[p] if p < n_args else call_kwargs.get(n) for p, n in pairs]
        try:
            if all(type(v) is _ArrayImpl for v in values):
                key = (_default_dtype(), *((v.dtype, v.ndim != 0) for v in values))  # pyright: ignore[reportOptionalMemberAccess]  (all arrays: checked on the line above)
                hit = fast_cache.get(key)
                if hit is None:
                    hit = fast_cache[key] = result_dtypes(values, kind)
                compute, result = hit
            else:
                compute, result = result_dtypes(values, kind)
        except UnsupportedDtypeError as exc:
            raise _not_implemented(op, exc) from None
        if compute == _FLOAT32 and any(
            isinstance(v, jax.Array) and v.dtype in HALF for v in values
        ):
            # Half precision computed in float32: JAX's autodiff keeps the half arguments and
            # recomputes the float32 part (_recompute), as PyTorch keeps half tensors.
            return recomputed(run, compute, result, *call_args, **call_kwargs)
        return run(compute, result, *call_args, **call_kwargs)

    def run(compute, result, *call_args, **call_kwargs):
        n_args = len(call_args)
        call_args = list(call_args)
        for p, n in pairs:
            v = call_args[p] if p < n_args else call_kwargs.get(n)
            # (not getattr(v, "dtype", None) == compute: numpy reads None as float64)
            if isinstance(v, jax.Array) and v.dtype == compute:
                continue
            if p < n_args:
                call_args[p] = _cast(v, compute)
            elif n in call_kwargs:
                call_kwargs[n] = _cast(v, compute)
        out = fn(*call_args, **call_kwargs)
        if cast_result and isinstance(out, jax.Array) and out.dtype != result:
            out = out.astype(result)
        return out

    promoted.promotion = (tuple(n for _, n in pairs), kind)  # pyright: ignore[reportAttributeAccessIssue]  (a marker attribute on the wrapper)
    return promoted


def _not_implemented(op: str, exc: UnsupportedDtypeError) -> DtypeNotImplementedError:
    """PyTorch's "not implemented for 'ComplexHalf'" for an op whose promoted dtype JAX lacks
    (float16/bfloat16 with a complex number gives complex32)."""
    dtype = exc.dtype
    if dtype is None:  # (a JAX dtype torch lacks: not a promotion's result)
        return DtypeNotImplementedError(f'"{op}": {exc}')
    name = scalar_type_name(dtype)
    return DtypeNotImplementedError(
        f'"{op}" not implemented for {name!r} on the jax device: its inputs promote to {dtype}, '
        "which JAX cannot represent. Convert an input to a wider dtype first "
        "(for complex32: x.to(torch.complex64))."
    )


HALF = (np.dtype(jnp.float16), np.dtype(jnp.bfloat16))
_FLOAT32 = np.dtype(jnp.float32)
_ARRAYS = (jax.Array, np.ndarray, np.generic)


def opmath_dtype(dtype):
    """PyTorch's opmath dtype (``at::opmath_type``): float32 for half precision, else ``dtype``."""
    return np.dtype(jnp.float32) if dtype in HALF else dtype


def accumulator(dtype) -> np.dtype | None:
    """The ``preferred_element_type`` of a product or convolution of ``dtype`` operands:
    float32 for half precision (PyTorch's kernels accumulate in it and round once), else None
    (the operands' own dtype)."""
    return np.dtype(jnp.float32) if dtype in HALF else None


def up(x: Any) -> Any:
    """``x`` in its opmath dtype (arrays only; anything else as it is)."""
    return x.astype(jnp.float32) if isinstance(x, _ARRAYS) and x.dtype in HALF else x


def _in_opmath(
    fn: Callable,
    pairs: tuple[tuple[int, str], ...],
    rules: tuple[tuple[int, Any, str | None], ...] | None = None,
) -> Callable:
    """PyTorch's pw_cast_for_opmath: float16/bfloat16 arguments computed in float32, float32
    results cast back to the arguments' common dtype when that is half precision, or where
    ``rules`` (``_result_rules``) says."""
    # A ScalarType rule is PyTorch's dtype= argument: the arguments are cast to it first.
    dtype_at = next(((p, n) for kind, p, n in rules or () if kind == _DTYPE), None)

    @functools.wraps(fn)
    def in_opmath(*call_args, **call_kwargs):
        n_args = len(call_args)

        def argument(p, n):
            return call_args[p] if p < n_args else call_kwargs.get(n)

        values = [argument(p, n) for p, n in pairs]
        call_args = list(call_args)
        if dtype_at is not None and (dtype := argument(*dtype_at)) is not None:
            values = [_cast(v, jax_dtype(dtype)) if isinstance(v, jax.Array) else v for v in values]
            _replace(call_args, call_kwargs, pairs, values)
        dtypes = [v.dtype for v in values if isinstance(v, jax.Array)]
        if not any(d in HALF for d in dtypes):  # nothing in half precision: as written
            return fn(*call_args, **call_kwargs)
        common = jnp.result_type(*dtypes)
        targets = None
        if rules is not None:
            targets = [_target(rule, argument, values, pairs, common) for rule in rules]

        def compute(*args, **kwargs):
            args = list(args)
            ups = [up(args[p] if p < len(args) else kwargs.get(n)) for p, n in pairs]
            _replace(args, kwargs, pairs, ups)
            return _round(fn(*args, **kwargs), common, targets)

        # The up-cast, the computation and the rounding under one checkpoint: JAX's autodiff
        # then keeps the half-precision arguments, not float32 intermediates (_recompute).
        return recomputed(compute, *call_args, **call_kwargs)

    in_opmath.opmath = tuple(n for _, n in pairs)  # pyright: ignore[reportAttributeAccessIssue]  (a marker attribute on the wrapper)
    return in_opmath


def _round(out, common, targets):
    """An opmath lowering's float32 results rounded back: to ``common`` when that is half
    precision, or to each result's target (``_target``)."""
    if targets is None:
        if common not in HALF:
            return out
        if isinstance(out, tuple | list):
            return type(out)(_down(o, common) for o in out)
        return _down(out, common)
    if isinstance(out, tuple | list):
        return type(out)(_down(o, t) for o, t in zip(out, targets, strict=True))
    return _down(out, targets[0])


def _replace(call_args: list, call_kwargs: dict, pairs, values) -> None:
    for (p, n), v in zip(pairs, values, strict=True):
        if p < len(call_args):
            call_args[p] = v
        elif n in call_kwargs:
            call_kwargs[n] = v


def _target(rule, argument, values, pairs, common):
    """The dtype one result rounds back to (only a half dtype rounds; see ``_down``)."""
    kind, at, name = rule
    if kind == _FIXED:
        return at
    if kind != _COMMON:
        given = argument(at, name)
        if kind == _LIKE and isinstance(given, jax.Array):
            # The argument as the call passed it (before the up-cast), maybe cast to dtype=.
            cast = dict(zip((n for _, n in pairs), values)).get(name, given)
            return cast.dtype if cast is not None else common
        if kind == _DTYPE and given is not None:
            return jax_dtype(given)
        if kind == _FLOAT32_IF and given:
            return np.dtype(jnp.float32)
    return common


def _down(x, dtype):
    """A float32 result rounded to ``dtype`` when that is half precision; else as it is."""
    if isinstance(x, jax.Array) and x.dtype == jnp.float32 and dtype in HALF:
        return x.astype(dtype)
    return x
