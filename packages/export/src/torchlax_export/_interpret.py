"""Run an exported (Core ATen) FX graph on jax.Arrays through the torchlax registry.

Each ``call_function`` node is an ATen op, a higher-order op (``cond``, ``while_loop``,
``scan``, ``map_impl``) or Python arithmetic on symbolic sizes. ATen ops go to the lowering
the registry holds for them, called on jax.Arrays directly; this keeps JAX symbolic
dimensions (dynamic shapes) intact, which a ``torch.Tensor`` could not hold. Ops the registry
implements only as torch-level decompositions run on torchlax Tensors (static shapes only).
Higher-order ops become ``jax.lax.cond`` / ``while_loop`` / ``scan`` / ``map`` over the
interpretation of their subgraphs.
"""

from __future__ import annotations

import builtins
import math
import operator
from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.fx.node
import torch.utils._pytree
import torchlax_core
from torch import fx

from ._errors import ExportError, UnsupportedOpError

aten = torch.ops.aten

# Runtime assertions torch.export leaves in the graph: shapes were already checked by tracing,
# and JAX checks the symbolic-shape constraints of the exported program itself.
NO_OPS = {
    aten._assert_scalar.default,
    aten._assert_tensor_metadata.default,
    aten.sym_constrain_range.default,
    aten.sym_constrain_range_for_size.default,
    aten._assert_async.default,
    aten._assert_async.msg,
}


def _to_copy(
    x,
    *,
    dtype=None,
    layout=None,
    device=None,
    pin_memory=None,
    non_blocking=False,
    memory_format=None,
):
    # Inside an exported program a device move is meaningless; only the dtype cast remains.
    return x if dtype is None else x.astype(torchlax_core.jax_dtype(dtype))


# Ops the registry implements at the torch level (they move data between torch and JAX) that
# an exported program needs as plain JAX functions, symbolic shapes included.
PROGRAM_OPS: dict[Any, Callable] = {aten._to_copy.default: _to_copy}

SIZE_OPS: dict[Any, Callable] = {
    aten.sym_size.int: lambda x, dim: x.shape[dim],
    aten.sym_numel.default: lambda x: math.prod(x.shape),
}

# Python-level functions on sizes (SymInt arithmetic) that torch.export records as nodes.
_PYTHON_FUNCTIONS = {
    getattr(operator, name)
    for name in (
        "getitem",
        "add",
        "sub",
        "mul",
        "floordiv",
        "truediv",
        "mod",
        "pow",
        "neg",
        "pos",
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
        "and_",
        "or_",
        "not_",
        "abs",
    )
} | {
    math.ceil,
    math.floor,
    math.sqrt,
    builtins.max,
    builtins.min,
    torch.sym_float,
    torch.sym_int,
    torch.sym_not,
    torch.sym_ite,
}

_SYM_MAX_MIN = {torch.sym_max: builtins.max, torch.sym_min: builtins.min}

_HIGHER_ORDER = ("cond", "while_loop", "scan", "map_impl", "invoke_subgraph")


def _higher_order_name(target) -> str | None:
    if isinstance(target, torch._ops.HigherOrderOperator):
        return target.name()
    return None


def graph_modules(root: fx.GraphModule) -> Iterable[fx.GraphModule]:
    """The graph and the subgraphs of its higher-order ops."""
    return (m for m in root.modules() if isinstance(m, fx.GraphModule))


def _lowerable(env, op: torch._ops.OpOverload) -> bool:
    """Whether the registry runs ``op`` in a traced program: a lowering or decomposition, or
    an implementation a plugin gives by the op's name (other libraries' ops: torchvision's,
    transformers' ``grouped_mm_fallback``), as the eager path and ``torchlax.jit`` run it."""
    entry = env.lowering_for(op)
    if entry is not None and entry.kind in ("lowering", "decomposition"):
        return True
    return env.plugin_fallback_for(op) is not None


