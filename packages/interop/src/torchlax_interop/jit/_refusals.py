"""The errors by which ``torchlax.jit`` refuses a step, each naming what the step did and what
to do (all ``JitError``s; ``JitArgumentError`` for an argument).

Most name a tensor by the path the function reaches it by (``_paths``: ``cfg.w``, ``default
argument 'w'``). A torchlax Tensor the step reaches that the state walk did not find is a
constant of the program: its value is baked in. A step that writes into such a tensor
(``buf.add_(1)``, ``w.data -= ...``, ``w.copy_(...)``) or whose ``backward()`` gives it a
``.grad`` would do so once, while it is traced, and never again: the tensor would not train or
count. The trace watch (``_watch``) finds those tensors and
puts back what they held; this module words the errors, and those for a refused
``backward()``, an argument requiring grad passed to a training step, and a leaked tracer.
"""

from __future__ import annotations

from torchlax_core import JitError

from ._discover import MAX_STATE_DEPTH
from ._paths import path_to
from ._watch import Changed, TraceWatch


def changed_constant_error(owner: str, changed: list[tuple[Changed, str]]) -> JitError:
    """The error for the constants a traced step changed, each with the path the function
    reaches it by (the first one named, the number of others said)."""
    first, path = changed[0]
    t = first.tensor
    where = where_held(path)
    described = described_tensor(t)
    if first.grad_given and not first.written:
        what = (
            f"the step's backward() gives a .grad to {described} {where} (requires_grad="
            f"{t.requires_grad}), which is not part of the compiled step's state: it is a "
            "constant of the program, so it would not train, and its .grad would be a value "
            "of the finished trace"
        )
    else:
        what = (
            f"the step writes into {described} {where} (in place, or through .data), which "
            "is not part of the compiled step's state: it is a constant of the program, so "
            "the write would happen once, while the step is traced, not on each call"
        )
    return JitError(
        f"{owner}: {what}{_others(changed)}. torchlax.jit makes state of the tensors the function closes "
        "over or receives as arguments, of the parameters and buffers of the modules and the "
        "parameters of the optimizers it reaches (through closures, globals, arguments, a "
        "bound method's object, and the lists, tuples, dicts and objects' attributes these "
        f"hold, up to {MAX_STATE_DEPTH} levels deep; a plain object's own tensors are not "
        "state, see docs/training.md). Pass the tensor as an argument, close over it directly, "
        "register it in a module the step uses (nn.Parameter or register_buffer), or give it "
        "to an optimizer the step steps. The tensor was left as it was before the call."
    )


def changed_cpu_tensor_error(owner: str, changed: list[tuple[Changed, str | None]]) -> JitError:
    """The error for the plain CPU tensors a traced step changed (``_watch``), each
    with the path the function reaches it by, or None where the search does not find it."""
    first, path = changed[0]
    where = "that the step makes itself" if first.made else where_held(path)
    described = described_tensor(first.tensor, cpu=True)
    if first.crossing:
        return JitError(
            f"{owner}: the step's {first.call} would carry the gradient of a traced torchlax "
            f"Tensor to {described} {where}{_others(changed)}. That gradient would have to "
            "leave the compiled program for the host while the step is traced, which it "
            "cannot (eagerly PyTorch computes it on the CPU). Move the tensor to the 'jax' "
            "device (tensor.to('jax') inside torchlax.enable(); "
            + (
                "make it there, torch.ones(..., device='jax')"
                if first.made
                else "close over it or register it in a module, so it is part of the step's state"
            )
            + "): then the gradient is a value of the program. Or compute this gradient "
            "outside the jitted function. Nothing was changed."
        )
    if first.by_backward:
        what = f"the step's {first.call} gives a .grad to {described} {where}"
    elif first.grad_given and not first.written:
        what = f"the step gives a .grad to {described} {where}"
    else:
        what = f"the step writes into {described} {where} (in place, or through .data)"
    return JitError(
        f"{owner}: {what}{_others(changed)}. A plain CPU tensor is no part of the compiled program: the "
        "change would happen once, on the host, while the step is traced, and never on the "
        "program's calls (a counter would stop counting). Move the tensor to the 'jax' device "
        "(tensor.to('jax') inside torchlax.enable()) and keep it where the step's state is "
        "found (close over it, pass it as an argument, or register it as a module's buffer), "
        "or change it outside the jitted function. The tensor was left as it was before the "
        "call."
    )


def where_held(path: str | None) -> str:
    """Where the function holds a tensor, in words, from its path (``_paths.path_to``;
    None: the search does not find it)."""
    if path is None:
        return "(the function does not reach it within the search)"
    if path.startswith("default argument"):
        return f"held as the function's {path}"
    return f"at {path}"


def _others(changed: list) -> str:
    """The note on how many tensors besides the first one named also changed."""
    others = len(changed) - 1
    return f" ({others} more such tensor{'s' if others > 1 else ''} too)" if others else ""


def described_tensor(t, *, cpu: bool = False) -> str:
    """A tensor in the errors' words: "the [CPU ]float32 tensor of shape (3,)"."""
    device = "CPU " if cpu else ""
    return f"the {device}{str(t.dtype).removeprefix('torch.')} tensor of shape {tuple(t.shape)}"


def _refused_backward_error(trace: TraceWatch, jitted, args, kwargs) -> JitError:
    """The error for a ``backward()`` of the step that would give plain CPU leaves ``.grad``s,
    or a ``backward()`` or ``torch.autograd.grad()`` that would carry a gradient from the
    traced program to a plain CPU tensor (refused before it ran): naming the module, where a
    leaf given a ``.grad`` is the parameter of a module the trace called that is no state,
    else the first tensor, by the path the function reaches it (or as the step's own)."""
    owner = _owner(jitted)
    if not trace.refused_crossing:
        refused = {id(t) for t in trace.refused_leaves}
        untrained = trace.modules.error(owner, jitted.target, args, kwargs, refused)
        if untrained is not None:
            return untrained
    made, call, crossing = trace.trace_made, trace.refused_call, trace.refused_crossing
    named = [
        (
            Changed(t, False, True, None, True, call, crossing, made(t)),
            None if made(t) else path_to(t, jitted.target, args, kwargs),
        )
        for t in trace.refused_leaves
    ]
    return changed_cpu_tensor_error(owner, named)


def _argument_requiring_grad_error(jitted, inputs: list) -> JitError:
    """The error for a step that trains called with a tensor argument that requires grad."""
    k, t = next((k, t) for k, t in enumerate(inputs) if t.requires_grad)
    described = described_tensor(t)
    return JitError(
        f"{_owner(jitted)}: tensor argument {k} ({described}) requires grad, and the step "
        "trains: eagerly its backward() would give that tensor a .grad (or carry gradients "
        "into the graph it was computed by), but an argument is an input of the compiled "
        "program, traced as a value that does not require grad, and no gradient is given back "
        "to it. Close over the tensor or register it in a module as a parameter (then it is "
        "part of the step's state and its .grad is written back), or pass it detached "
        "(tensor.detach())."
    )


def _leaked_tracer_error(jitted) -> JitError:
    return JitError(
        f"{_owner(jitted)}: a tensor from another (finished) trace reached this program. "
        "A value computed inside a compiled function was kept outside it (stored on an object "
        "torchlax does not track as state, or a global list). Return such values from the "
        "function instead, or keep them in a module buffer, an optimizer or a torchlax Tensor "
        "the function closes over."
    )


def _owner(jitted) -> str:
    return f"torchlax.jit({getattr(jitted.target, '__qualname__', type(jitted.target).__name__)})"
