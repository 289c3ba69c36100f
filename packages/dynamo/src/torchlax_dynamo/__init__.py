"""torchlax-dynamo: the ``torch.compile(model, backend="torchlax")`` backend.

Registered through the ``torch_dynamo_backends`` entry point: ``torch.compile`` finds it by
name, without ``import torchlax``. Each graph Dynamo captures runs as ``jax.jit``-compiled XLA
programs, forward and backward, on plain CPU/CUDA tensors (handed over through DLPack) or on
torchlax Tensors. See ``_backend`` for the pipeline and the treatment of dynamic shapes.
"""

from . import _capture, _earlier_graphs, _spent_outputs, _subclass
from ._backend import torchlax_backend as torchlax_backend
from ._partition import SplitGraph as SplitGraph
from ._program import XlaProgram as XlaProgram
from ._program import counters as counters

__version__ = "0.1.0"

_subclass.install()
_capture.install(torchlax_backend)  # loss.backward() traced into the graph (_capture)
# ... and a loss returned after it handed out detached, with a raising grad_fn (_spent_outputs)
_spent_outputs.install(_capture.compiles_for_torchlax)
# ... and one whose loss an earlier graph computed breaks the graph there (_earlier_graphs)
_earlier_graphs.install(_capture.compiles_for_torchlax)