def check_lowerable(root: fx.GraphModule, env) -> None:
    """Raise ``UnsupportedOpError`` naming every op of the program the registry cannot run."""
    missing: dict[str, Any] = {}
    for gm in graph_modules(root):
        for node in gm.graph.nodes:
            if node.op != "call_function":
                continue
            target = node.target
            if isinstance(target, torch._ops.OpOverload):
                if target in NO_OPS or target in SIZE_OPS or target in PROGRAM_OPS:
                    continue
                if not _lowerable(env, target):
                    missing[str(target)] = target
            elif isinstance(target, torch._ops.HigherOrderOperator):
                if target.name() not in _HIGHER_ORDER:
                    missing[f"torch.ops.higher_order.{target.name()}"] = target
            elif target not in _PYTHON_FUNCTIONS and target not in _SYM_MAX_MIN:
                missing[getattr(target, "__qualname__", repr(target))] = target
    if missing:
        raise UnsupportedOpError(_missing_message(missing), ops=list(missing.values()))


def _missing_message(missing: dict[str, Any]) -> str:
    lines = [f"torchlax-export cannot lower {len(missing)} op(s) of this program to JAX:"]
    for name, op in missing.items():
        schema = getattr(op, "_schema", None)
        lines.append(f"  {name}" + (f"   ({schema})" if schema is not None else ""))
    first = (
        next(name for name, op in missing.items() if isinstance(op, torch._ops.OpOverload))
        if any(isinstance(op, torch._ops.OpOverload) for op in missing.values())
        else None
    )
    if first is not None:
        lines += [
            "Register a JAX lowering for each before exporting, for example:",
            "",
            "    import sys, torchlax_core",
            "",
            "    @torchlax_core.hookimpl",
            "    def torchlax_register_lowerings(registry):",
            f"        registry.register_lowering(torch.ops.{first}, my_jax_function)",
            "",
            "    torchlax_core.default_env().register_plugin(sys.modules[__name__])",
            "",
            "my_jax_function receives the op's arguments in schema order with every tensor as a "
            "jax.Array and returns jax.Arrays (or ship the plugin through the 'torchlax' entry "
            "point). The CPU fallback (fallback_to_torch) cannot be exported: an artifact runs "
            "without PyTorch.",
        ]
    else:
        lines.append("These constructs are not supported by torchlax-export.")
    return "\n".join(lines)


