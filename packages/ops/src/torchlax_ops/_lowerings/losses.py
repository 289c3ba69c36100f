"""Losses: CTC, linear cross entropy, the nll losses; ``one_hot`` (class targets).

The nll losses check their targets with ``check_index`` (compiled into the eager op cache's
executable, a checked-mode assertion under jit). ``one_hot`` is torch-level: its PyTorch code
reads data on the host, which the checks here replace.
"""

from __future__ import annotations

import functools

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import torch
import torch.nn.modules.linear_cross_entropy  # noqa: F401  (defines the torch_nn ops)
from torchlax_core import Tensor, check_index

from .. import _aten
from .._table import decomposition, lowering
from ._common import HIGHEST, _dtype_of

aten = _aten.aten  # (an op this torch lacks: a Missing, skipped)


# -- connectionist temporal classification ----------------------------------------------------------


def _static_lengths(lengths):
    """A length list as Python ints when it is known on the host, else None (a traced array)."""
    if isinstance(lengths, list | tuple):
        return [int(n) for n in lengths]
    if isinstance(lengths, jax.core.Tracer):
        return None
    return [int(n) for n in np.asarray(lengths).reshape(-1)]


def _logsumexp3(a, b, c):
    """log(e^a + e^b + e^c) whose gradient stays finite (zero) where all three are -inf."""
    top = jnp.maximum(jnp.maximum(a, b), c)
    empty = top == -jnp.inf
    top = jnp.where(empty, 0, top)
    total = jnp.exp(a - top) + jnp.exp(b - top) + jnp.exp(c - top)
    return jnp.where(empty, -jnp.inf, top + jnp.log(jnp.where(empty, 1, total)))


def _ctc_alphas(log_probs, targets, input_lengths, target_lengths, blank):
    """(nll (N,), log_alpha (N, T, 2S+1)) by the CTC forward recursion, a lax.scan over time.

    S is the longest target when the lengths are known on the host (as in PyTorch), else the
    padded target width bounds it.
    """
    lengths = _static_lengths(target_lengths)
    if lengths is not None:
        width = max(lengths, default=0)
    else:
        width = targets.shape[1] if targets.ndim == 2 else targets.shape[0]
    return _ctc_recursion(
        log_probs,
        targets,
        jnp.asarray(input_lengths, jnp.int64),
        jnp.asarray(target_lengths, jnp.int64),
        blank=blank,
        width=width,
    )


@functools.partial(jax.jit, static_argnames=("blank", "width"))
def _ctc_recursion(log_probs, targets, input_lengths, target_lengths, *, blank, width):
    # One compiled computation (eagerly too): the scan's body is not re-dispatched op by op.
    time, batch, _ = log_probs.shape
    lp = log_probs
    steps = jnp.arange(width)
    if targets.ndim == 2:
        labels = jnp.take(targets, jnp.minimum(steps, targets.shape[1] - 1), axis=1)
    else:  # targets of every sample concatenated
        starts = jnp.cumsum(target_lengths) - target_lengths
        labels = jnp.take(
            targets, jnp.clip(starts[:, None] + steps, 0, max(targets.shape[0] - 1, 0))
        )
        labels = labels.reshape(batch, width)
    extended = jnp.full((batch, 2 * width + 1), blank, labels.dtype).at[:, 1::2].set(labels)
    skip = (extended != blank) & (extended != jnp.roll(extended, 2, axis=1))
    skip = skip.at[:, :2].set(False)  # may come from s - 2 (a repeated label may not)
    emissions = jnp.take_along_axis(
        lp, jnp.broadcast_to(extended[None], (time,) + extended.shape), axis=2
    )  # (T, N, 2S+1)
    neg_inf = jnp.asarray(-jnp.inf, lp.dtype)
    first = jnp.full(extended.shape, neg_inf).at[:, :2].set(emissions[0, :, :2])

    def shifted(alpha, by):
        return jnp.concatenate([jnp.full((batch, by), neg_inf), alpha[:, :-by]], axis=1)

    def step(alpha, emit):
        alpha = _logsumexp3(alpha, shifted(alpha, 1), jnp.where(skip, shifted(alpha, 2), neg_inf))
        alpha = alpha + emit
        return alpha, alpha

    _, rest = jax.lax.scan(step, first, emissions[1:])
    alphas = jnp.concatenate([first[None], rest], axis=0)  # (T, N, 2S+1)
    final = jnp.take_along_axis(alphas, jnp.clip(input_lengths - 1, 0)[None, :, None], axis=0)[0]
    end = 2 * target_lengths  # the last blank; the last label sits just before it
    last = jnp.take_along_axis(final, end[:, None], axis=1)[:, 0]
    before = jnp.take_along_axis(final, jnp.maximum(end - 1, 0)[:, None], axis=1)[:, 0]
    nll = -_logsumexp3(last, jnp.where(target_lengths > 0, before, neg_inf), neg_inf)
    # PyTorch leaves log_alpha unset past each sample's lengths: -inf here.
    inside = (jnp.arange(time)[:, None, None] < input_lengths[None, :, None]) & (
        jnp.arange(2 * width + 1)[None, None, :] <= end[None, :, None]
    )
    log_alpha = jnp.transpose(jnp.where(inside, alphas, neg_inf), (1, 0, 2))
    return nll, log_alpha


