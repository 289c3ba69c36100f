"""One ATen graph (from AOT autograd) run as one ``jax.jit``-compiled XLA program.

Tracing: ``_trace`` gets tracers; each becomes a torchlax Tensor, and the graph's nodes are
evaluated on them by the environment's lowerings (``Environment.dispatch``, the very code eager
torchlax runs, so in-place, ``out=`` and view ops behave the same). The signature cache, the
key input (learned per signature), checks, write-back and output layout are the
compiled-program core's (``torchlax_core._compiled``, shared with ``torchlax.jit`` and export);
``counters["xla_traces"]`` counts traces, so a steady-state call is: convert the inputs, one
dict lookup, one launch, convert the outputs.

Inputs: a torchlax Tensor gives its ``jax.Array``; a CPU/CUDA tensor is viewed through DLPack
(no copy); anything else (a ``SymInt`` under dynamic shapes, a float) is a static argument.
Outputs follow the device of the graph's own output (its fake tensor's device): ``jax`` gives
a torchlax Tensor, ``cpu``/``cuda`` a torch tensor viewing the XLA buffer. An output that is
an input, unchanged, is handed back as that very object. Inputs the graph writes in place
(``copy_`` into an argument, as AOT autograd leaves them with
``keep_inference_input_mutations``) come out as extra results and are written back: a
torchlax Tensor takes the new array (no copy), a torch tensor is ``copy_``-ed into.
"""

from __future__ import annotations

import collections
import functools
import operator
from collections.abc import Callable, Sequence
from typing import Any

import jax
import torch
from torch.fx.node import map_arg
from torchlax_core import Tensor, enable
from torchlax_core.internal import (
    CallPlan,
    CompiledProgram,
    Entry,
    LastPlan,
    array_of,
    donatable,
    is_exclusive,
    output_tensors,
    peek_array,
    peek_arrays,
    result_specs,
    returned_in_memory_order,
    traced_input,
    traced_strides,
    view_kind,
    wrap_results,
    wrap_results_like,
    write_back,
    write_back_all,
)

from ._dlpack import InputCache, cpu_tensors, jax_to_torch, torch_to_jax

#: Statistics of this process: ``graphs`` (ATen graphs compiled), ``xla_programs`` (XLA
#: programs built from them), ``xla_traces`` (times a program was traced by ``jax.jit``),
#: ``eager_nodes`` (ATen nodes left to eager PyTorch). ``counters.clear()`` resets them.
counters: collections.Counter = collections.Counter()

_SIZE_QUERIES = frozenset(
    {
        torch.ops.aten.sym_size.int,
        torch.ops.aten.sym_stride.int,
        torch.ops.aten.sym_numel.default,
        torch.ops.aten.sym_storage_offset.default,
    }
)

# What ``_trace`` returns for each graph output.
_ARRAY, _INPUT, _CONSTANT = 0, 1, 2


def _meta_device(node) -> torch.device | None:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return value.device if isinstance(value, torch.Tensor) else None


def _constant_array(value) -> jax.Array:
    if isinstance(value, Tensor):
        return array_of(value)
    return torch_to_jax(value.detach().contiguous().clone())


# What each argument of a call is (``_Arguments.kinds``).
_STATIC, _TORCHLAX, _TORCH = 0, 1, 2


