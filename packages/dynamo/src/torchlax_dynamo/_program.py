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
from collections.abc import Callable
from operator import is_
from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import torch
from torch.fx.node import map_arg
from torchlax_core import Tensor, enable
from torchlax_core.internal import (
    CompiledProgram,
    Entry,
    array_of,
    dense_strides_in_order,
    failure_of,
    laid_out,
    launch_error,
    memory_order,
    not_exclusive,
    output_tensors,
    peek_array,
    peek_arrays,
    refuse_if_too_large,
    result_specs,
    signature,
    state_lock,
    view_kind,
    viewed_back,
    wrap_results,
    wrap_results_like,
    write_back,
    write_back_all,
    x64,
    x64_flag,
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


# What each argument of a call is (``_CallPlan.kinds``).
_STATIC, _TORCHLAX, _TORCH = 0, 1, 2

_aval = operator.attrgetter("aval")


class _CallPlan:
    """How a call with arguments of these types runs, worked out once per tuple of types:
    which arguments are torchlax Tensors, torch tensors or static values, which arrays are
    donated (``donated``, of the arguments at ``donated_args``; ``kept``: the others) and the
    program taking them; ``memo``: the last call's signature and its entry (``_Memo``)."""

    __slots__ = (
        "kinds",
        "torchlax_only",
        "torch_only",
        "mixed",
        "on_jax",
        "donated",
        "donated_args",
        "kept",
        "program",
        "memo",
    )

    def __init__(self, kinds, donated, donated_args, kept, program):
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
        self.program: CompiledProgram = program
        self.memo: _Memo | None = None

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


# A signature's first runs are waited for before their results are written back (_committed).
_CHECKED_RUNS = 3


class _Memo:
    """One signature of a ``_CallPlan`` (its arrays' avals and its static values), its entry,
    and what turning the entry's results into the graph's outputs and write-backs needs,
    prepared from what tracing learned (``XlaProgram._trace``'s info)."""

    __slots__ = (
        "avals",
        "statics",
        "entry",
        "layout",
        "arrays_at",
        "devices",
        "restrided",
        "forwarded",
        "on_jax",
        "outputs",
        "in_order",
        "all_jax",
        "all_cpu",
        "written",
        "written_results",
        "written_exclusive",
        "copied_into",
        "specs",
        "generation",
        "plain",
        "runs",
        "fits",
        "checked",
    )

    def __init__(self, avals: list, statics: tuple, entry: Entry, plan: _CallPlan):
        self.avals = avals
        self.statics = statics
        self.entry = entry
        layout, mutations, arrays_at, devices, exclusive, forwarded, restrided = entry.info
        self.layout = layout
        self.arrays_at = arrays_at
        self.devices = devices
        self.restrided = restrided
        kinds = plan.kinds
        self.forwarded = tuple(p for p in forwarded if kinds[p] == _TORCHLAX)
        self.on_jax = plan.on_jax
        self.outputs = len(layout)
        self.in_order = not restrided and all(
            kind == _ARRAY and value == i for i, (kind, value) in enumerate(layout)
        )
        # Where each output goes (see output_tensors): all to the jax device is the hot path.
        self.all_jax = all(d.type == "jax" if d is not None else plan.on_jax for d in devices)
        # All to the CPU (a CPU model's outputs): one DLPack loop (cpu_tensors).
        self.all_cpu = bool(devices) and all(d is not None and d.type == "cpu" for d in devices)
        written = [(p, i) for p, i in mutations if kinds[p] == _TORCHLAX]
        self.written = tuple(p for p, _ in written)
        self.written_results = tuple(i for _, i in written)
        self.written_exclusive = tuple(i in exclusive for _, i in written)
        self.copied_into = tuple((p, i) for p, i in mutations if kinds[p] != _TORCHLAX)
        # The outputs' shapes, dtypes and devices (result_specs), once all_jax ones were made.
        self.specs: list | None = None
        # InputCache.generation when this memo last served a call of torch tensors alone
        # (-1 otherwise): while it is unchanged the call's arrays are that call's.
        self.generation = -1
        # (launch, key) of Entry.plain_launch, once the entry was launched through run();
        # None while it is not, or for a signature run() must serve (keys drawn, checks).
        self.plain: tuple | None = None
        self.runs = 0
        # Whether XLA's memory estimate of the executable was checked against the device
        # (refuse_if_too_large, before the first launch).
        self.fits = False
        self.checked = 0  # runs seen to succeed (XlaProgram._committed)


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
        self._plans: dict[tuple, _CallPlan] = {}
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
        tensors = [
            Tensor(a) if strides is None else laid_out(a, strides)
            for a, strides in zip(arrays, layouts, strict=True)
        ]
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
                    order = None if out.is_contiguous() else memory_order(out.shape, out.stride())
                    if order is None:
                        results.append(array_of(out))
                    else:  # returned in memory order, viewed back with the tensor's strides
                        restrided.append((len(layout) - 1, order))
                        results.append(jnp.transpose(array_of(out), order))
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
        plan = self._plans.get(types)
        if plan is None:
            plan = self._plan(types)
        arrays, statics, repeat = self._arrays_of(plan, args)
        donated = plan.donated
        if donated:
            _copy_shared(plan, args, arrays)
            call_args = ([arrays[i] for i in donated], [arrays[i] for i in plan.kept])
        else:
            call_args = (arrays,)
        memo = self._memo_for(plan, arrays, statics, repeat, call_args)
        if plan.donated:
            # From the launch (which deletes the donated arrays) to the write-back: an eager
            # op on another thread that took one of them waits for this and runs again.
            with state_lock:
                return self._run(plan, memo, args, call_args)
        return self._run(plan, memo, args, call_args)

    def _run(self, plan: _CallPlan, memo: _Memo, args: tuple, call_args: tuple) -> Any:
        if not memo.fits:  # a program that cannot fit is refused before it donates anything
            _refuse_if_too_large(plan, memo, call_args)
            memo.fits = True
        plain = memo.plain
        if plain is not None:
            # The executable's C++ launcher with the constant key (Entry.plain_launch): what
            # run() does for a signature that draws no key and checks nothing. One that
            # raises has done nothing; run() then handles or raises it.
            try:
                results = plain[0](*call_args, plain[1])
            except jax.errors.JaxRuntimeError as exc:  # XLA refused the run: no fallback
                raise launch_error(exc, plan.program.name, len(plan.donated)) from exc
            except Exception:
                memo.plain = None
            else:
                return self._committed(plan, memo, args, results)
        # A fresh key per call from torch's generator where the signature draws keys:
        # reproducible under torch.manual_seed.
        try:
            if x64_flag.value:
                results = plan.program.run(memo.entry, *call_args)
            else:
                with x64():
                    results = plan.program.run(memo.entry, *call_args)
        except jax.errors.JaxRuntimeError as exc:
            raise launch_error(exc, plan.program.name, len(plan.donated)) from exc
        if memo.plain is None and memo.runs < 2:
            memo.runs += 1
            memo.plain = memo.entry.plain_launch()
        return self._committed(plan, memo, args, results)

    def _arrays_of(self, plan: _CallPlan, args) -> tuple:
        """(arrays, statics, repeat): the call's input arrays, its static values, and the
        InputCache generation of a CPU model's inputs (-1 where that does not apply)."""
        repeat = -1
        if plan.torchlax_only:
            arrays = peek_arrays(args)  # an exclusive array stays so (see _copy_shared)
            statics = ()
        elif plan.torch_only:
            arrays = self._inputs.get_all(args)
            statics = ()
            repeat = self._inputs.generation
        else:
            arrays, statics = plan.inputs(args, self._inputs)
        if plan.mixed:
            _copy_borrowed_cpu_inputs(args, arrays)
        return arrays, statics, repeat

    def _memo_for(self, plan: _CallPlan, arrays, statics, repeat: int, call_args) -> _Memo:
        """The plan's memo of the last call's entry, renewed where this call's signature
        differs."""
        memo = plan.memo
        if memo is not None and memo.entry.stale():  # traced under another matmul precision
            memo = plan.memo = None
        if memo is None or repeat < 0 or memo.generation != repeat:
            # The signature of the last call is recognised by its arrays' avals (JAX hands
            # every result of an executable the same aval object, and a training step's inputs
            # are the last step's results) and its static values; any other call keys on the
            # signature. A CPU model's call whose inputs InputCache found unchanged since the
            # memo's call (the same generation: the very arrays) needs neither.
            avals = list(map(_aval, arrays))
            if memo is None or memo.statics != statics or not all(map(is_, avals, memo.avals)):
                with x64():
                    entry = plan.program.entry((statics, signature(arrays)), call_args, statics)
                memo = plan.memo = _Memo(avals, statics, entry, plan)
            memo.generation = repeat
        return memo

    def _plan(self, types: tuple) -> _CallPlan:
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
        plan = _CallPlan(kinds, donated, donated_args, kept, program)
        self._plans[types] = plan
        return plan

    def _committed(self, plan: _CallPlan, memo: _Memo, args: tuple, results) -> Any:
        """``_outputs`` once the run is known to have succeeded: XLA reports a failed run
        (out of memory allocating its temporaries) only when a result is waited for, and
        arrays that raise on every read must not become parameters, ``.grad``s or optimizer
        state. The wait is for a signature's first ``_CHECKED_RUNS`` runs: it ends the overlap
        of Python's next call with XLA's run (nearly twice the step time of a small model),
        and an executable that ran with the same shapes that often needs the same memory
        again (docs/semantics.md)."""
        if memo.checked >= _CHECKED_RUNS:
            return self._outputs(memo, args, results)
        try:
            failure = failure_of(results, plan.program.name, len(plan.donated))
        except BaseException:
            # Interrupted while waiting: the run was launched (its donated inputs are gone),
            # so its results are written back before the interrupt goes on.
            self._outputs(memo, args, results)
            raise
        if failure is None:
            memo.checked += 1
        if failure is not None:
            raise failure
        try:
            return self._outputs(memo, args, results)
        except BaseException:
            # Interrupted (Ctrl-C lands between any two bytecodes) while the outputs were
            # made or the state written: the donated arrays are gone, so the run's state is
            # written whole (again: idempotent) before the interrupt goes on.
            self._write_back(memo, args, results)
            raise

    def _outputs(self, memo: _Memo, args: tuple, results) -> Any:
        """The graph's outputs from a call's ``results``, after writing back what it mutated."""
        for position in memo.forwarded:
            array_of(args[position])  # handed out as an output: no longer exclusive
        count = memo.outputs
        if memo.in_order:  # every output an array result, in order, laid out row-major
            arrays = results[:count] if len(results) != count else results
            if not memo.all_jax:
                outs = cpu_tensors(arrays) if memo.all_cpu else None
                if outs is None:
                    outs = output_tensors(arrays, memo.on_jax, _to_torch, memo.devices)
            elif memo.specs is not None:
                outs = wrap_results_like(arrays, memo.specs)
            else:
                outs = wrap_results(arrays)
                memo.specs = result_specs(outs, arrays)
        else:
            outs = []
            for kind, value in memo.layout:
                if kind == _ARRAY:
                    outs.append(results[value])
                elif kind == _INPUT:
                    outs.append(args[value])
                else:
                    outs.append(value)
            arrays_at = memo.arrays_at
            if arrays_at:
                converted = output_tensors(
                    [outs[i] for i in arrays_at], memo.on_jax, _to_torch, memo.devices
                )
                for i, tensor in zip(arrays_at, converted, strict=True):
                    outs[i] = tensor
                for i, order in memo.restrided:
                    outs[i] = viewed_back(outs[i], order)
        self._write_back(memo, args, results)
        return outs[0] if self._single_output else tuple(outs)

    @staticmethod
    def _write_back(memo: _Memo, args: tuple, results) -> None:
        """The inputs the graph mutated take the run's new values."""
        if memo.written:
            write_back_all(
                [args[p] for p in memo.written],
                [results[i] for i in memo.written_results],
                memo.written_exclusive,
            )
        for position, index in memo.copied_into:
            dst = args[position]
            on_cpu = dst.device.type == "cpu"
            write_back(dst, results[index], functools.partial(jax_to_torch, on_cpu=on_cpu))

    @property
    def traces(self) -> int:
        return self._program.traces + sum(p.traces for p in self._donating.values())


def _refuse_if_too_large(plan: _CallPlan, memo: _Memo, call_args: tuple) -> None:
    arrays = jax.tree.leaves(call_args)
    if arrays and isinstance(arrays[0], jax.core.Tracer):
        return  # inlined into a JAX trace (call_torch under jax.jit): the outer program runs
    device = next(iter(arrays[0].devices())) if arrays else jax.devices()[0]
    refuse_if_too_large(memo.entry.executable, plan.program.name, device)


def _traced_layout(val) -> tuple[int, ...] | None:
    """Dense strides in the dimension order of ``val``'s (the placeholder's fake value), where
    that order is not row-major; else None.

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
    if 0 in shape:
        return None
    return dense_strides_in_order(shape, strides)


def _copy_shared(plan: _CallPlan, args: tuple, arrays: list) -> None:
    """Replace in ``arrays`` the arrays to donate (``plan.donated``: every torchlax Tensor the
    program writes, so one executable serves every call) that someone can still read by
    copies.

    An array is donated as it is where its storage holds it exclusively (``internal.is_exclusive``: a
    program of this backend made it, and nothing but such programs, which hand none of their
    inputs out, has read it since); otherwise a copy is donated in its place, so that an array
    someone can still read (taken with ``t.jax()`` or DLPack, read by an eager op, passed twice)
    stays valid. In a training loop only the first step copies: the state it writes back is
    exclusive. The write-back gives the storage the new array, so every alias of the tensor
    sees the update; views of it recompute from the new array (they compare their cached root
    by identity). CPU tensors are never donated: XLA frees a donated buffer it borrowed
    through DLPack instead of reusing it.
    """
    donated = plan.donated
    shared = [donated[k] for k in not_exclusive([args[p] for p in plan.donated_args])]
    if len(shared) < len(donated) and len(set(map(id, arrays))) < len(arrays):
        # An exclusive array passed at two positions is not exclusive either.
        counts = collections.Counter(map(id, arrays))
        shared += [i for i in donated if counts[id(arrays[i])] > 1 and i not in shared]
    if shared:
        with x64():
            for i in shared:
                arrays[i] = jnp.array(arrays[i], copy=True)


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
