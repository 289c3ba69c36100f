"""``torchlax.explain``: which ATen ops a program uses and who lowers each, before it runs.

The program runs once on fake tensors placed on the ``jax`` device (shapes and dtypes only, no
data, nothing on JAX), so PyTorch takes the same paths it takes for torchlax Tensors: the
composite ops decompose, dropout picks ``native_dropout``, ``backward()`` records the backward
ops. Each ATen op that reaches the ``jax`` device is looked up the way the core resolves it:
its own lowering or decomposition, else the one of its functional form (``add_`` and ``add.out``
are derived from ``add.Tensor``), else PyTorch's composite kernel; decompositions are followed
into the ops they call.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.utils.stateless import _reparametrize_module
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torchlax_core import default_env
from torchlax_core.internal import op_name

__all__ = ["Explanation", "OpUse", "explain"]


@dataclasses.dataclass
class OpUse:
    """One ATen op the program uses.

    ``how`` is ``"lowering"``, ``"decomposition"``, ``"function"``, ``"composite"`` (PyTorch's
    CompositeImplicitAutograd kernel, whose ops are listed too), ``"fallback"`` (no lowering;
    runs with PyTorch on the CPU since ``config.fallback_to_torch`` is on) or ``"missing"``.
    """

    op: Any
    plugin: str | None
    how: str
    count: int = 0
    derived_from: Any = None  # the functional op an in-place/out= op is derived from
    via: set = dataclasses.field(
        default_factory=set
    )  # decompositions calling it (None: the program)

    @property
    def name(self) -> str:
        return op_name(self.op)

    @property
    def lowered(self) -> bool:
        return self.how not in ("missing", "fallback")


@dataclasses.dataclass
class Explanation:
    """What ``explain`` found: ``ops`` in order of first use, ``missing`` those nothing lowers."""

    ops: list[OpUse]
    error: str | None = None  # set when tracing stopped early (the ops seen so far are listed)
    grad_enabled: bool = True  # the grad mode traced: modules take other paths under no_grad

    @property
    def missing(self) -> list[OpUse]:
        return [use for use in self.ops if not use.lowered]

    @property
    def ok(self) -> bool:
        return not self.missing and self.error is None

    def __str__(self) -> str:
        rows = [("op", "calls", "handled by", "how")]
        for use in self.ops:
            how = use.how
            if use.derived_from is not None:
                how += f" (derived from {op_name(use.derived_from)})"
            if None not in use.via:
                how += f" (inside {', '.join(sorted(use.via))})"
            rows.append((use.name, str(use.count), use.plugin or "-", how))
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = [
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            for row in rows
        ]
        lines.insert(1, "  ".join("-" * w for w in widths))
        lowered = len(self.ops) - len(self.missing)
        lines.append("")
        lines.append(
            f"{len(self.ops)} ATen ops, {lowered} lowered, {len(self.missing)} not lowered"
            + (": " + ", ".join(u.name for u in self.missing) if self.missing else ".")
        )
        lines.append(
            f"Traced with gradients {'enabled' if self.grad_enabled else 'disabled'}: "
            "call explain in the mode you will run (e.g. under torch.no_grad() for "
            "inference, where eval-mode Transformer layers use fused kernels)."
        )
        if self.error:
            lines.append(f"Tracing stopped early: {self.error}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (
            f"Explanation({len(self.ops)} ops, missing="
            f"{[u.name for u in self.missing]!r}{', error=...' if self.error else ''})"
        )


_BUILTIN_PREFIX = "torchlax."


class _Recorder(TorchDispatchMode):
    def __init__(self, env, uses: dict, via: str | None = None):
        super().__init__()
        self.env = env
        self.uses = uses
        self.via = via

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "prim" or not _on_jax(args, kwargs):  # prim.device: metadata
            return func(*args, **kwargs)
        use = self._record(func)
        if use.how == "decomposition" and not (use.plugin or "").startswith(_BUILTIN_PREFIX):
            entry = self.env.lowering_for(func)
            try:
                with _Recorder(self.env, self.uses, via=use.name):
                    if use.derived_from is None:
                        return entry.fn(*args, **kwargs)
                    # In-place/out= form: record the functional decomposition's ops, then let
                    # the op itself produce the (fake) result.
                    entry.fn(*args, **_without_outs(func, kwargs))
            except Exception:  # a decomposition that cannot run on fake tensors: trust the op
                pass
            return func(*args, **kwargs)
        if use.how == "composite":
            with _Recorder(self.env, self.uses, via=use.name):
                return func.decompose(*args, **kwargs)
        return _run_fake(func, args, kwargs)

    def _record(self, func) -> OpUse:
        use = self.uses.get(func)
        if use is None:
            use = _classify(self.env, func)
            self.uses[func] = use
        use.via.add(self.via)
        use.count += 1
        return use


def _run_fake(func, args, kwargs):
    """``func`` on the fake jax tensors; if its fake kernel fails there, on fake CPU tensors.

    A missing op must not end the trace (the ops after it are what the user wants listed):
    ops with no meta kernel for the ``jax`` device, or none at all, get their output
    metadata on the CPU, where ``FakeTensorMode`` can also run the real kernel on zeros.
    """
    try:
        return func(*args, **kwargs)
    except Exception as exc:
        first_error = exc
    originals: dict[int, torch.Tensor] = {}

    def to_cpu(x):
        if isinstance(x, torch.Tensor) and x.device.type == "jax":
            cpu = torch.empty_strided(
                tuple(x.shape), tuple(x.stride()), dtype=x.dtype, device="cpu"
            )
            originals[id(cpu)] = x
            return cpu
        if isinstance(x, torch.device) and x.type == "jax":
            return torch.device("cpu")
        return x

    def to_jax(x):
        if not isinstance(x, torch.Tensor):
            return x
        if id(x) in originals:  # an in-place op's result is its argument
            return originals[id(x)]
        return torch.empty_strided(tuple(x.shape), tuple(x.stride()), dtype=x.dtype, device="jax")

    cpu_args, cpu_kwargs = pytree.tree_map(to_cpu, (args, kwargs))
    if isinstance(cpu_kwargs.get("device"), str) and cpu_kwargs["device"].startswith("jax"):
        cpu_kwargs["device"] = "cpu"
    try:
        out = func(*cpu_args, **cpu_kwargs)
    except Exception:
        raise _ShapeUnknown(func, first_error) from first_error
    return pytree.tree_map(to_jax, out)


class _ShapeUnknown(RuntimeError):
    def __init__(self, func, error):
        super().__init__(
            f"{op_name(func)} has no meta or fake kernel PyTorch can run without values, so the "
            f"shapes after it are unknown ({type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''})"
        )


def _without_outs(func, kwargs):
    outs = {a.name for a in func._schema.arguments if a.is_out}
    return {k: v for k, v in kwargs.items() if k not in outs}


def _classify(env, func) -> OpUse:
    entry = env.lowering_for(func)
    if entry is not None:
        derived = (
            entry.op if entry.op not in (func, getattr(func, "overloadpacket", None)) else None
        )
        return OpUse(func, entry.plugin, entry.kind, derived_from=derived)
    if _is_composite(func):
        return OpUse(func, "torch", "composite")
    if env.config.fallback_to_torch:
        return OpUse(func, "torchlax.fallback", "fallback")
    return OpUse(func, None, "missing")


def _is_composite(func) -> bool:
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(
            func.name(), "CompositeImplicitAutograd"
        )
    except RuntimeError:  # not a dispatcher op
        return False


def _on_jax(args, kwargs) -> bool:
    for x in pytree.tree_leaves((args, kwargs)):
        if isinstance(x, torch.Tensor) and x.device.type == "jax":
            return True
        if isinstance(x, torch.device) and x.type == "jax":
            return True
    device = kwargs.get("device")
    return isinstance(device, str) and device.startswith("jax")


def _fake_like(mode: FakeTensorMode, t: torch.Tensor) -> torch.Tensor:
    with mode:
        fake = torch.empty(tuple(t.shape), dtype=t.dtype, device="jax")
    if t.requires_grad:
        fake.requires_grad_(True)
    return fake


def explain(
    fn_or_module: Callable | torch.nn.Module, *example_args, env=None, **example_kwargs
) -> Explanation:
    """List the ATen ops ``fn_or_module(*example_args, **example_kwargs)`` uses on torchlax.

    Runs the call once on fake tensors on the ``jax`` device (CPU or torchlax example tensors
    both work; only shapes and dtypes matter), so nothing executes on JAX. Returns an
    ``Explanation``: ``print(it)`` shows a table of ops, how often each is called and which
    plugin lowers it; ``.missing`` lists every op nothing lowers (an op with no meta kernel
    does not stop the trace: its shapes come from the CPU). A function may call
    ``loss.backward()`` to include the backward ops. The call runs in the current grad mode:
    call ``explain`` under ``torch.no_grad()`` for a program you will run under it.
    """
    env = env or default_env()
    mode = FakeTensorMode(allow_non_fake_inputs=True)

    def fake(x):
        return _fake_like(mode, x) if isinstance(x, torch.Tensor) else x

    args, kwargs = pytree.tree_map(fake, (example_args, example_kwargs))
    uses: dict[Any, OpUse] = {}
    error = None
    with contextlib.ExitStack() as stack:
        # Modules (the callable itself, example arguments, closure variables) run with fake
        # parameters and buffers on the jax device, as if moved there with .to("jax").
        fakes: dict[int, torch.Tensor] = {}
        for module in _modules_of(fn_or_module, example_args, example_kwargs):
            state = {
                name: fakes.setdefault(id(t), fake(t))
                for name, t in [
                    *module.named_parameters(remove_duplicate=False),
                    *module.named_buffers(remove_duplicate=False),
                ]
            }
            stack.enter_context(_reparametrize_module(module, state))
        stack.enter_context(mode)
        stack.enter_context(_Recorder(env, uses))
        try:
            fn_or_module(*args, **kwargs)
        except Exception as exc:  # keep what was seen; say where tracing stopped
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return Explanation(list(uses.values()), error, grad_enabled=torch.is_grad_enabled())


def _modules_of(fn, args, kwargs) -> list[torch.nn.Module]:
    candidates = [fn, *args, *kwargs.values(), getattr(fn, "__self__", None)]
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            candidates.append(cell.cell_contents)
        except ValueError:  # an empty cell
            continue
    code, globals_ = getattr(fn, "__code__", None), getattr(fn, "__globals__", {})
    if code is not None:  # modules the function reads as globals
        candidates += [globals_.get(name) for name in code.co_names]
    found: dict[int, torch.nn.Module] = {}
    for c in candidates:
        if isinstance(c, torch.nn.Module):
            found.setdefault(id(c), c)
    return list(found.values())