class _Arguments:
    """How a call with arguments of these types is passed, worked out once per tuple of
    types: which arguments are torchlax Tensors, torch tensors or static values, which arrays
    are donated (``donated``, of the arguments at ``donated_args``; ``kept``: the others) and
    the program taking them; ``last``: the last call's plan (the core's ``LastPlan`` of
    ``_GraphPlan``s)."""

    __slots__ = (
        "kinds",
        "torchlax_only",
        "torch_only",
        "mixed",
        "on_jax",
        "donated",
        "donated_args",
        "kept",
        "last",
    )

    def __init__(self, kinds, donated, donated_args, kept):
        self.kinds = kinds
        # Only torchlax Tensors (a training step's state): their arrays are read in one pass.
        self.torchlax_only = all(k == _TORCHLAX for k in kinds)
        # Only torch tensors (a CPU model's parameters and inputs): one pass over the cache.
        self.torch_only = bool(kinds) and all(k == _TORCH for k in kinds)
        self.on_jax = _TORCHLAX in kinds
        self.mixed = self.on_jax and _TORCH in kinds
        self.donated = donated
        self.donated_args = donated_args
        self.kept = kept
        self.last: LastPlan

    def inputs(self, args: tuple, cache: InputCache) -> tuple[list, tuple]:
        """The call's arrays (in argument order) and its static values ``((position, value),
        ...)``."""
        arrays, statics = [], []
        for i, (kind, a) in enumerate(zip(self.kinds, args, strict=True)):
            if kind == _TORCHLAX:
                arrays.append(peek_array(a))  # an exclusive array stays so (see _copy_shared)
            elif kind == _TORCH:
                arrays.append(cache.get(i, a))
            else:
                statics.append((i, a))
        return arrays, tuple(statics)


class _GraphPlan(CallPlan):
    """The core's call plan (guard, launch, write-back) of one signature of a graph's call,
    with what turning the entry's results into the graph's outputs and write-backs needs,
    prepared from what tracing learned (``XlaProgram._trace``'s info)."""

    __slots__ = (
        "layout",
        "arrays_at",
        "devices",
        "orders",
        "forwarded",
        "on_jax",
        "outputs",
        "in_order",
        "all_jax",
        "all_cpu",
        "copied_into",
        "specs",
        "generation",
        "single_output",
    )

    def __init__(
        self,
        program: CompiledProgram,
        entry: Entry,
        sig: tuple,
        avals: list,
        statics: tuple,
        arguments: _Arguments,
        single_output: bool,
    ):
        super().__init__(program, entry, sig, avals, statics, len(arguments.donated))
        layout, mutations, arrays_at, devices, exclusive, forwarded, restrided = entry.info
        self.single_output = single_output
        self.layout = layout
        self.arrays_at = arrays_at
        self.devices = devices
        # per array output: the memory order it is returned in (viewed back), or None
        self.orders = tuple(dict(restrided).get(i) for i in arrays_at)
        kinds = arguments.kinds
        self.forwarded = tuple(p for p in forwarded if kinds[p] == _TORCHLAX)
        self.on_jax = arguments.on_jax
        self.outputs = len(layout)
        self.in_order = not restrided and all(
            kind == _ARRAY and value == i for i, (kind, value) in enumerate(layout)
        )
        # Where each output goes (see output_tensors): all to the jax device is the hot path.
        self.all_jax = all(d.type == "jax" if d is not None else self.on_jax for d in devices)
        # All to the CPU (a CPU model's outputs): one DLPack loop (cpu_tensors).
        self.all_cpu = bool(devices) and all(d is not None and d.type == "cpu" for d in devices)
        written = [(p, i) for p, i in mutations if kinds[p] == _TORCHLAX]
        self.written = tuple(p for p, _ in written)
        self.written_results = tuple(i for _, i in written)
        self.written_exclusive = tuple(i in exclusive for _, i in written)
        self.copied_into = tuple((p, i) for p, i in mutations if kinds[p] != _TORCHLAX)
        # The outputs' shapes, dtypes and devices (result_specs), once all_jax ones were made.
        self.specs: list | None = None
        # InputCache.generation when this plan last served a call of torch tensors alone
        # (-1 otherwise): while it is unchanged the call's arrays are that call's.
        self.generation = -1

    def finish(self, args: Sequence, results) -> Any:
        """The graph's outputs from a call's ``results``, after writing back what it mutated."""
        for position in self.forwarded:
            array_of(args[position])  # handed out as an output: no longer exclusive
        count = self.outputs
        if self.in_order:  # every output an array result, in order, laid out row-major
            arrays = results[:count] if len(results) != count else results
            if not self.all_jax:
                outs = cpu_tensors(arrays) if self.all_cpu else None
                if outs is None:
                    outs = output_tensors(arrays, self.on_jax, _to_torch, self.devices)
            elif self.specs is not None:
                outs = wrap_results_like(arrays, self.specs)
            else:
                outs = wrap_results(arrays)
                self.specs = result_specs(outs, arrays)
        else:
            outs = []
            for kind, value in self.layout:
                if kind == _ARRAY:
                    outs.append(results[value])
                elif kind == _INPUT:
                    outs.append(args[value])
                else:
                    outs.append(value)
            arrays_at = self.arrays_at
            if arrays_at:
                converted = output_tensors(
                    [outs[i] for i in arrays_at], self.on_jax, _to_torch, self.devices, self.orders
                )
                for i, tensor in zip(arrays_at, converted, strict=True):
                    outs[i] = tensor
        self.write_back(args, results)
        return outs[0] if self.single_output else tuple(outs)

    def write_back(self, args: Sequence, results) -> None:
        """The inputs the graph mutated take the run's new values: a torchlax Tensor its new
        array, a torch tensor a copy."""
        if self.written:
            write_back_all(
                [args[p] for p in self.written],
                [results[i] for i in self.written_results],
                self.written_exclusive,
            )
        for position, index in self.copied_into:
            dst = args[position]
            on_cpu = dst.device.type == "cpu"
            write_back(dst, results[index], functools.partial(jax_to_torch, on_cpu=on_cpu))


