"""The errors by which ``torchlax.jit`` refuses a step (``JitError``s), each naming what the step
did, the tensor or module by the path the function reaches it by (``_walk.path_to``), and what
to do. The trace watch (``_watch``) finds what the step did and puts it back; this module only
words the errors: a tensor's change by one table (``_DID``: what the step did, by kind), then
why that cannot be part of the program and what to do, for a constant or a plain CPU tensor.
"""

from __future__ import annotations

import torch
from torchlax_core import JitError, Tensor

from ._discover import MAX_CONTAINER_ITEMS, MAX_STATE_DEPTH, MAX_WALKED_ITEMS

# Where the state walk (``_discover``) looks, for the errors about what it did not find.
_STATE_IS_FOUND = (
    "torchlax.jit makes state of the tensors the function closes over or receives as "
    "arguments and of the modules and optimizers it reaches (through closures, globals, "
    "arguments, a bound method's object, and the lists, tuples, dicts and objects' attributes "
    f"these hold, up to {MAX_STATE_DEPTH} levels deep, {MAX_CONTAINER_ITEMS} items per "
    f"container or object and {MAX_WALKED_ITEMS} in all; not inside data loaders, datasets, "
    "loggers or threads; a plain object's own tensors are not state, see docs/training.md)"
)
_NOT_STATE = "which is not part of the compiled step's state"

# What the step did to a tensor that is no state, by kind ({held}: the tensor and where the
# function holds it; {call}: a refused backward's call, which did not run).
_DID = {
    "write": "the step writes into {held} (in place, or through .data)",
    "grad": "the step gives a .grad to {held}",
    "backward": "the step's {call} gives a .grad to {held}",
    "crossing": "the step's {call} would carry the gradient of a traced torchlax Tensor to {held}",
}
# Why a constant's change cannot be part of the program, by kind, and what to do
_CONSTANT = {
    "write": "the write would happen once, while the step is traced, not on each call",
    "grad": "it would not train, and its .grad would be a value of the finished trace",
}
_KEEP_AS_STATE = (
    "Pass the tensor as an argument, close over it directly, register it in a module the step "
    "uses (nn.Parameter or register_buffer), or give it to an optimizer the step steps. The "
    "tensor was left as it was before the call."
)
_ON_HOST = (
    "A plain CPU tensor is no part of the compiled program: the change would happen once, on "
    "the host, while the step is traced, and never on the program's calls (a counter would "
    "stop counting). Move the tensor to the 'jax' device (tensor.to('jax') inside "
    "torchlax.enable()) and keep it where the step's state is found (close over it, pass it as "
    "an argument, or register it as a module's buffer), or change it outside the jitted "
    "function. The tensor was left as it was before the call."
)


def changed_tensor_error(
    owner: str, kind: str, named: list[tuple], call: str = "", made: bool = False
) -> JitError:
    """The error for the tensors that are no state the traced step changed (or a refused
    ``backward()`` would have, ``call``), ``named`` each with its path or None, the first
    one in words: a torchlax Tensor (a constant of the program) or a plain CPU tensor
    (``made``: one the step makes itself). ``kind``: what the step did, a key of ``_DID``."""
    t, path = named[0]
    cpu = not isinstance(t, Tensor)
    held = f"{described_tensor(t, cpu=cpu)} {where_held(path, made)}"
    did = _DID[kind].format(held=held, call=call)
    others = len(named) - 1
    others = f" ({others} more such tensor{'s' if others > 1 else ''} too)" if others else ""
    if not cpu:
        grad = f" (requires_grad={t.requires_grad})" if kind == "grad" else ""
        return JitError(
            f"{owner}: {did}{grad}, {_NOT_STATE}: it is a constant of the program, so "
            f"{_CONSTANT[kind]}{others}. {_STATE_IS_FOUND}. {_KEEP_AS_STATE}"
        )
    did += others
    if kind != "crossing":
        return JitError(f"{owner}: {did}. {_ON_HOST}")
    keep = (
        "make it there, torch.ones(..., device='jax')"
        if made
        else "close over it or register it in a module, so it is part of the step's state"
    )
    return JitError(
        f"{owner}: {did}. That gradient would have to leave the compiled program for the host "
        "while the step is traced, which it cannot (eagerly PyTorch computes it on the CPU). "
        f"Move the tensor to the 'jax' device (tensor.to('jax') inside torchlax.enable(); "
        f"{keep}): then the gradient is a value of the program. Or compute this gradient "
        "outside the jitted function. Nothing was changed."
    )


def unfound_state_error(owner: str, obj, path: str | None = None) -> JitError:
    """The error for an optimizer the step steps, or a module it computes gradients for (at
    ``path``), that is no state."""
    name, which = type(obj).__name__, "optimizer"
    if isinstance(obj, torch.optim.Optimizer):
        what = f"calls {name}.step() on an optimizer that is not part of the compiled step's state"
    else:
        where = ("called inside the step " if path is None else "") + where_held(path)
        what = (
            f"computes gradients for the parameters of the {name} {where}, {_NOT_STATE}: its "
            "parameters would be constants of the program, and it would not train"
        )
        which = "module (or its optimizer)"
    return JitError(
        f"{owner}: the step {what}. {_STATE_IS_FOUND}. Close over the {which} directly, or pass "
        "it as an argument of the jitted function."
    )


def returned_object_error(owner: str, obj, where: str, what: str) -> JitError:
    """The error for a returned object at ``where`` whose tensors the program cannot return
    (``what``: what it holds, or why it cannot be rebuilt)."""
    return JitError(
        f"{owner}: the returned {type(obj).__qualname__} at {where} {what}. The program can "
        "only return tensors it can find and put back. Return tensors or a pytree of them "
        "instead, register the type with torch.utils._pytree.register_pytree_node, or, for a "
        "transformers model's cache, call it with use_cache=False."
    )


def where_held(path: str | None, made: bool = False) -> str:
    """Where the function holds a tensor, in words, from its path (None: not found; ``made``:
    the step made it)."""
    if made:
        return "that the step makes itself"
    if path is None:
        return "(the function does not reach it within the search)"
    if path.startswith("default argument"):
        return f"held as the function's {path}"
    return f"at {path}"


def described_tensor(t, *, cpu: bool = False) -> str:
    """A tensor in the errors' words: "the [CPU ]float32 tensor of shape (3,)"."""
    device = "CPU " if cpu else ""
    return f"the {device}{str(t.dtype).removeprefix('torch.')} tensor of shape {tuple(t.shape)}"


def _argument_requiring_grad_error(jitted, inputs: list) -> JitError:
    """The error for a step that trains called with a tensor argument that requires grad."""
    k, t = next((k, t) for k, t in enumerate(inputs) if t.requires_grad)
    return JitError(
        f"{_owner(jitted)}: tensor argument {k} ({described_tensor(t)}) requires grad, and the "
        "step trains: eagerly its backward() would give that tensor a .grad (or carry "
        "gradients into the graph it was computed by), but an argument is an input of the "
        "compiled program, traced as a value that does not require grad, and no gradient is "
        "given back to it. Close over the tensor or register it in a module as a parameter "
        "(then it is part of the step's state and its .grad is written back), or pass it "
        "detached (tensor.detach())."
    )


def _owner(jitted) -> str:
    return f"torchlax.jit({getattr(jitted.target, '__qualname__', type(jitted.target).__name__)})"
