"""``_foreach_*`` ops (what ``torch.optim`` runs on the ``jax`` device): one op per list element.

Each overload is a decomposition that maps the per-tensor ATen op over its lists, so promotion,
broadcasting and the in-place write all come from that op. ``Tensor[]`` and ``Scalar[]``
arguments are zipped; a single ``Tensor``/``Scalar`` is shared by every element. In-place
overloads (``_foreach_add_``) call the per-tensor in-place op (``add_``), or compute the
functional result and ``copy_`` it where ATen has no in-place form (``maximum``).
"""

from __future__ import annotations

import functools

import torch

from .. import _aten
from .._table import decomposition, named, op_name

aten = _aten.aten  # (an op this torch lacks: a Missing, skipped)

# Per-tensor op for each foreach base name whose ATen name differs or needs argument surgery.
_SCALAR_FORM = {"maximum": "clamp_min", "minimum": "clamp_max"}
_VALUE_KWARG = {"addcdiv", "addcmul"}  # their 4th argument is addc*'s kwarg-only ``value``
_LIST_TYPES = ("List[Tensor]", "List[number]")  # Tensor[] and Scalar[] in schema syntax


def _norm(t, ord=2, dtype=None):
    return aten.linalg_vector_norm(t, ord, dtype=dtype)


def _powsum(t, ord=2, dtype=None):
    return aten.sum(aten.pow(aten.abs(t), ord), dtype=dtype)


def _copy(self, src, non_blocking=False):
    return aten.clone(self).copy_(src, non_blocking)


_SPECIAL = {
    "norm": _norm,
    "powsum": _powsum,
    "max": lambda t: aten.max.default(t),
    "zero": lambda t: aten.zeros_like(t),
    "copy": _copy,
}


def _element_args(schema, args, kwargs, i):
    """The positional and keyword arguments of element ``i``'s per-tensor call."""
    positional, keywords = [], {}
    for position, arg in enumerate(schema.arguments):
        if arg.kwarg_only:
            if arg.name in kwargs:
                keywords[arg.name] = kwargs[arg.name]
            continue
        value = args[position] if position < len(args) else kwargs.get(arg.name, arg.default_value)
        type_ = str(arg.type)
        if type_ in _LIST_TYPES:
            value = value[i]
        elif arg.name == "scalars" and isinstance(value, torch.Tensor):
            # addcdiv/addcmul.Tensor: a 1-d tensor holding one scalar per element.
            value = value[i].item()
        positional.append(value)
    return positional, keywords


def _per_element(base: str, schema):
    """``fn(positional, keywords)`` running the per-tensor op for one element."""
    if base in _SPECIAL:
        special = _SPECIAL[base]
        return lambda positional, keywords: special(*positional, **keywords)
    kinds = [str(a.type) for a in schema.arguments if not a.kwarg_only]
    name = base
    if base in _SCALAR_FORM and len(kinds) > 1 and kinds[1] in ("number", "List[number]"):
        name = _SCALAR_FORM[base]
    packet = getattr(aten, name)
    if base in _VALUE_KWARG and len(kinds) == 4:
        return lambda positional, keywords: packet(*positional[:3], value=positional[3], **keywords)
    return lambda positional, keywords: packet(*positional, **keywords)


def _length(schema, args):
    for position, arg in enumerate(schema.arguments):
        if str(arg.type) == "List[Tensor]" and position < len(args):
            return len(args[position])
    raise RuntimeError(f"{schema.name}: no tensor list argument.")


def _functional(op):
    schema = op._schema
    base = schema.name.split("::")[1][len("_foreach_") :]
    element = _per_element(base, schema)

    def run(*args, **kwargs):
        return [
            element(*_element_args(schema, args, kwargs, i)) for i in range(_length(schema, args))
        ]

    return named(op_name(op), run)


def _inplace(op):
    schema = op._schema
    base = schema.name.split("::")[1][len("_foreach_") : -1]
    inplace_packet = getattr(aten, base + "_", None)
    if base == "copy":

        def run(self, src, non_blocking=False):  # pyright: ignore[reportRedeclaration]  (one definition per branch)
            for dst, s in zip(self, src, strict=True):
                dst.copy_(s, non_blocking)

        return named(op_name(op), run)
    if inplace_packet is None or base in _SCALAR_FORM or base in _SPECIAL:
        functional = _functional(getattr(getattr(aten, "_foreach_" + base), op._overloadname))

        def run(*args, **kwargs):
            for dst, value in zip(args[0], functional(*args, **kwargs), strict=True):
                dst.copy_(value)

        return named(op_name(op), run)
    if base in _VALUE_KWARG and len([a for a in schema.arguments if not a.kwarg_only]) == 4:

        def element(positional, keywords):
            inplace_packet(*positional[:3], value=positional[3], **keywords)
    else:

        def element(positional, keywords):
            inplace_packet(*positional, **keywords)

    def run(*args, **kwargs):
        for i in range(len(args[0])):
            element(*_element_args(schema, args, kwargs, i))

    return named(op_name(op), run)


@functools.cache
def _foreach_overloads():
    found = []
    for schema in torch._C._jit_get_all_schemas():
        name = schema.name
        if not name.startswith("aten::_foreach_") or any(a.is_out for a in schema.arguments):
            continue
        packet = getattr(aten, name.split("::")[1])
        found.append(getattr(packet, schema.overload_name or "default"))
    return found


for _op in _foreach_overloads():
    _is_inplace = _op._schema.name.endswith("_")
    decomposition(_op)(_inplace(_op) if _is_inplace else _functional(_op))