class XlaProgram:
    """An ATen ``GraphModule`` compiled into one XLA program; call it like the module.

    ``program(*args)`` takes the graph's inputs (torchlax Tensors, torch tensors, Python
    scalars) and returns its outputs as a tuple. ``program.boxed(args)`` is the same for AOT
    autograd's boxed calling convention.
    """

    def __init__(self, gm: torch.fx.GraphModule, env, name: str = "graph"):
        self.gm = gm
        self.env = env
        self.name = name
        nodes = list(gm.graph.nodes)
        self._num_inputs = sum(1 for n in nodes if n.op == "placeholder")
        output = gm.graph.output_node().args[0]
        self._single_output = not isinstance(output, list | tuple)
        outputs = [output] if self._single_output else list(output)  # pyright: ignore[reportArgumentType]  (not a single output: a list or tuple)
        self._output_devices = [_meta_device(n) for n in outputs]
        self._inputs = InputCache(self._num_inputs)
        self._program = self._compiled(())
        # Inputs the graph writes (``copy_`` into a placeholder): their old arrays are donated
        # to the program where nothing else can see them (see ``_copy_shared``), so XLA updates
        # the state in place as a hand-written ``jax.jit`` step with donated state does.
        placeholders = [n for n in nodes if n.op == "placeholder"]
        self._mutated = tuple(
            sorted(
                {
                    placeholders.index(n.args[0])
                    for n in nodes
                    if n.op == "call_function"
                    and n.target is torch.ops.aten.copy_.default
                    and n.args[0] in placeholders
                }
            )
        )
        # Per input: the layout its tensor gets while tracing, where the graph was traced with
        # strides in another dimension order than row-major (see _traced_layout).
        self._input_layouts = [
            None if i in self._mutated else _traced_layout(n.meta.get("val"))
            for i, n in enumerate(placeholders)
        ]
        self._donating: dict[tuple[int, ...], CompiledProgram] = {}
        self._plans: dict[tuple, _Arguments] = {}
        self.boxed = boxed(self)
        counters["xla_programs"] += 1

    def _compiled(self, donated: tuple[int, ...]) -> CompiledProgram:
        """The program over all array inputs (``donated`` empty), or one taking the arrays at
        ``donated`` as a first, donated argument and the others as a second."""
        # Whether a signature draws PRNG keys is learned by tracing it (so a plugin lowering
        # that calls ``next_prng_key()`` counts as much as an op PyTorch tags random).
        # Config.checked: value checks (an index out of range, ...) are raised after the call,
        # before any output or write-back; off, XLA clamps and fills (and nothing is donated).
        trace: Callable[..., Any] = self._trace
        if donated:
            donated_set = frozenset(donated)

            def trace_split(statics, given: list, kept: list):
                count = len(given) + len(kept)
                given_at, kept_at = iter(given), iter(kept)
                arrays = [
                    next(given_at) if i in donated_set else next(kept_at) for i in range(count)
                ]
                return self._trace(statics, arrays)

            trace = trace_split
        return CompiledProgram(
            f"torch.compile graph {self.name}",
            trace,
            donate_argnums=(0,) if donated else (),
            checks=bool(getattr(self.env.config, "checked", False)),
            env=self.env,
        )

    # -- tracing ----------------------------------------------------------------------------

    def _trace(self, statics, arrays):
        """The graph on tracers: its results (outputs, then mutated inputs) and their layout."""
        counters["xla_traces"] += 1
        static_at = dict(statics)
        array_positions = [i for i in range(self._num_inputs) if i not in static_at]
        layouts = [self._input_layouts[i] for i in array_positions]
        tensors = [traced_input(a, strides) for a, strides in zip(arrays, layouts, strict=True)]
        pick = iter(tensors)
        args = [static_at[i] if i in static_at else next(pick) for i in range(self._num_inputs)]
        with enable(self.env):
            outs = run_graph(self.gm, args, self.env)
        if self._single_output:
            outs = (outs,)
        results, layout, restrided = [], [], []
        for out in outs:
            if isinstance(out, Tensor):
                for k, t in enumerate(tensors):
                    if out is t and array_of(t) is arrays[k] and view_kind(t) is None:
                        layout.append((_INPUT, array_positions[k]))
                        break
                else:
                    layout.append((_ARRAY, len(results)))
                    array, order = returned_in_memory_order(out)
                    if order is not None:  # viewed back with the tensor's strides
                        restrided.append((len(layout) - 1, order))
                    results.append(array)
            elif isinstance(out, torch.Tensor):
                layout.append((_ARRAY, len(results)))
                results.append(_constant_array(out))
            else:  # None, or a shape-derived int (saved for backward under dynamic shapes)
                layout.append((_CONSTANT, out))
        mutations = []
        for k, t in enumerate(tensors):
            if array_of(t) is not arrays[k]:
                mutations.append((array_positions[k], len(results)))
                results.append(array_of(t))
        arrays_at = tuple(i for i, (kind, _) in enumerate(layout) if kind == _ARRAY)
        devices = [self._output_devices[i] for i in arrays_at]
        # Exclusivity (what may be donated next time; see ``_copy_shared``): a written-back array
        # is the storage's alone unless the program also returns it; an input returned as an
        # output array (JAX may hand the very buffer back) is no longer its storage's alone.
        counts = collections.Counter(id(r) for r in results)
        exclusive = tuple(index for _, index in mutations if counts[id(results[index])] == 1)
        forwarded = tuple(array_positions[k] for k, a in enumerate(arrays) if counts[id(a)])
        info = (layout, mutations, arrays_at, devices, exclusive, forwarded, tuple(restrided))
        return results, info

    # -- calling ----------------------------------------------------------------------------

    def __call__(self, *args):
        types = tuple(map(type, args))
        arguments = self._plans.get(types)
        if arguments is None:
            arguments = self._arguments(types)
        arrays, statics, repeat = self._arrays_of(arguments, args)
        if arguments.donated:
            call_args = _copy_shared(arguments, args, arrays)
        else:
            call_args = (arrays,)
        plan = arguments.last.plan
        if plan is None or repeat < 0 or plan.generation != repeat or plan.entry.stale():
            # The plan of the last call, unless its guard fails (the core's LastPlan). A CPU
            # model's call whose inputs InputCache found unchanged since the plan's call (the
            # same generation: the very arrays) needs no guard beyond the matmul precision.
            plan = arguments.last.get(arrays, statics, call_args)
            plan.generation = repeat
        return plan.run(args, call_args)

    def _arrays_of(self, arguments: _Arguments, args) -> tuple:
        """(arrays, statics, repeat): the call's input arrays, its static values, and the
        InputCache generation of a CPU model's inputs (-1 where that does not apply)."""
        repeat = -1
        if arguments.torchlax_only:
            arrays = peek_arrays(args)  # an exclusive array stays so (see _copy_shared)
            statics = ()
        elif arguments.torch_only:
            arrays = self._inputs.get_all(args)
            statics = ()
            repeat = self._inputs.generation
        else:
            arrays, statics = arguments.inputs(args, self._inputs)
        if arguments.mixed:
            _copy_borrowed_cpu_inputs(args, arrays)
        return arrays, statics, repeat

    def _arguments(self, types: tuple) -> _Arguments:
        if len(self._plans) >= 8:  # argument types change rarely: never let the table grow
            self._plans.clear()
        kinds = tuple(
            _TORCHLAX
            if issubclass(t, Tensor)
            else _TORCH
            if issubclass(t, torch.Tensor)
            else _STATIC
            for t in types
        )
        # Every torchlax Tensor the graph writes is donated (see _copy_shared), so that one
        # executable serves every call.
        array_index = {p: i for i, p in enumerate(p for p, k in enumerate(kinds) if k != _STATIC)}
        donated_args = tuple(p for p in self._mutated if kinds[p] == _TORCHLAX)
        donated = tuple(array_index[p] for p in donated_args)
        if donated:
            program = self._donating.get(donated) or self._donating.setdefault(
                donated, self._compiled(donated)
            )
        else:
            program = self._program
        kept = tuple(i for i in range(len(array_index)) if i not in donated)
        arguments = _Arguments(kinds, donated, donated_args, kept)
        single = self._single_output
        arguments.last = LastPlan(
            program,
            lambda entry, sig, avals, statics: _GraphPlan(
                program, entry, sig, avals, statics, arguments, single
            ),
        )
        self._plans[types] = arguments
        return arguments

    @property
    def traces(self) -> int:
        return self._program.traces + sum(p.traces for p in self._donating.values())


