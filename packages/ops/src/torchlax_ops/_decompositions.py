"""ATen ops implemented by PyTorch's own ``torch._decomp`` decompositions.

Each runs at the torch level on torchlax Tensors, so every op it calls dispatches again to a
lowering. These are the ops where PyTorch's decomposition is exact and XLA-friendly (no host
syncs, static shapes) and a hand-written lowering would buy little: group norm, the
normalization backward ops (batch norm's forward is lowered in ``_lowerings.normalization``),
the losses and their backward ops, and a few rearrangements. A lowering of the same op, from this package
or a plugin, wins over these.
"""

from __future__ import annotations

from torch._decomp import decomposition_table

from . import _aten
from ._table import decomposition

aten = _aten.aten  # (an op this torch lacks: a Missing, skipped)

_OPS = [
    # normalization
    aten.batch_norm_backward.default,
    aten.native_batch_norm_backward.default,
    aten.native_layer_norm_backward.default,
    aten.native_group_norm.default,
    aten.native_group_norm_backward.default,
    aten._fused_rms_norm.default,
    aten._fused_rms_norm_backward.default,
    aten._weight_norm_interface.default,
    # losses
    # nll_loss_forward/backward, nll_loss2d_*: lowerings in _lowerings/losses.py
    aten.mse_loss.default,
    aten.mse_loss_backward.default,
    aten.smooth_l1_loss.default,
    aten.smooth_l1_loss_backward.default,
    aten.huber_loss.default,
    aten.huber_loss_backward.default,
    aten.binary_cross_entropy.default,
    aten.binary_cross_entropy_backward.default,
    aten.binary_cross_entropy_with_logits.default,
    aten.soft_margin_loss.default,
    aten.soft_margin_loss_backward.default,
    aten.multi_margin_loss.default,
    aten.multilabel_margin_loss_forward.default,
    # activations whose forward returns extra buffers, or that gate
    aten.glu.default,
    aten.glu_backward.default,
    aten.log_sigmoid_forward.default,
    aten.log_sigmoid_backward.default,
    aten._prelu_kernel.default,
    aten._prelu_kernel_backward.default,
    aten.logit_backward.default,
    # rearrangements and sampling
    aten.im2col.default,
    aten.col2im.default,
    aten.channel_shuffle.default,
    aten.upsample_bicubic2d.default,
    aten.max_unpool2d.default,
    aten.max_unpool3d.default,
    # backward of views, as autograd calls them (a shape lowering of them wins)
    aten.select_backward.default,
    aten.slice_backward.default,
]

for _op in _OPS:
    # (an op this torch lacks, or one it has no decomposition of: skipped alone)
    _decomposed = decomposition_table.get(_op)
    if _decomposed is not None:
        decomposition(_op)(_decomposed)
