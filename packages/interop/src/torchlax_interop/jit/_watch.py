"""One watch over a step while ``torchlax.jit`` traces it: what the step does that the compiled
program would not do on its calls.

A step runs once, while it is traced; its calls run the program. What no torchlax op carries
into the program happens only in that one run, so it is watched then, through one
registration per trace: a torch function mode (``TraceWatch``, entered around the step: it
sees every torch call of the step), one global module forward pre-hook (it sees every
module call), and the core's op observer (``observing_ops``: each torch function of a torchlax
Tensor), all acting for the tracing thread only. What they see goes to four findings:

- **Constants** (``ConstantWatch``, ``_constants``): the torchlax Tensors the step reached
  that hold concrete arrays (no state); those it changed are put back and refused, those it
  read are checked on each call (``ReadConstants``).

- **Modules trained that are no state** (``ConstantModules``, ``_constant_modules``):
  a module called whose parameters require grad and are not among the state's.
- **Plain CPU tensors changed** (``_cpu_tensors``): each plain CPU tensor a call of the
  step receives that the trace did not make (a result of an earlier call of the trace is its
  own: ``tmp = torch.zeros(3); tmp.add_(1)`` is fine) is noted at first sight; after the step,
  those whose data or ``.grad`` changed are put back and named. A ``backward()`` of the step
  that would give such a tensor a ``.grad`` is refused before it runs (``refused_leaves``), and
  so is a ``backward()`` or ``torch.autograd.grad()`` that would carry a gradient from a traced
  torchlax Tensor to any plain CPU tensor, the trace's own too (it cannot leave the program).
  Those requiring grad that the step reads with grad on are kept
  (``host_tensors_requiring_grad``): a backward after the call would give them no gradient.
- **Backward hooks** (``backward_hooks``): a module's backward or backward pre-hook (full or
  not, its own or PyTorch's global ones) and a hook registered on a tensor of the step
  (``h.register_hook``) run inside autograd's backward of the traced code. When the step calls
  ``backward()`` itself that backward is traced and the hooks are part of the program; when
  the backward runs after the call (a jitted forward), it is ``jax.vjp`` of the program and
  PyTorch's hooks are not in it, so such calls run where the hooks run.

Trace time only: a program's calls never see it. The mode sees every torch call of the trace,
so its handler skips torchlax Tensors first (what it costs a trace: benchmarks/README.md). One
registration per trace means one place decides "this thread only", and one set of bookkeeping.
"""

from __future__ import annotations

import inspect
import threading

import torch
from torch.nn.modules import module as _torch_module
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.overrides import TorchFunctionMode
from torchlax_core import Tensor
from torchlax_core.internal import observing_ops

from ._constant_modules import ConstantModules
from ._constants import ConstantWatch
from ._cpu_tensors import (
    ChangedCpuTensor,
    SeenCpuTensor,
    changed,
    host_targets_of_traced_roots,
    leaves_given_grads,
    restore,
)

_DATA = torch.Tensor.data  # the descriptor: ``t.data``'s getter is a method-wrapper of it
_REGISTER_HOOK = torch.Tensor.register_hook
_REGISTER_POST_ACCUMULATE = torch.Tensor.register_post_accumulate_grad_hook
_BACKWARD = torch.Tensor.backward
_AUTOGRAD_BACKWARD = torch.autograd.backward
_AUTOGRAD_GRAD = torch.autograd.grad
_CALL_NAMES = {
    _AUTOGRAD_GRAD: "torch.autograd.grad()",
    _AUTOGRAD_BACKWARD: "torch.autograd.backward()",
}
# Where each refused call keeps its roots and its inputs (by name: their signatures' own)
_ROOTS_AND_INPUTS = {
    _BACKWARD: ("self", "inputs"),
    _AUTOGRAD_BACKWARD: ("tensors", "inputs"),
    _AUTOGRAD_GRAD: ("outputs", "inputs"),
}