def _traced_layout(val) -> tuple[int, ...] | None:
    """The strides a placeholder is traced with, from its fake value (the core's
    ``traced_strides``; None: row-major, as an input arrives).

    An input arrives row-major (a program's output that PyTorch strides with gaps, such as a
    transposed slice saved for the backward, comes back as a row-major array), but ops in the
    graph that lay out their results like an input (``empty_like``, the fused attention
    backward) were traced with its fake strides, and views after them rely on that order.
    """
    if not isinstance(val, torch.Tensor) or val.dim() < 2:
        return None
    shape, strides = tuple(val.shape), val.stride()
    if not all(isinstance(n, int) for n in (*shape, *strides)):
        return None  # symbolic: left row-major
    return traced_strides(shape, strides)


def _copy_shared(arguments: _Arguments, args: tuple, arrays: list) -> tuple[list, list]:
    """The call's arguments where it donates: the arrays to donate (``arguments.donated``:
    every torchlax Tensor the program writes, so one executable serves every call), each a
    copy where someone can still read it (the core's ``donatable``), and the arrays kept.

    The write-back gives the storage the new array, so every alias of the tensor sees the
    update; views of it recompute from the new array (they compare their cached root by
    identity). CPU tensors are never donated: XLA frees a donated buffer it borrowed through
    DLPack instead of reusing it.
    """
    kept = [arrays[i] for i in arguments.kept]
    exclusive = [is_exclusive(args[p]) for p in arguments.donated_args]
    return donatable([arrays[i] for i in arguments.donated], exclusive, kept), kept


