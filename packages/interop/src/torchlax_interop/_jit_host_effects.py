"""What a traced step does on the host that the compiled program would not do on its calls.

A step runs once, while it is traced; its calls run the program. Two kinds of effect happen
only in that one run, because no torchlax op carries them into the program, so they are
watched while the step is traced (``HostEffects``, this thread only):

- **Writes into plain CPU tensors.** A plain ``torch.Tensor`` on the CPU that the step
  reaches (``counter = torch.zeros(())``, a global or a closure, a module's plain attribute)
  is no state of the program, and the core's constant watch sees torchlax Tensors only. A
  write into one (``counter.add_(1)``, ``hist[i] = 1``, ``t.data.add_(1)``, ``t.data =
  other``) or a ``.grad`` given to one happens once, on the host: in eager PyTorch the counter
  counts, under ``torchlax.jit`` it would stop at its trace-time value. Each plain CPU tensor
  a call of the step receives that the trace did not make (a result of an earlier call of the
  trace is its own: ``tmp = torch.zeros(3); tmp.add_(1)`` is fine) is noted at first sight
  with its version counter, a copy of its value, its storage and its ``.grad``; ``changed()``
  lists those that changed and ``restore()`` puts back what they held, so the caller can
  refuse the program naming them.
- **Backward hooks.** A module's backward or backward pre-hook (full or not, its own or
  PyTorch's global ones) and a hook registered on a tensor of the step (``h.register_hook``)
  run inside autograd's backward of the traced code. When the step calls ``backward()``
  itself that backward is traced and the hooks are part of the program; when the backward
  runs after the call (a jitted forward), it is ``jax.vjp`` of the program and PyTorch's
  hooks are not in it. ``backward_hooks`` names those the step met, so such calls can run
  where the hooks run.

Trace time only: a program's calls never see it. A torch function mode sees every torch call
of the trace, so its handler skips torchlax Tensors first (the 2-layer GPT-2 + AdamW step's
trace: +1-3% CPU, min of 5 interleaved runs on a loaded machine; +5% before that skip).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

import torch
from torch.nn.modules import module as _torch_module
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.overrides import TorchFunctionMode
from torchlax_core import Tensor

_DATA = torch.Tensor.data  # the descriptor: ``t.data``'s getter is a method-wrapper of it
_REGISTER_HOOK = torch.Tensor.register_hook
_REGISTER_POST_ACCUMULATE = torch.Tensor.register_post_accumulate_grad_hook


class _Seen:
    """A CPU tensor as first seen: the tensor (weakly), its version counter, an alias of its
    data (the storage and layout ``t.data = other`` would replace), a copy of its value and
    its ``.grad``."""

    __slots__ = ("ref", "origin", "version", "alias", "value", "grad")

    def __init__(self, t: torch.Tensor, origin: Callable | None = None):
        # (``t.data`` is a temporary: held here, so that a write through it is still seen)
        self.ref: Callable = weakref.ref(t) if origin is None else lambda: t
        self.origin = origin  # for ``t.data``: t (the tensor to name)
        self.version = _version(t)
        with torch.no_grad():
            self.alias = t.detach()
            self.value = self.alias.clone()
        self.grad = t.grad if t.is_leaf else None


class ChangedCpuTensor:
    """A CPU tensor the traced step changed: ``tensor``, and whether its data (``written``) or
    its ``.grad`` (``grad_given``) changed."""

    __slots__ = ("tensor", "written", "grad_given", "first_seen")

    def __init__(self, tensor: torch.Tensor, written: bool, grad_given: bool, seen: _Seen):
        self.tensor = tensor
        self.written = written
        self.grad_given = grad_given
        self.first_seen = seen  # what it held when first seen


class HostEffects(TorchFunctionMode):
    """The host effects of one trace (see the module docstring): enter it around the step."""

    def __init__(self):
        super().__init__()
        self._thread = threading.get_ident()
        # id -> _Seen of a CPU tensor the trace did not make; None for one it made
        self._seen: dict[int, _Seen | None] = {}
        # What runs in autograd's backward of the traced code, in words ("the full backward
        # hook 'halve' of the Linear"), first met first
        self.backward_hooks: list[str] = []
        self._hooked_modules: set[int] = set()
        self._module_handle = None

    def __enter__(self):
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
        return super().__exit__(*exc)

    def _module_called(self, module: torch.nn.Module, _args) -> None:
        if threading.get_ident() != self._thread or id(module) in self._hooked_modules:
            return
        if module._backward_hooks or module._backward_pre_hooks:
            self._hooked_modules.add(id(module))
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
        result = func(*args, **kwargs)
        if type(result) is torch.Tensor:  # (rare in a trace: most results are torchlax's)
            if getattr(func, "__self__", None) is _DATA:
                # ``t.data``: an alias of t's storage with a version counter of its own, so a
                # write through it (``t.data.add_(1)``) is t's, and seen as such.
                origin = self._seen.get(id(args[0]))
                if origin is not None:
                    self._seen[id(result)] = _Seen(result, origin.ref)
                return result
            self._seen.setdefault(id(result), None)  # the trace's own tensor
        elif type(result) is tuple or type(result) is list:
            for r in result:
                if type(r) is torch.Tensor:
                    self._seen.setdefault(id(r), None)
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
                            seen[id(t)] = _Seen(t)
            elif isinstance(a, torch.Tensor) and not isinstance(a, Tensor):
                if id(a) not in seen and a.device.type == "cpu":
                    seen[id(a)] = _Seen(a)

    def changed(self) -> list[ChangedCpuTensor]:
        """The CPU tensors still alive whose data or ``.grad`` the traced step changed."""
        changed = []
        for seen in self._seen.values():
            if seen is None:
                continue
            t = seen.ref()
            if t is None:
                continue
            written = _version(t) != seen.version or not _same_data(t, seen.alias)
            grad_given = (t.grad if t.is_leaf else None) is not seen.grad
            if written or grad_given:
                origin = seen.origin() if seen.origin is not None else None
                changed.append(ChangedCpuTensor(origin or t, written, grad_given, seen))
        return changed

    @staticmethod
    def restore(changed: list[ChangedCpuTensor]) -> None:
        """Put back the data and ``.grad`` each of ``changed`` held when first seen."""
        with torch.no_grad():
            for c in changed:
                seen = c.first_seen
                t = seen.ref() if seen.origin is not None else c.tensor  # (the alias written)
                if t is None:
                    continue
                if c.written:
                    if not _same_data(t, seen.alias):  # ``t.data = other``
                        t.data = seen.alias
                    seen.alias.copy_(seen.value)
                if c.grad_given:
                    t.grad = seen.grad


def _name(hook) -> str:
    return repr(getattr(hook, "__qualname__", type(hook).__name__))


def _version(t: torch.Tensor) -> int:
    try:
        return t._version
    except RuntimeError:  # an inference tensor: it cannot be written outside inference mode
        return -1


def _same_data(t: torch.Tensor, alias: torch.Tensor) -> bool:
    return bool(
        t.untyped_storage().data_ptr() == alias.untyped_storage().data_ptr()
        and t.shape == alias.shape
        and t.stride() == alias.stride()
        and t.storage_offset() == alias.storage_offset()
    )
