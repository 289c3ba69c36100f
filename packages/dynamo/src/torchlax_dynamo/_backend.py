"""``torch.compile(model, backend="torchlax")``.

Dynamo captures the Python program as FX graphs (breaking the graph where it must, guarding,
recompiling on new shapes as it always does) and hands each to ``torchlax_backend``. AOT
autograd turns it into ATen graphs - a forward and, when gradients are needed, a backward -
functionalized, with the ops torchlax cannot lower decomposed where PyTorch knows how. Each
ATen graph becomes one ``jax.jit``-compiled XLA program (``_program.XlaProgram``), or, if
some op has no lowering at all, a few programs with that op run eagerly between them
(``_partition``).

Dynamic shapes: a graph Dynamo captured with symbolic sizes (``dynamic=True``, or after a
recompile with automatic dynamic shapes) is compiled once by Dynamo and AOT autograd; its
XLA program is then traced and compiled by ``jax.jit`` once per concrete input shape it
meets (sizes arrive as static Python ints). XLA has no symbolic shapes, so "dynamic" means
one Dynamo compile and a bounded set of XLA compiles, one per shape seen.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torchlax_core import current_env
from torchlax_core.internal import get_logger

from ._decompositions import decompositions_for
from ._partition import compile_graph
from ._spent_outputs import freed_graph_outputs, with_freed_graph_grad_fns

_log = get_logger("dynamo")

_OPTIONS = frozenset()

# torch.compile's modes and what each means for this backend. Inductor's modes tune inductor:
# "reduce-overhead" replays CUDA graphs to cut per-kernel launch cost, "max-autotune" benchmarks
# kernel variants. An XLA program already is one executable launched by one call (the
# overhead CUDA graphs remove is not there), and XLA picks its own kernels (on GPU it autotunes
# GEMMs and convolutions by default; on CPU there is nothing to tune), so every mode compiles
# the same XLA program. Accepting them lets code written for inductor switch backends as is.
_MODES = {
    "default": "XLA's default compilation",
    "reduce-overhead": "each graph already runs as one XLA executable launched by one call; "
    "there is no per-kernel launch overhead for CUDA graphs to remove",
    "max-autotune": "XLA chooses and, on GPU, autotunes its kernels itself; nothing more to "
    "tune from here",
    "max-autotune-no-cudagraphs": "XLA chooses and, on GPU, autotunes its kernels itself; "
    "nothing more to tune from here",
}
_noted_modes: set[str] = set()


def _check_mode(mode: str | None) -> None:
    if mode is None or mode == "default":
        return
    if mode not in _MODES:
        raise ValueError(
            f"torch.compile(backend='torchlax') got mode={mode!r}; it takes one of "
            f"{', '.join(repr(m) for m in _MODES)} (all compile the same XLA program; see "
            "docs/dynamo.md)."
        )
    if mode not in _noted_modes:
        _noted_modes.add(mode)
        _log.info(
            "torch.compile mode=%r compiles the same XLA program as the default mode: %s.",
            mode,
            _MODES[mode],
        )


def torchlax_backend(
    gm: torch.fx.GraphModule,
    example_inputs,
    options: dict[str, Any] | None = None,
    *,
    mode: str | None = None,
):
    """The ``torch.compile`` backend: run Dynamo's graphs as XLA programs through torchlax.

    Registered as ``backend="torchlax"`` through the ``torch_dynamo_backends`` entry point, so
    ``torch.compile(model, backend="torchlax")`` works without importing torchlax. Inputs may
    be CPU/CUDA tensors (outputs are then torch tensors too; both cross over through DLPack,
    without copies) or torchlax Tensors (outputs are torchlax Tensors). Training works:
    ``loss.backward()`` runs the compiled backward graph as an XLA program as well.

    The lowerings come from the environment current when the graph is compiled
    (``torchlax.current_env()``).

    ``mode`` (``torch.compile(..., mode=...)``) is accepted for every mode PyTorch defines;
    all compile the same XLA program (``_MODES`` says why), which is logged once per mode.
    """
    _check_mode(mode)
    unknown = set(options or {}) - _OPTIONS
    if unknown:
        raise ValueError(
            f"torch.compile(backend='torchlax') got unknown options {sorted(unknown)}; it takes "
            "none at present."
        )
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    env = current_env()
    counter = iter(range(1 << 62))
    _log.info(
        "torch.compile: Dynamo graph with %d nodes and %d inputs handed to torchlax",
        len(gm.graph.nodes),
        len(example_inputs),
    )

    def compiler(kind):
        def compile_aten_graph(aten_gm: torch.fx.GraphModule, aten_inputs):
            name = f"{kind}{next(counter)}"
            start = time.perf_counter()
            compiled = compile_graph(aten_gm, env, name)
            _log.debug(
                "%s: ATen graph of %d nodes prepared in %.1f ms",
                name,
                len(aten_gm.graph.nodes),
                1e3 * (time.perf_counter() - start),
            )
            return compiled.boxed

        return compile_aten_graph

    backend = aot_autograd(
        fw_compiler=compiler("forward"),
        bw_compiler=compiler("backward"),
        inference_compiler=compiler("inference"),
        decompositions=decompositions_for(env),
        keep_inference_input_mutations=True,
        # Inductor's partitioner: the backward recomputes cheap ops (views, elementwise) instead
        # of the forward handing them over as outputs (a transposed weight would be copied).
        partition_fn=min_cut_rematerialization_partition,
    )
    freed = freed_graph_outputs(gm)  # a loss whose traced backward ran (_spent_outputs)
    if not _may_need_backward(example_inputs):
        # No backward can follow: the fused CPU attention op stays whole and is lowered as one
        # (fewer transposes and copies than its math decomposition).
        compiled = backend(gm, example_inputs)
        return with_freed_graph_grad_fns(compiled, freed) if freed else compiled
    # On the CPU, scaled dot-product attention as plain ATen ops (matmuls, softmax) whose
    # backward autograd derives, instead of the CPU flash kernel pair: its forward decomposes,
    # but its backward (a fused kernel) would then be handed the decomposition's outputs, which
    # are not the logsumexp it expects. Inductor excludes that decomposition for the same
    # reason. On the jax device the overrideable fused op stays allowed: it and its backward
    # are lowered whole (ops attention.py), the backward reading the forward's own logsumexp.
    with sdpa_kernel([SDPBackend.MATH, SDPBackend.OVERRIDEABLE]):
        compiled = backend(gm, example_inputs)
    return with_freed_graph_grad_fns(compiled, freed) if freed else compiled


def _may_need_backward(example_inputs) -> bool:
    # AOT autograd builds a backward exactly when grad mode is on and some input requires grad
    # (Dynamo lifts parameters to inputs); the same test decides here.
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs
    )
