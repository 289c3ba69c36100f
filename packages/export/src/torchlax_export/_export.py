"""``export``: a PyTorch module or function to an ``Artifact`` (StableHLO + weights).

Steps: ``torch.export.export`` traces the program; ``run_decompositions`` lowers it to the Core
ATen opset, keeping the ops the torchlax registry lowers directly (and decomposing further,
with ``torch._decomp``, any op it lacks); ``_interpret.Interpreter`` runs the graph on
jax.Arrays inside ``jax.export.export(jax.jit(...))``, with parameters, buffers and constants
as inputs rather than baked constants.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import inspect
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
import torch
import torch._decomp
import torchlax_core
from torch.export import ExportedProgram
from torch.export.graph_signature import (
    ConstantArgument,
    InputKind,
    OutputKind,
    TensorArgument,
)
from torch.utils import _pytree as pytree
from torchlax_core.internal import CompiledProgram

from . import _interpret
from ._artifact import FORMAT, FORMAT_VERSION, Artifact
from ._errors import ExportError


def _function_module(fn: Callable) -> torch.nn.Module:
    """Lets ``torch.export`` (which takes modules) export a plain function, keeping its names."""

    class FunctionModule(torch.nn.Module):
        def forward(self, *args, **kwargs):
            return fn(*args, **kwargs)

    try:
        signature = inspect.signature(fn)
        me = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        FunctionModule.forward.__signature__ = signature.replace(
            parameters=[me, *signature.parameters.values()]
        )
    except (TypeError, ValueError):  # a builtin without a signature: generic names
        pass
    FunctionModule.__name__ = getattr(fn, "__name__", "FunctionModule")
    return FunctionModule()


def export(
    module_or_fn: torch.nn.Module | Callable,
    args: tuple,
    kwargs: dict | None = None,
    dynamic_shapes: Any = None,
    *,
    platforms: tuple[str, ...] | None = None,
    strict: bool = False,
    progress: bool | Callable[[str], None] = False,
) -> Artifact:
    """Export a PyTorch program to an ``Artifact`` that runs with JAX alone.

    ``args``/``kwargs`` are example inputs (CPU tensors). ``dynamic_shapes`` is passed to
    ``torch.export.export``: each ``torch.export.Dim`` becomes a JAX symbolic dimension of the
    same name and range, so one artifact serves every size in that range. The module is
    exported in its current mode: in train mode the new values of mutated buffers (BatchNorm
    running statistics) are outputs of the program. ``platforms`` (default: JAX's default
    backend) selects what the StableHLO is lowered for, e.g. ``("cpu", "cuda")``. ``progress``
    prints each slow step with its time to stderr (or passes the lines to a callable).
    """
    report = _reporter(progress)
    module = (
        module_or_fn
        if isinstance(module_or_fn, torch.nn.Module)
        else _function_module(module_or_fn)
    )
    args = tuple(args) if isinstance(args, list | tuple) else (args,)
    kwargs = dict(kwargs or {})
    env = torchlax_core.default_env()
    _check_on_cpu(module, args, kwargs)

    with _step(report, "torch.export"):
        ep = torch.export.export(module, args, kwargs, dynamic_shapes=dynamic_shapes, strict=strict)
    with _step(report, "decomposing to Core ATen"):
        ep = _decompose(ep, env)
    _interpret.check_lowerable(ep.graph_module, env)
    plan = _Plan(ep, _dim_names(module, args, kwargs, dynamic_shapes, ep))

    interpreter = _interpret.Interpreter(env)

    def program(_static, *flat):
        weights = flat[: len(plan.weights)]
        inputs = flat[len(plan.weights) :]
        outputs = interpreter.run(ep.graph_module, plan.placeholder_values(weights, inputs))
        return plan.split_outputs(outputs), None

    # The compiled-program core (shared with torchlax.jit and torch.compile) gives the key
    # input: raw uint32 key data, so the artifact runs with JAX alone; random ops split their
    # keys from it, never from a baked key.
    compiled = CompiledProgram("torchlax.export", program, key_data=True, env=env)
    avals = plan.avals()
    random_ops, custom_ops = _randomness(ep)
    with _step(report, "lowering to StableHLO"), torchlax_core.enable(env):
        # Only a program that draws random numbers takes a key. Seeded ATen ops (some are only
        # tagged so, as `empty`) and custom ops (whose lowering may draw keys without torch
        # knowing) may: trace once to learn whether it draws one.
        rng_used = (random_ops or custom_ops) and compiled.entry("export", avals).random
        jitted = compiled.jitted(with_key=rng_used)
        key_aval = jax.ShapeDtypeStruct(compiled.key_input().shape, np.uint32)
        exported = jax.export.export(jitted, platforms=platforms)(
            *avals, *([key_aval] if rng_used else [])
        )
    manifest = plan.manifest(exported, rng_used)
    return Artifact(exported, plan.weight_values, manifest)


# -- steps --------------------------------------------------------------------------------------


def _check_on_cpu(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
    """torch.export traces CPU (or meta) tensors; torchlax Tensors must come back first."""
    named = [*module.named_parameters(), *module.named_buffers()]
    named += [(f"input {i}", t) for i, t in enumerate(pytree.tree_leaves((args, kwargs)))]
    for name, tensor in named:
        if isinstance(tensor, torch.Tensor) and tensor.device.type == "jax":
            raise ExportError(
                f"{name} is a torchlax Tensor (device {tensor.device}); torch.export traces CPU "
                "tensors. Export a CPU copy (e.g. copy.deepcopy(model).cpu(), x.cpu()): the "
                "artifact runs on JAX anyway."
            )


def _reporter(progress: bool | Callable[[str], None]) -> Callable[[str], None] | None:
    if callable(progress):
        return progress
    if progress:
        return lambda line: print(line, file=sys.stderr, flush=True)
    return None


@contextlib.contextmanager
def _step(report, what: str) -> Iterator[None]:
    if report is None:
        yield
        return
    report(f"torchlax-export: {what} ...")
    start = time.perf_counter()
    yield
    report(f"torchlax-export: {what} done in {time.perf_counter() - start:.1f} s")


def _direct_lowering(env, op) -> bool:
    entry = env.lowering_for(op)
    return entry is not None and entry.kind == "lowering"


def _decompose(ep: ExportedProgram, env) -> ExportedProgram:
    table = torch.export.default_decompositions()
    for op in list(table.keys()):
        # Keep what the registry lowers in one piece: one lowering beats a chain of small ops.
        if (
            isinstance(op, torch._ops.OpOverload)
            and not op._schema.is_mutable
            and _direct_lowering(env, op)
        ):
            del table[op]
    ep = ep.run_decompositions(table)
    # Ops without a direct JAX lowering (none at all, or only a torch-level decomposition, which
    # cannot run on symbolic shapes) may decompose with torch._decomp into ops that have one.
    # Keep a decomposition only if it leaves the program better off: refs that decompose into
    # prims, which the registry rarely lowers, are dropped.
    for _ in range(3):
        before = _lowering_gaps(ep, env)
        extra = {
            op: torch._decomp.decomposition_table[op]
            for op in before[1]
            if op in torch._decomp.decomposition_table
        }
        if not extra:
            break
        improved = _try_decompose(ep, env, extra, before)
        if improved is None and len(extra) > 1:
            for op, fn in extra.items():
                improved = _try_decompose(ep, env, {op: fn}, before) or improved
                if improved is not None:
                    ep, before = improved, _lowering_gaps(improved, env)
            break
        if improved is None:
            break
        ep = improved
    return ep


def _try_decompose(ep, env, table, before) -> ExportedProgram | None:
    try:
        candidate = ep.run_decompositions(table)
    except Exception:
        # A decomposition may call a mutating relative (_native_batch_norm_legit_no_training
        # calls _native_batch_norm_legit); decomposing that relative too keeps it functional.
        names = {op._schema.name for op in table}
        relatives = {
            op: fn
            for op, fn in torch._decomp.decomposition_table.items()
            if isinstance(op, torch._ops.OpOverload)
            and any(n.startswith(op._schema.name) for n in names)
        }
        try:
            candidate = ep.run_decompositions({**relatives, **table})
        except Exception:
            return None
    after = _lowering_gaps(candidate, env)
    better = (len(after[0]), len(after[1])) < (len(before[0]), len(before[1]))
    return candidate if better else None


def _lowering_gaps(ep: ExportedProgram, env) -> tuple[set, set]:
    """(ops nothing lowers, ops without a direct JAX lowering) in the program."""
    missing, indirect = set(), set()
    for gm in _interpret.graph_modules(ep.graph_module):
        for node in gm.graph.nodes:
            op = node.target
            if (
                node.op != "call_function"
                or not isinstance(op, torch._ops.OpOverload)
                or op in _interpret.NO_OPS
                or op in _interpret.SIZE_OPS
                or op in _interpret.PROGRAM_OPS
            ):
                continue
            entry = env.lowering_for(op)
            if entry is None:
                missing.add(op)
            if entry is None or entry.kind != "lowering":
                indirect.add(op)
    return missing, indirect


def _randomness(ep: ExportedProgram) -> tuple[bool, bool]:
    """(whether the program has random ATen ops, whether it has ops outside aten/prims)."""
    random_ops = custom_ops = False
    for gm in _interpret.graph_modules(ep.graph_module):
        for node in gm.graph.nodes:
            op = node.target
            if node.op != "call_function" or not isinstance(op, torch._ops.OpOverload):
                continue
            random_ops |= torch.Tag.nondeterministic_seeded in op.tags
            custom_ops |= op.namespace not in ("aten", "prims")
    return random_ops, custom_ops


def _dim_names(module, args, kwargs, dynamic_shapes, ep) -> list[dict[int, str]]:
    """For each tensor input (flat order), the user's ``Dim`` name of each dynamic axis."""
    if dynamic_shapes is None:
        return []
    names: list[dict[int, str]] = []

    def walk(value, spec):
        if isinstance(value, torch.Tensor):
            axes = (
                spec
                if isinstance(spec, dict)
                else dict(enumerate(spec))
                if isinstance(spec, list | tuple)
                else {}
            )
            names.append(
                {
                    a: d.__name__
                    for a, d in axes.items()
                    if isinstance(getattr(d, "__name__", None), str)
                }
            )
        elif isinstance(value, list | tuple):
            specs = spec if isinstance(spec, list | tuple) else [None] * len(value)
            for v, s in zip(value, specs, strict=False):
                walk(v, s)
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(v, spec.get(k) if isinstance(spec, dict) else None)

    try:
        if isinstance(dynamic_shapes, dict):
            bound = inspect.signature(module.forward).bind(*args, **kwargs)
            for name, value in bound.arguments.items():
                walk(value, dynamic_shapes.get(name))
        else:
            walk(tuple(args), tuple(dynamic_shapes))
            walk(kwargs, None)
    except (TypeError, ValueError):
        return []
    return names