@lowering(aten._ctc_loss.default, aten._ctc_loss.Tensor, opmath=True, args=("log_probs",))
def _ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    if log_probs.ndim != 3:
        raise RuntimeError(
            f"_ctc_loss: log_probs must be 3-dimensional (T, N, C), got "
            f"{log_probs.ndim} dimensions; ctc_loss adds the batch dimension."
        )
    nll, log_alpha = _ctc_alphas(log_probs, targets, input_lengths, target_lengths, blank)
    if zero_infinity:
        nll = jnp.where(nll == jnp.inf, 0, nll)
    return nll.astype(log_probs.dtype), log_alpha.astype(log_probs.dtype)


@lowering(
    aten._ctc_loss_backward.default,
    aten._ctc_loss_backward.Tensor,
    opmath=True,
    args=("grad", "log_probs"),
)
def _ctc_loss_backward(
    grad,
    log_probs,
    targets,
    input_lengths,
    target_lengths,
    neg_log_likelihood,
    log_alpha,
    blank,
    zero_infinity=False,
):
    # PyTorch's gradient assumes log_probs came from log_softmax: exp(log_probs) minus the
    # label occupation (the vjp of the nll), zero past each input length and, with
    # zero_infinity, for samples whose loss is infinite.
    def nll_of(lp):
        return _ctc_alphas(lp, targets, input_lengths, target_lengths, blank)[0]

    nll, pull = jax.vjp(nll_of, log_probs)
    g = grad
    if zero_infinity:
        g = jnp.where(nll == jnp.inf, 0, g)
    occupation = pull(g.astype(nll.dtype))[0]
    time = log_probs.shape[0]
    inside = jnp.arange(time)[:, None] < jnp.asarray(input_lengths, jnp.int64)[None, :]
    out = jnp.where(inside[..., None], jnp.exp(log_probs) * g[None, :, None] + occupation, 0)
    if zero_infinity:
        out = jnp.where((nll == jnp.inf)[None, :, None], 0, out)
    return out.astype(log_probs.dtype)


# -- linear cross entropy -------------------------------------------------------------------------
# F.linear_cross_entropy(..., options=...) calls these custom ops, which chunk the batch to bound
# memory on PyTorch's backends. XLA fuses the projection into the loss, so one pass suffices.

torch_nn = torch.ops.torch_nn


def _linear_cross_entropy(
    input, linear_weight, target, linear_bias, weight, reduction, ignore_index, acc_dtype
):
    """cross_entropy(input @ linear_weight.T + linear_bias, target), in the accumulation dtype."""
    acc = jnp.promote_types(_dtype_of(acc_dtype), input.dtype)
    logits = jnp.matmul(input.astype(acc), linear_weight.astype(acc).T, precision=HIGHEST)
    if linear_bias is not None:
        logits = logits + linear_bias.astype(acc)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    class_weight = jnp.ones(logits.shape[-1], acc) if weight is None else weight.astype(acc)
    if jnp.issubdtype(target.dtype, jnp.floating):  # class probabilities
        losses = -jnp.sum(log_probs * target.astype(acc) * class_weight, axis=-1)
        if reduction == "mean":
            return jnp.sum(losses) / losses.shape[0]
        return jnp.sum(losses) if reduction == "sum" else losses
    kept = target != ignore_index
    safe = jnp.where(kept, target, 0)
    picked = jnp.take_along_axis(log_probs, safe[:, None], axis=-1)[:, 0]
    sample_weight = jnp.where(kept, class_weight[safe], 0)
    losses = -picked * sample_weight
    if reduction == "mean":
        return jnp.sum(losses) / jnp.sum(sample_weight)
    return jnp.sum(losses) if reduction == "sum" else losses