def _copy_borrowed_cpu_inputs(args, arrays: list) -> None:
    """Give a program with torchlax outputs copies of its CPU tensor inputs, not views.

    XLA runs a program asynchronously: the call returns once it is launched, and a program
    whose outputs are torchlax Tensors is not waited for (one with torch outputs is: handing
    them to torch waits). A CPU tensor it borrowed through DLPack may then be written by torch
    before XLA has read it: ``LambdaLR`` ``fill_``-s the tensor learning rate right after the
    optimizer program is launched, and the update used the next step's rate. A copy (a
    learning rate, a scalar: a few bytes) belongs to the program alone.
    """
    position = 0
    for arg in args:
        if not isinstance(arg, torch.Tensor):
            continue
        if not isinstance(arg, Tensor) and arg.device.type == "cpu":
            arrays[position] = torch_to_jax(arg.detach().clone())
        position += 1


def _to_torch(arrays: list, devices: list) -> list[torch.Tensor]:
    out = []
    for array, device in zip(arrays, devices, strict=True):
        tensor = jax_to_torch(array, on_cpu=device is not None and device.type == "cpu")
        if device is not None and tensor.device != device:
            # XLA ran where its inputs were; the graph promised another device.
            tensor = tensor.to(device)
        out.append(tensor)
    return out


