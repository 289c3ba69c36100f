"""Adam's capturable update on the ``jax`` device without PyTorch's 0/0: it runs the foreach form.

Compiled steps run the optimizers with ``capturable=True`` (``torchlax.jit`` for its trace,
the ``torch.compile`` backend as Dynamo does for CUDA): step counts and learning rates stay
tensors, with no host reads. torch 2.14's single-tensor capturable Adam (and AdamW, the same
function) folds the step size into the denominator,
``sqrt(v) / (sqrt(bc2) * -lr/bc1) + eps / (-lr/bc1)``: with ``lr == 0`` (the first step of a
linear warmup) and a second moment of 0 (an element that never had a gradient: LoRA's
zero-initialised B leaves A's gradient 0) that is ``0 / -0``, and the parameter becomes NaN,
where eager PyTorch's default (not capturable) update leaves it unchanged (pytorch/pytorch
#126514, fixed upstream after 2.14). The foreach capturable form divides the whole
denominator by the step size instead (``-inf`` at lr 0, an update of 0) and otherwise computes
the same update: so on the ``jax`` device a capturable single-tensor Adam call runs
``_multi_tensor_adam`` with the same arguments. The other optimizers with a capturable path
(NAdam, RAdam, Adamax, ASGD, Rprop) do not divide by the learning rate and are left as they
are. The differentiable form (no foreach form exists) and other devices are untouched.
"""

from __future__ import annotations

import functools

import torch.optim.adam as _adam

_installed: list = []


def _on_jax(params) -> bool:
    return bool(params) and all(p.device.type == "jax" for p in params)


def install() -> None:
    """Route ``torch.optim.adam._single_tensor_adam`` (which ``adam()`` looks up on each call)
    to the foreach form for capturable calls on the ``jax`` device; idempotent."""
    if _installed:
        return
    single, multi = _adam._single_tensor_adam, _adam._multi_tensor_adam

    @functools.wraps(single)
    def single_tensor_adam(params, *args, capturable, differentiable, **kwargs):
        if capturable and not differentiable and _on_jax(params):
            return multi(params, *args, capturable=True, differentiable=False, **kwargs)
        return single(params, *args, capturable=capturable, differentiable=differentiable, **kwargs)

    _adam._single_tensor_adam = single_tensor_adam
    _installed.append(single)