def _jax_dtype_name(dtype: torch.dtype) -> str:
    return np.dtype(torchlax_core.jax_dtype(dtype)).name


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu().contiguous()
    target = np.dtype(torchlax_core.jax_dtype(t.dtype))
    if t.dtype == torch.bfloat16 or (t.dtype.itemsize == 1 and t.is_floating_point()):
        raw = t.view(torch.int16 if t.dtype.itemsize == 2 else torch.uint8).numpy()
        return np.array(raw, copy=True).view(target)
    return np.array(t.numpy(), copy=True)


class _Plan:
    """How the exported program's placeholders and outputs map to weights, inputs, outputs."""

    def __init__(self, ep: ExportedProgram, dim_names: list[dict[int, str]]):
        self.ep = ep
        sig = ep.graph_signature
        placeholders = [n for n in ep.graph_module.graph.nodes if n.op == "placeholder"]
        self.input_specs = sig.input_specs
        self.weights: list[dict] = []
        self.weight_values: dict[str, np.ndarray] = {}
        self.inputs: list[dict] = []
        self._input_nodes = []
        for spec, node in zip(sig.input_specs, placeholders, strict=True):
            if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                assert spec.target is not None  # such inputs are named
                value = ep.state_dict.get(spec.target)
                if value is None:
                    value = ep.constants[spec.target]
                kind = {InputKind.PARAMETER: "parameter", InputKind.BUFFER: "buffer"}.get(
                    spec.kind, "constant"
                )
                array = _to_numpy(value)  # pyright: ignore[reportArgumentType]  (a CONSTANT_TENSOR input's constant is a tensor)
                self.weights.append(
                    {
                        "name": spec.target,
                        "kind": kind,
                        "shape": list(array.shape),
                        "dtype": array.dtype.name,
                    }
                )
                self.weight_values[spec.target] = array
            elif spec.kind == InputKind.USER_INPUT:
                if isinstance(spec.arg, TensorArgument):
                    self._input_nodes.append(node)
                elif not isinstance(spec.arg, ConstantArgument):
                    raise ExportError(
                        f"Input '{spec.arg.name}' is a {type(spec.arg).__name__} (a dynamic Python "
                        "number); torchlax-export takes tensors and constants. Pass it as a "
                        "0-d tensor, or leave it static."
                    )
            else:
                raise ExportError(
                    f"torchlax-export does not support program inputs of kind {spec.kind.name} "
                    f"({spec.arg.name}); export a program without custom objects or effect tokens."
                )
        self._symbols = self._name_symbols(dim_names)
        self.constraints = self._constraints()
        scope = jax.export.SymbolicScope(self.constraints) if self.constraints else None
        for node in self._input_nodes:
            val = node.meta["val"]
            shape = [self._dim(d) for d in val.shape]
            spec_text = ", ".join(str(d) for d in shape)
            symbolic = (
                jax.export.symbolic_shape(spec_text, scope=scope)
                if any(isinstance(d, str) for d in shape)
                else tuple(shape)
            )
            self.inputs.append(
                {
                    "name": node.name,
                    "shape": shape,
                    "dtype": _jax_dtype_name(val.dtype),
                    "_aval": jax.ShapeDtypeStruct(symbolic, torchlax_core.jax_dtype(val.dtype)),
                }
            )
        self._check_outputs()

    # -- symbolic dims ----------------------------------------------------------------------

    def _name_symbols(self, dim_names) -> dict:
        symbols: dict = {}
        if len(dim_names) == len(self._input_nodes):
            for node, axes in zip(self._input_nodes, dim_names, strict=True):
                shape = node.meta["val"].shape
                for axis, name in axes.items():
                    if axis < len(shape) and isinstance(shape[axis], torch.SymInt):
                        expr = shape[axis].node.expr
                        if expr.is_Symbol and name not in symbols.values():
                            symbols.setdefault(expr, name)
        for node in self._input_nodes:
            for d in node.meta["val"].shape:
                if isinstance(d, torch.SymInt):
                    for sym in d.node.expr.free_symbols:
                        symbols.setdefault(sym, str(sym))
        return symbols

    def _constraints(self) -> list[str]:
        constraints = []
        self.dims: dict[str, dict] = {}
        for sym, name in self._symbols.items():
            vr = self.ep.range_constraints.get(sym)
            low = _bound(vr.lower) if vr is not None else None
            high = _bound(vr.upper) if vr is not None else None
            low = 1 if low is None else low
            low = max(low, 1)  # JAX dimensions are >= 1 (torch.export specializes 0 and 1 anyway)
            if low > 1:
                constraints.append(f"{name} >= {low}")
            if high is not None:
                constraints.append(f"{name} <= {high}")
            self.dims[name] = {"min": low, "max": high}
        return constraints

    def _dim(self, d) -> int | str:
        if isinstance(d, int):
            return d
        expr = d.node.expr
        if expr.is_Integer:
            return int(expr)
        if not (expr.is_polynomial() and all(s in self._symbols for s in expr.free_symbols)):
            raise ExportError(
                f"The input dimension {expr} is not a polynomial of the dynamic dims; "
                "torchlax-export supports dims such as `batch` or `2*batch` only."
            )
        import sympy

        named = {s: sympy.Symbol(n, integer=True, positive=True) for s, n in self._symbols.items()}
        return str(expr.subs(named)).replace(" ", "")

    # -- placeholders and outputs -------------------------------------------------------------

    def avals(self) -> list:
        weights = [
            jax.ShapeDtypeStruct(tuple(w["shape"]), jax.numpy.dtype(w["dtype"]))
            for w in self.weights
        ]
        return weights + [i["_aval"] for i in self.inputs]

    def placeholder_values(self, weights, inputs) -> list:
        weights, inputs = iter(weights), iter(inputs)
        values = []
        for spec in self.input_specs:
            if spec.kind == InputKind.USER_INPUT:
                values.append(
                    next(inputs) if isinstance(spec.arg, TensorArgument) else spec.arg.value  # pyright: ignore[reportAttributeAccessIssue]  (a non-tensor user input is a ConstantArgument)
                )
            else:
                values.append(next(weights))
        return values

    def _check_outputs(self) -> None:
        self.user_outputs: list[int] = []  # positions in the graph's output tuple
        self.mutations: list[tuple[int, str]] = []
        for i, spec in enumerate(self.ep.graph_signature.output_specs):
            if spec.kind == OutputKind.USER_OUTPUT:
                if isinstance(spec.arg, TensorArgument):
                    self.user_outputs.append(i)
                elif not isinstance(spec.arg, ConstantArgument):
                    raise ExportError(
                        f"Output {spec.arg.name} is a {type(spec.arg).__name__} (a symbolic size "
                        "or other non-tensor); torchlax-export supports tensor and constant outputs."
                    )
            elif spec.kind == OutputKind.BUFFER_MUTATION:
                self.mutations.append((i, spec.target))  # pyright: ignore[reportArgumentType]  (a buffer mutation names its buffer)
            elif spec.kind == OutputKind.USER_INPUT_MUTATION:
                raise ExportError(
                    f"The program mutates its input '{spec.target}' in place; an exported "
                    "artifact is functional. Return the new value instead of writing into the input."
                )
            else:
                raise ExportError(
                    f"torchlax-export does not support outputs of kind {spec.kind.name}."
                )

    def split_outputs(self, outputs) -> tuple:
        outputs = list(outputs)
        return tuple(outputs[i] for i in self.user_outputs) + tuple(
            outputs[i] for i, _ in self.mutations
        )

    def output_tree(self):
        specs = self.ep.graph_signature.output_specs
        user_specs = [s for s in specs if s.kind == OutputKind.USER_OUTPUT]
        leaves, index = [], 0
        for spec in user_specs:
            if isinstance(spec.arg, TensorArgument):
                leaves.append(index)
                index += 1
            else:
                leaves.append(_Const(spec.arg.value))  # pyright: ignore[reportAttributeAccessIssue]  (checked in _check_outputs: a ConstantArgument)
        tree = pytree.tree_unflatten(leaves, self.ep.call_spec.out_spec)  # pyright: ignore[reportArgumentType]  (an exported program always has its output spec)
        return _json_tree(tree)

    def manifest(self, exported, rng_used: bool) -> dict:
        n_user = len(self.user_outputs)
        outputs = [
            {
                "name": f"output_{k}",
                "shape": [_dim_text(d) for d in aval.shape],
                "dtype": np.dtype(aval.dtype).name,
            }
            for k, aval in enumerate(exported.out_avals[:n_user])
        ]
        inputs = [{k: v for k, v in i.items() if k != "_aval"} for i in self.inputs]
        if rng_used:
            key = exported.in_avals[-1]
            inputs.append(
                {"name": "rng_key", "shape": list(key.shape), "dtype": "uint32", "role": "rng"}
            )
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "torchlax_version": _version("torchlax-export"),
            "torch_version": torch.__version__,
            "jax_version": jax.__version__,
            "platforms": list(exported.platforms),
            "files": {},
            "dims": self.dims,
            "weights": self.weights,
            "inputs": inputs,
            "outputs": outputs,
            "output_tree": self.output_tree(),
            "mutations": [
                {"buffer": target, "output": n_user + j}
                for j, (_, target) in enumerate(self.mutations)
            ],
        }


class _Const:
    def __init__(self, value):
        self.value = value


def _json_tree(tree):
    if isinstance(tree, int) and not isinstance(tree, bool):
        return tree
    if tree is None:
        return None
    if isinstance(tree, _Const):
        return {"const": tree.value}
    if isinstance(tree, tuple):
        return {"tuple": [_json_tree(t) for t in tree]}
    if isinstance(tree, list):
        return {"list": [_json_tree(t) for t in tree]}
    if isinstance(tree, dict):
        return {"dict": [[k, _json_tree(v)] for k, v in tree.items()]}
    raise ExportError(
        f"torchlax-export cannot describe an output of type {type(tree).__name__}; "
        "return tensors in tuples, lists and dicts."
    )


def _bound(value) -> int | None:
    """A range bound as an int; ``None`` when unbounded.

    torch.export writes an unbounded ``Dim`` as ``int_oo``, which (unlike sympy's ``oo``) says
    ``is_finite`` and cannot be converted with ``int()``: only sympy Integers are bounds.
    """
    if isinstance(value, int):
        return value
    return int(value) if getattr(value, "is_Integer", False) else None


def _dim_text(d) -> int | str:
    return d if isinstance(d, int) else str(d)


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