# -- evaluating the graph on torchlax Tensors ------------------------------------------------------


def run_graph(gm: torch.fx.GraphModule, args, env):
    """Evaluate ``gm``'s nodes on ``args`` (torchlax Tensors) with ``env``'s lowerings."""
    values: dict = {}
    inputs = iter(args)
    for node in gm.graph.nodes:
        op = node.op
        if op == "call_function":
            node_args = _load(node.args, values)
            node_kwargs = {k: _load(v, values) for k, v in node.kwargs.items()}
            values[node] = call_node(node.target, node_args, node_kwargs, env)
        elif op == "placeholder":
            values[node] = next(inputs)
        elif op == "get_attr":
            value = operator.attrgetter(node.target)(gm)
            values[node] = (
                Tensor(_constant_array(value)) if isinstance(value, torch.Tensor) else value
            )
        elif op == "output":
            return map_arg(node.args[0], values.__getitem__)
        else:
            raise NotImplementedError(
                f"torchlax's torch.compile backend cannot run FX node {node.format_node()} "
                f"({op}) inside an XLA program."
            )
    raise AssertionError("graph has no output node")


def _load(arg, values):
    # Plain lists and tuples, as PyTorch's dispatcher hands them to __torch_dispatch__ (FX keeps
    # immutable_list, which torchlax's dispatch would not look into).
    if isinstance(arg, torch.fx.Node):
        return values[arg]
    if isinstance(arg, list):
        return [_load(a, values) for a in arg]
    if isinstance(arg, tuple):
        return tuple(_load(a, values) for a in arg)
    return arg


def call_node(target, args, kwargs, env):
    # Straight to the lowering: factories (no tensor argument) never reach torchlax through
    # PyTorch's dispatcher. torchlax_interop's call_jax op is lowered like any other op: its
    # lowering calls the JAX function on the traced arrays, inlining it into this program.
    if (
        isinstance(target, torch._ops.OpOverload)
        and target not in _SIZE_QUERIES
        and env.lowering_for(target) is not None
    ):
        return env.dispatch(target, args, kwargs)
    return target(*args, **kwargs)


def boxed(fn):
    """``fn`` in AOT autograd's boxed calling convention: one list of inputs, owned (and freed)
    by the callee, so activations die as soon as the program has taken them."""

    def call(args):
        out = fn(*args)
        args.clear()
        return out

    call._boxed_call = True  # pyright: ignore[reportFunctionMemberAccess]  (the marker torch.compile reads)
    return call