@lowering(
    torch_nn._linear_cross_entropy_batch_chunked.default,
    opmath=True,
    args=("input", "linear_weight", "linear_bias", "weight"),
)
def _linear_cross_entropy_batch_chunked(
    input,
    linear_weight,
    target,
    linear_bias,
    weight,
    reduction,
    ignore_index,
    label_smoothing,
    batch_chunk_size,
    acc_policy,
    acc_dtype,
    allow_retain_graph,
    compute_input_grad,
    compute_linear_weight_grad,
    compute_linear_bias_grad,
):
    # (loss, grad_input, grad_linear_weight, grad_linear_bias): the gradients of the loss are
    # computed here (autograd scales them by the upstream gradient), empty where not asked for.
    if label_smoothing != 0.0:
        raise RuntimeError(
            "torch_nn._linear_cross_entropy_batch_chunked: label_smoothing must "
            "be 0 on the chunked path (F.linear_cross_entropy falls back to the "
            "reference path otherwise); pass options=None."
        )

    def loss_of(x, w, b):
        return _linear_cross_entropy(x, w, target, b, weight, reduction, ignore_index, acc_dtype)

    bias = (
        linear_bias
        if linear_bias is not None
        else jnp.zeros(linear_weight.shape[0], linear_weight.dtype)
    )
    loss, pull = jax.vjp(loss_of, input, linear_weight, bias)
    grad_input, grad_weight, grad_bias = pull(jnp.ones_like(loss))
    dtype = input.dtype
    return (
        loss.astype(dtype),
        grad_input.astype(dtype) if compute_input_grad else jnp.zeros((0, 0), dtype),
        grad_weight.astype(dtype) if compute_linear_weight_grad else jnp.zeros((0, 0), dtype),
        grad_bias.astype(dtype) if compute_linear_bias_grad else jnp.zeros((0,), dtype),
    )


@lowering(
    torch_nn._linear_cross_entropy_batch_chunked_no_reduction.default,
    opmath=True,
    args=("input", "linear_weight", "linear_bias", "weight"),
)
def _linear_cross_entropy_batch_chunked_no_reduction(
    input,
    linear_weight,
    target,
    linear_bias,
    weight,
    ignore_index,
    batch_chunk_size,
    acc_policy,
    acc_dtype,
):
    losses = _linear_cross_entropy(
        input, linear_weight, target, linear_bias, weight, "none", ignore_index, acc_dtype
    )
    return losses.astype(input.dtype)


# -- torch-level functions whose PyTorch code reads data on the host ------------------------------


def _traced(tensor) -> bool:
    return (
        isinstance(tensor, torch.Tensor)
        and hasattr(tensor, "jax")
        and isinstance(tensor.jax(), jax.core.Tracer)  # pyright: ignore[reportAttributeAccessIssue]  (hasattr checked it)
    )


# -- the nll losses: lowerings, so that the eager op cache compiles each into one executable --
# (PyTorch's decompositions dispatch ~25 ops eagerly.) The target check is ``check_index``: the
# op cache compiles it in (``_checks.checked``), a jit program records it in checked mode.

_NONE, _MEAN, _SUM = 0, 1, 2


def _check_class_targets(self, target, ignore_index):
    """Each target is a class of ``self`` (dim 1, or 0 unbatched) or ``ignore_index``."""
    classes = self.shape[1] if self.ndim > 1 else self.shape[0]
    check_index(
        jnp.where(target == ignore_index, 0, target),
        0,
        classes,
        IndexError,
        "Target {index} is out of bounds.",
    )


def _check_nll_dims(name, self, target, dims):
    if self.ndim not in dims:
        wanted = " or ".join(f"{d}D" for d in dims)
        raise RuntimeError(f"{name}: input must be {wanted}, got {self.ndim}D.")
    if self.ndim > 1 and target.shape != self.shape[:1] + self.shape[2:]:
        raise RuntimeError(
            f"{name}: size mismatch (got input: {list(self.shape)}, target: "
            f"{list(target.shape)}); the target has the input's shape without the class dim."
        )