def _normalize(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Pass non-kwarg-only arguments by position, as ``__torch_dispatch__`` would."""
    if not kwargs:
        return args, kwargs
    schema_args = op._schema.arguments
    positional = [a for a in schema_args if not a.kwarg_only]
    if not any(a.name in kwargs for a in positional[len(args) :]):
        return args, kwargs
    kwargs = dict(kwargs)
    filled = list(args)
    for a in positional[len(filled) :]:
        if a.name in kwargs:
            filled.append(kwargs.pop(a.name))
        elif any(b.name in kwargs for b in positional[len(filled) + 1 :]):
            filled.append(a.default_value)
        else:
            break
    return tuple(filled), kwargs


def _is_array(x) -> bool:
    return isinstance(x, jax.Array | np.ndarray)


class Interpreter:
    """Evaluates FX graphs on jax values; call inside ``torchlax_core.enable(env)`` and x64."""

    def __init__(self, env):
        self.env = env
        self._impls: dict[Any, Callable] = {}

    def run(self, gm: fx.GraphModule, inputs) -> Any:
        values: dict[fx.Node, Any] = {}
        inputs = iter(inputs)
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                values[node] = next(inputs)
            elif node.op == "get_attr":
                obj = gm
                for part in node.target.split("."):
                    obj = getattr(obj, part)
                values[node] = obj
            elif node.op == "call_function":
                args = torch.fx.node.map_arg(node.args, values.__getitem__)
                kwargs = torch.fx.node.map_arg(node.kwargs, values.__getitem__)
                values[node] = self.call(node, args, kwargs)
            elif node.op == "output":
                return torch.fx.node.map_arg(node.args[0], values.__getitem__)
            else:
                raise ExportError(f"torchlax-export cannot run FX node {node.format_node()}.")
        raise ExportError("The exported graph has no output node.")

    def call(self, node: fx.Node, args: tuple, kwargs: dict) -> Any:
        target = node.target
        name = _higher_order_name(target)
        if name is not None:
            return getattr(self, f"_hop_{name}")(*args, **kwargs)
        if isinstance(target, torch._ops.OpOverload):
            if target in NO_OPS:
                return None
            if target in SIZE_OPS:
                return SIZE_OPS[target](*args, **kwargs)
            args, kwargs = _normalize(target, args, kwargs)
            try:
                out = self._impl(target)(*args, **kwargs)
            except Exception as exc:
                if not _inconclusive(exc):
                    raise
                raise ExportError(
                    f"The torchlax lowering of {target} (node {node.name}) cannot handle a "
                    f"symbolic dimension: {str(exc).splitlines()[0]}. Export with that dimension "
                    "static, or make the lowering shape-polymorphic (no int() or Python "
                    "comparisons on sizes)."
                ) from exc
            _check_result(node, out)
            return out
        if target in _SYM_MAX_MIN:
            target = _SYM_MAX_MIN[target]  # pyright: ignore[reportArgumentType]  (a call_function node's target is a callable)
        try:
            return target(*args, **kwargs)  # pyright: ignore[reportCallIssue]  (a call_function node's target is a callable)
        except Exception as exc:
            if not _inconclusive(exc):
                raise
            # A comparison of symbolic sizes (e.g. the predicate of torch.cond on x.shape[0])
            # is decided at run time: compute it on arrays.
            return target(*[_dim_as_array(a) for a in args], **kwargs)  # pyright: ignore[reportCallIssue]  (a call_function node's target is a callable)

    def _impl(self, op) -> Callable:
        impl = self._impls.get(op)
        if impl is None:
            entry = self.env.lowering_for(op)
            if op in PROGRAM_OPS and (entry is None or entry.kind != "lowering"):
                impl = PROGRAM_OPS[op]
            elif entry is not None and entry.kind == "lowering":
                impl = entry.fn
            else:
                impl = self._torch_level(op)
            self._impls[op] = impl
        return impl

    def _torch_level(self, op) -> Callable:
        """Run ``op`` on torchlax Tensors (a torch-level decomposition of the registry)."""
        env = self.env

        def wrap(x):
            if not isinstance(x, jax.Array):
                return x
            try:
                return torchlax_core.Tensor(x)
            except TypeError:
                raise ExportError(
                    f"{op} has only a torch-level decomposition in the torchlax registry, which "
                    f"cannot run on the symbolic shape {x.shape}. Register a JAX lowering for "
                    f"{op} (registry.register_lowering) to export it with dynamic shapes."
                ) from None

        def run(*args, **kwargs):
            targs, tkwargs = torch.utils._pytree.tree_map(wrap, (args, kwargs))
            with torch.no_grad():
                out = env.dispatch(op, targs, tkwargs)
            return torch.utils._pytree.tree_map(
                lambda t: t.jax() if isinstance(t, torchlax_core.Tensor) else t, out
            )

        return run

    # -- higher-order ops -----------------------------------------------------------------------

    def _subgraph(self, gm, static_positions: dict[int, Any], n: int):
        """A function of the array operands of ``gm`` (static ones, such as sizes, closed over)."""

        def call(*arrays):
            arrays = iter(arrays)
            operands = [
                static_positions[i] if i in static_positions else next(arrays) for i in range(n)
            ]
            out = self.run(gm, operands)
            return tuple(out) if isinstance(out, list | tuple) else (out,)

        return call

    @staticmethod
    def _split(values) -> tuple[dict[int, Any], list]:
        static = {i: v for i, v in enumerate(values) if not _is_array(v)}
        arrays = [v for v in values if _is_array(v)]
        return static, arrays

    def _hop_cond(self, pred, true_gm, false_gm, operands):
        operands = tuple(operands)
        static, arrays = self._split(operands)
        branches = [self._subgraph(g, static, len(operands)) for g in (true_gm, false_gm)]
        if not _is_array(pred):  # a Python (or symbolic-size) bool known at export time
            return branches[0 if bool(pred) else 1](*arrays)
        return jax.lax.cond(jnp.asarray(pred).reshape(()), *branches, *arrays)

    def _hop_while_loop(self, cond_gm, body_gm, carried, additional):
        carried, additional = tuple(carried), tuple(additional)
        if not all(_is_array(c) for c in carried):
            raise ExportError("torch.while_loop with non-tensor carried values cannot be exported.")
        n = len(carried) + len(additional)
        static, extra = self._split((None,) * len(carried) + additional)
        static = {i: v for i, v in static.items() if i >= len(carried)}
        cond_fn = self._subgraph(cond_gm, static, n)
        body_fn = self._subgraph(body_gm, static, n)

        def keep_types(new, old):  # the carry must keep its exact dtype (weak types aside)
            return tuple(jnp.asarray(a, dtype=o.dtype) for a, o in zip(new, old, strict=True))

        init = tuple(carried)
        return jax.lax.while_loop(
            lambda c: jnp.asarray(cond_fn(*c, *extra)[0]).reshape(()),
            lambda c: keep_types(body_fn(*c, *extra), c),
            init,
        )

    def _hop_scan(self, combine_gm, init, xs, additional):
        init, xs, additional = tuple(init), tuple(xs), tuple(additional)
        n_carry = len(init)
        static, extra = self._split(additional)
        offset = n_carry + len(xs)
        static = {i + offset: v for i, v in static.items()}
        body = self._subgraph(combine_gm, static, offset + len(additional))

        def step(carry, x):
            out = body(*carry, *x, *extra)
            new = tuple(
                jnp.asarray(a, dtype=c.dtype) for a, c in zip(out[:n_carry], carry, strict=True)
            )
            return new, tuple(out[n_carry:])

        carry, ys = jax.lax.scan(step, init, xs)
        return (*carry, *ys)

    def _hop_map_impl(self, body_gm, xs, args):
        xs, args = tuple(xs), tuple(args)
        static, extra = self._split(args)
        static = {i + len(xs): v for i, v in static.items()}
        body = self._subgraph(body_gm, static, len(xs) + len(args))
        return jax.lax.map(lambda x: body(*x, *extra), xs)

    def _hop_invoke_subgraph(self, gm, identifier, *operands):
        return self.run(gm, operands)


def _inconclusive(exc: BaseException) -> bool:
    return any(c.__name__ == "InconclusiveDimensionOperation" for c in type(exc).__mro__)


def _dim_as_array(value):
    if isinstance(value, int | float | bool) or _is_array(value) or value is None:
        return value
    return jnp.asarray(value)  # a symbolic dimension becomes a (run-time) int array


def _check_result(node: fx.Node, out) -> None:
    """A lowering must produce exactly PyTorch's dtypes; a mismatch would be a wrong answer."""
    expected = node.meta.get("val")
    if isinstance(expected, torch.Tensor):
        _check_one(node, expected, out)
    elif isinstance(expected, list | tuple) and isinstance(out, list | tuple):
        # Only the results the program reads matter (eval-mode batch norm's unused statistics
        # may differ in shape from PyTorch's empty ones without changing any answer).
        used = {user.args[1] for user in node.users if user.target is operator.getitem}  # pyright: ignore[reportUnhashable]  (getitem's index is an int)
        for i, (e, o) in enumerate(zip(expected, out, strict=False)):
            if i in used and isinstance(e, torch.Tensor):
                _check_one(node, e, o)


def _check_one(node, expected: torch.Tensor, out) -> None:
    if not hasattr(out, "dtype"):
        return
    want = torchlax_core.jax_dtype(expected.dtype)
    if out.dtype != want:
        raise ExportError(
            f"The torchlax lowering of {node.target} returned dtype {out.dtype} where PyTorch "
            f"produces {expected.dtype} (node {node.name}); exporting would give wrong results. "
            "Fix that lowering (its plugin) or report it."
        )
    if len(out.shape) != expected.dim() or any(
        isinstance(e, int) and isinstance(o, int) and e != o
        for e, o in zip(expected.shape, out.shape, strict=True)
    ):
        raise ExportError(
            f"The torchlax lowering of {node.target} returned shape {tuple(out.shape)} where "
            f"PyTorch produces {tuple(expected.shape)} (node {node.name}). Fix that lowering."
        )
