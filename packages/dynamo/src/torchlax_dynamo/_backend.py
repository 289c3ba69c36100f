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

from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torchlax_core import current_env

from ._decompositions import decompositions_for
from ._partition import compile_graph

_OPTIONS = frozenset()


def torchlax_backend(gm: torch.fx.GraphModule, example_inputs, options: dict[str, Any] | None = None):
    """The ``torch.compile`` backend: run Dynamo's graphs as XLA programs through torchlax.

    Registered as ``backend="torchlax"`` through the ``torch_dynamo_backends`` entry point, so
    ``torch.compile(model, backend="torchlax")`` works without importing torchlax. Inputs may
    be CPU/CUDA tensors (outputs are then torch tensors too; both cross over through DLPack,
    without copies) or torchlax Tensors (outputs are torchlax Tensors). Training works:
    ``loss.backward()`` runs the compiled backward graph as an XLA program as well.

    The lowerings come from the environment current when the graph is compiled
    (``torchlax.current_env()``).
    """
    unknown = set(options or {}) - _OPTIONS
    if unknown:
        raise ValueError(
            f"torch.compile(backend='torchlax') got unknown options {sorted(unknown)}; it takes "
            "none at present."
        )
    from torch._dynamo.backends.common import aot_autograd

    env = current_env()
    counter = iter(range(1 << 62))

    def compiler(kind):
        def compile_aten_graph(aten_gm: torch.fx.GraphModule, aten_inputs):
            compiled = compile_graph(aten_gm, env, f"{kind}{next(counter)}")
            return compiled.boxed

        return compile_aten_graph

    backend = aot_autograd(
        fw_compiler=compiler("forward"),
        bw_compiler=compiler("backward"),
        inference_compiler=compiler("inference"),
        decompositions=decompositions_for(env),
        keep_inference_input_mutations=True,
    )
    # Scaled dot-product attention as plain ATen ops (matmuls, softmax) whose backward autograd
    # derives, instead of the CPU flash kernel pair: its forward decomposes, but its backward
    # (a fused kernel) would then be handed the decomposition's outputs, which are not the
    # logsumexp it expects. Inductor excludes that decomposition for the same reason.
    with sdpa_kernel([SDPBackend.MATH]):
        return backend(gm, example_inputs)