class RefusedBackward(RuntimeError):
    """A ``backward()`` of the traced step would give plain CPU leaves a ``.grad``, or it or a
    ``torch.autograd.grad()`` would carry a gradient from the traced program to a plain CPU
    tensor: raised in the step, before that call runs; the jit replaces it with an error
    naming them (``TraceWatch.refused_leaves``)."""


class TraceWatch(TorchFunctionMode):
    """The watch over one trace (see the module docstring): enter it around the step, then
    read its findings. ``state_parameters``: the ids of the state's parameters."""

    def __init__(self, state_parameters: set[int]):
        super().__init__()
        self._thread = threading.get_ident()
        self.modules = ConstantModules(state_parameters)
        # id -> SeenCpuTensor of a CPU tensor the trace did not make; None for one it made
        self._seen: dict[int, SeenCpuTensor | None] = {}
        # Whether a CPU tensor of the trace requires grad (one noted, or one the trace made):
        # only then can a backward() or autograd.grad() reach a CPU tensor
        self._grad_on_host = False
        # The CPU tensors a refused backward() would have given a .grad, or toward which it or
        # a refused autograd.grad() would have carried a gradient from the traced program;
        # the call refused, in words; whether it was refused for the latter (``crossing``)
        self.refused_leaves: list[torch.Tensor] = []
        self.refused_call = "backward()"
        self.refused_crossing = False
        # What runs in autograd's backward of the traced code, in words ("the full backward
        # hook 'halve' of the Linear"), first met first
        self.backward_hooks: list[str] = []
        # The plain CPU tensors requiring grad the step read, first met first: constants of the
        # program, which a backward after the call (jax.vjp of it) would give no gradient
        self.host_tensors_requiring_grad: list[torch.Tensor] = []
        self._called_modules: set[int] = set()
        self._module_handle = None
        # The torchlax Tensors the step reached that hold concrete arrays (its constants),
        # seen through the core's op observer while the watch is entered
        self.constants = ConstantWatch()
        self._observing = observing_ops(self.constants)

    def __enter__(self):
        self._observing.__enter__()
        self._module_handle = register_module_forward_pre_hook(self._module_called)
        for kind, hooks in (
            ("global full backward", _torch_module._global_backward_hooks),
            ("global backward pre-", _torch_module._global_backward_pre_hooks),
        ):
            self.backward_hooks.extend(f"the {kind}hook {_name(h)}" for h in hooks.values())
        return super().__enter__()

    def __exit__(self, *exc):
        assert self._module_handle is not None
        self._module_handle.remove()
        try:
            return super().__exit__(*exc)
        finally:
            self._observing.__exit__(*exc)

    # -- findings --------------------------------------------------------------------------

    def changed_cpu_tensors(self) -> list[ChangedCpuTensor]:
        """The CPU tensors still alive whose data or ``.grad`` the traced step changed."""
        return changed(self._seen.values())

    @staticmethod
    def restore(changed: list[ChangedCpuTensor]) -> None:
        """Put back the data and ``.grad`` each of ``changed`` held when first seen."""
        restore(changed)

    # -- what the watch sees ---------------------------------------------------------------

    def _module_called(self, module: torch.nn.Module, _args) -> None:
        if threading.get_ident() != self._thread or id(module) in self._called_modules:
            return
        self._called_modules.add(id(module))
        self.modules.called(module)
        if module._backward_hooks or module._backward_pre_hooks:
            full = "full " if module._is_full_backward_hook else ""
            owner = f"of the {type(module).__name__}"
            self.backward_hooks.extend(
                f"the {full}backward hook {_name(h)} {owner}"
                for h in module._backward_hooks.values()
            )
            self.backward_hooks.extend(
                f"the backward pre-hook {_name(h)} {owner}"
                for h in module._backward_pre_hooks.values()
            )

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if threading.get_ident() == self._thread:
            self._see(args)
            if kwargs:
                self._see(tuple(kwargs.values()))
            if func is _REGISTER_HOOK or func is _REGISTER_POST_ACCUMULATE:  # (no hashing)
                hook = args[1] if len(args) > 1 else next(iter(kwargs.values()), None)
                self.backward_hooks.append(
                    f"the hook {_name(hook)} registered on a tensor of the step ({func.__name__})"
                )
            elif self._grad_on_host and func in _ROOTS_AND_INPUTS:
                self._refuse_backward_to_host(func, args, kwargs)
        result = func(*args, **kwargs)
        if type(result) is torch.Tensor:  # (rare in a trace: most results are torchlax's)
            if result.requires_grad:  # (``torch.ones(3, requires_grad=True)``, ``w * 2``)
                self._grad_on_host = True
            if getattr(func, "__self__", None) is _DATA:
                # ``t.data``: an alias of t's storage with a version counter of its own, so a
                # write through it (``t.data.add_(1)``) is t's, and seen as such.
                origin = self._seen.get(id(args[0]))
                if origin is not None:
                    self._seen[id(result)] = SeenCpuTensor(result, origin.ref)
                return result
            self._seen.setdefault(id(result), None)  # the trace's own tensor
        elif type(result) is tuple or type(result) is list:
            for r in result:
                if type(r) is torch.Tensor:
                    self._seen.setdefault(id(r), None)
                    if r.requires_grad:
                        self._grad_on_host = True
        return result

    def _see(self, values: tuple) -> None:
        seen = self._seen
        for a in values:
            cls = type(a)
            if cls is Tensor:  # (most arguments of a trace: a torchlax Tensor, skipped first)
                continue
            if cls is list or cls is tuple:
                for t in a:
                    if isinstance(t, torch.Tensor) and not isinstance(t, Tensor):
                        if id(t) not in seen and t.device.type == "cpu":
                            self._note(t)
            elif isinstance(a, torch.Tensor) and not isinstance(a, Tensor):
                if id(a) not in seen and a.device.type == "cpu":
                    self._note(a)

    def _note(self, t: torch.Tensor) -> None:
        self._seen[id(t)] = SeenCpuTensor(t)
        if t.requires_grad:
            self._grad_on_host = True
            if torch.is_grad_enabled():  # (read under no_grad, it carries no gradient)
                self.host_tensors_requiring_grad.append(t)

    def _refuse_backward_to_host(self, func, args: tuple, kwargs: dict) -> None:
        """Raise ``RefusedBackward`` if this ``backward()`` would give a CPU leaf the trace did
        not make a ``.grad`` (it would be given once, on the host, while the step is traced),
        or if it or this ``torch.autograd.grad()`` would carry a gradient from a traced
        torchlax Tensor to a plain CPU tensor, made by the trace or not (it cannot leave the
        traced program). A ``torch.autograd.grad()`` on the host alone (a CPU loss) is fine:
        its result is a value of the trace, as eagerly."""
        roots_name, inputs_name = _ROOTS_AND_INPUTS[func]
        bound = inspect.signature(func).bind(*args, **kwargs).arguments
        roots, inputs = bound.get(roots_name, ()), bound.get(inputs_name)
        call = _CALL_NAMES.get(func, "backward()")
        leaves = [] if func is _AUTOGRAD_GRAD else leaves_given_grads(roots, inputs, self.made)
        crossing = not leaves
        if crossing:
            leaves = host_targets_of_traced_roots(roots, inputs)
        if leaves:
            self.refused_leaves = leaves
            self.refused_call = call
            self.refused_crossing = crossing
            raise RefusedBackward(
                f"torchlax.jit: a {call} of the traced step would give a .grad to, or carry a "
                "gradient from the traced program to, a plain CPU tensor; it is refused (the "
                "jit names the tensor)."
            )

    def made(self, t: torch.Tensor) -> bool:
        """Whether the trace made ``t`` (a result of one of its calls)."""
        return id(t) in self._seen and self._seen[id(t)] is None


def _name(hook) -> str:
    return repr(getattr(hook, "__qualname__", type(hook).__name__))