def _target_weights(self, safe, kept, weight):
    """Each target's class weight (0 where ignored), in ``self``'s dtype."""
    per_target = jnp.ones((), self.dtype) if weight is None else weight[safe].astype(self.dtype)
    return jnp.where(kept, per_target, 0).astype(self.dtype)


def _nll_forward(self, target, weight, reduction, ignore_index):
    _check_class_targets(self, target, ignore_index)
    channel = 1 if self.ndim > 1 else 0
    kept = target != ignore_index
    safe = jnp.where(kept, target, 0)
    picked = jnp.take_along_axis(self, jnp.expand_dims(safe, channel), axis=channel)
    weights = _target_weights(self, safe, kept, weight)
    losses = jnp.where(kept, -(jnp.squeeze(picked, channel) * weights), 0).astype(self.dtype)
    if reduction == _NONE and self.ndim > 1:
        return losses, jnp.zeros((), self.dtype)
    total_weight = jnp.sum(weights).astype(self.dtype)
    if reduction == _SUM:
        losses = jnp.sum(losses).astype(self.dtype)
    elif reduction == _MEAN:
        losses = (jnp.sum(losses) / total_weight).astype(self.dtype)
    return losses, total_weight


def _nll_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    _check_class_targets(self, target, ignore_index)
    channel = 1 if self.ndim > 1 else 0
    if self.ndim == 1 and target.ndim > 0:  # PyTorch's kernel reads target[0] only
        target = target[0]
    kept = target != ignore_index
    safe = jnp.where(kept, target, 0)
    grad = grad_output / total_weight if reduction == _MEAN else grad_output
    scale = -(grad * _target_weights(self, safe, kept, weight))
    classes = jax.lax.broadcasted_iota(safe.dtype, self.shape, channel)
    hit = classes == jnp.expand_dims(safe, channel)
    return jnp.where(hit, jnp.expand_dims(scale, channel), 0).astype(self.dtype)


@lowering(aten.nll_loss_forward.default)
def nll_loss_forward(self, target, weight, reduction, ignore_index):
    _check_nll_dims("nll_loss_forward", self, target, (1, 2))
    return _nll_forward(self, target, weight, reduction, ignore_index)


@lowering(aten.nll_loss2d_forward.default)
def nll_loss2d_forward(self, target, weight, reduction, ignore_index):
    _check_nll_dims("nll_loss2d_forward", self, target, (4,))
    return _nll_forward(self, target, weight, reduction, ignore_index)


@lowering(aten.nll_loss_backward.default)
def nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    return _nll_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight)


@lowering(aten.nll_loss2d_backward.default)
def nll_loss2d_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    return _nll_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight)


@decomposition(aten.one_hot.default)
def one_hot(self, num_classes=-1):
    if num_classes == -1 and _traced(self):
        raise RuntimeError(
            "one_hot: num_classes=-1 infers the number of classes from the data (its maximum), "
            "which a JAX trace (jax.jit / torchlax.jit) cannot do because the output shape would "
            "depend on it. Pass num_classes explicitly."
        )
    if self.dtype != torch.int64:
        raise RuntimeError("one_hot is only applicable to index tensor of type LongTensor.")
    if num_classes == -1:
        if self.numel() == 0:
            raise RuntimeError("Can not infer total number of classes from empty tensor.")
        num_classes = int(self.max()) + 1  # eager only: a host read, as in PyTorch
    # Checked as on PyTorch's CPU (eagerly a host read; under jit only in checked mode, else a
    # value outside [0, num_classes) gives a row of zeros).
    if isinstance(self, Tensor):  # not Dynamo's fake tensors (shape propagation has no values)
        values = self.jax()
        check_index(values, 0, 2**63 - 1, RuntimeError, "Class values must be non-negative.")
        check_index(
            values,
            -(2**63),
            num_classes,
            RuntimeError,
            "Class values must be smaller than num_classes.",
        )
    elif self.numel():
        # A torch.compile trace: fake tensors hold no values, so the checks become assertions
        # in the graph (raised eagerly, or after the call in a program built checked).
        torch._assert_async(self.min() >= 0, "Class values must be non-negative.")
        torch._assert_async(
            self.max() < num_classes, "Class values must be smaller than num_classes."
        )
    classes = torch.arange(num_classes, device=self.device)
    return (self.unsqueeze(-1) == classes).to(torch.int64)
