"""Checking a third-party plugin's lowerings against PyTorch's meta kernels.

A lowering that returns the wrong shape or dtype (float16 for a float32 op, a transposed
result), ``None`` or a NumPy array would flow on silently, so the first call of each input
signature (shapes, dtypes and the non-tensor arguments) of each op runs the op's meta (or
fake) kernel on meta tensors of the same shapes and dtypes and compares. Later calls with a
seen signature cost one signature computation. torchlax's own lowerings are not wrapped (see
``Environment._checked``): they are tested against PyTorch, and the hot path pays nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.core
import numpy as np
import torch
from torch.utils import _pytree as pytree

from ._dtypes import jax_dtype, torch_dtype
from ._errors import PluginError
from ._registry import Lowering, op_name


def checked(func, entry: Lowering) -> Callable:
    """``entry.fn`` wrapped to check its outputs against ``func``'s meta kernel."""
    fn = entry.fn
    arrays = entry.kind == "lowering"  # lowerings see jax.Arrays; decompositions torch tensors
    seen: set = set()

    def checked_fn(*args, **kwargs):
        out = fn(*args, **kwargs)
        key = _signature(args, kwargs)
        if key is None or key not in seen:
            _check(func, entry, args, kwargs, out, arrays)
            if key is not None:
                seen.add(key)
        return out

    checked_fn.__wrapped__ = fn  # pyright: ignore[reportFunctionMemberAccess]  (what functools.wraps would set)
    return checked_fn


def _is_array(x) -> bool:
    return isinstance(x, jax.Array | jax.core.Tracer)


def _signature(args, kwargs):
    leaves, spec = pytree.tree_flatten((args, kwargs))
    key = []
    for leaf in leaves:
        if _is_array(leaf) or isinstance(leaf, torch.Tensor):
            key.append((tuple(leaf.shape), str(leaf.dtype)))
        else:
            key.append((type(leaf), leaf))
    key.append(len(leaves))
    try:
        key = tuple(key)
        hash(key)
    except TypeError:  # an unhashable argument: check every call rather than never
        return None
    return key


def _to_meta(x):
    if _is_array(x):
        try:
            dtype = torch_dtype(x.dtype)
        except Exception:  # a PRNG key or another dtype torch has no name for
            raise _Unverifiable from None
        return torch.empty(tuple(x.shape), dtype=dtype, device="meta")
    if isinstance(x, torch.Tensor):
        return torch.empty(tuple(x.shape), dtype=x.dtype, device="meta")
    if isinstance(x, torch.Generator):
        raise _Unverifiable  # meta kernels take no CPU generator
    return x


class _Unverifiable(Exception):
    pass


def _expected(func, args, kwargs):
    """What PyTorch's meta kernel returns for these argument shapes, or None if it cannot say."""
    try:
        meta_args, meta_kwargs = pytree.tree_map(_to_meta, (args, kwargs))
    except _Unverifiable:
        return None
    try:
        with torch._C._DisableTorchDispatch(), torch.no_grad():
            return func(*meta_args, **meta_kwargs)
    except Exception:  # no meta kernel, or a data-dependent output shape (nonzero, unique)
        return None


def _describe(x) -> str:
    if x is None:
        return "None"
    if isinstance(x, torch.Tensor):
        return f"{str(x.dtype).replace('torch.', '')}{list(x.shape)}"
    if _is_array(x) or isinstance(x, np.ndarray):
        kind = "a NumPy array " if isinstance(x, np.ndarray) else ""
        return f"{kind}{np.dtype(x.dtype).name}{list(x.shape)}"
    kind = type(x).__name__
    return f"{'an' if kind[0] in 'aeiouAEIOU' else 'a'} {kind} ({x!r:.60})"


def _check(func, entry: Lowering, args, kwargs, out, arrays: bool) -> None:
    if not isinstance(func, torch._ops.OpOverload):
        return
    expected = _expected(func, args, kwargs)
    if expected is None and not func._schema.returns:
        return
    if expected is None:
        _check_without_meta(func, entry, out, arrays)
        return
    want = pytree.tree_leaves(expected)
    got = list(_leaves(out))
    if len(got) != len(want):
        _fail(
            func,
            entry,
            f"returned {len(got)} value(s) ({', '.join(map(_describe, got))})",
            "its outputs",
            f"{len(want)} ({', '.join(map(_describe, want))})",
        )
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if not isinstance(w, torch.Tensor):
            continue
        where = f"output {i}" if len(want) > 1 else "its output"
        if arrays:
            if isinstance(g, np.ndarray) or not _is_array(g):
                _fail(func, entry, f"returned {_describe(g)}{_hint(g)}", where, _describe(w))
            try:
                same_dtype = np.dtype(g.dtype) == np.dtype(jax_dtype(w.dtype))
            except Exception:
                same_dtype = True  # a dtype one side cannot name: not ours to judge
        else:
            if not isinstance(g, torch.Tensor):
                _fail(func, entry, f"returned {_describe(g)}", where, _describe(w))
            same_dtype = g.dtype == w.dtype
        if tuple(g.shape) != tuple(w.shape) or not same_dtype:
            _fail(func, entry, f"returned {_describe(g)}", where, _describe(w))


def _check_without_meta(func, entry: Lowering, out, arrays: bool) -> None:
    """An op with no meta kernel: no shapes to compare with, but a result is there and, from a
    lowering, made of jax.Arrays (or Python numbers)."""
    if out is None:
        _fail(func, entry, "returned None", "output 0", "a tensor")
    if not arrays:
        return
    for g in _leaves(out):
        if isinstance(g, np.ndarray) or not (
            g is None or _is_array(g) or isinstance(g, bool | int | float | complex)
        ):
            _fail_kind(func, entry, g)


def _hint(g) -> str:
    if isinstance(g, np.ndarray):
        return " (lowerings must return jax.Array: use jnp.asarray, not np)"
    return ""


def _fail_kind(func, entry: Lowering, g) -> None:
    raise PluginError(
        f"Plugin {entry.plugin!r}'s {entry.kind} of {op_name(func)} returned {_describe(g)}"
        f"{_hint(g)}, where a lowering returns jax.Arrays (which become tensors). Fix the "
        f"{entry.kind}, or run without the plugin (TORCHLAX_BLOCK_PLUGINS={entry.plugin})."
    )


def _leaves(out):
    if type(out) is list or type(out) is tuple:
        for x in out:
            yield from _leaves(x)
    else:
        yield out


def _fail(func, entry: Lowering, what: str, where: str, want: str) -> None:
    raise PluginError(
        f"Plugin {entry.plugin!r}'s {entry.kind} of {op_name(func)} {what} for {where}, but "
        f"PyTorch's meta kernel for these inputs gives {want}. Fix the {entry.kind} (its "
        "results must match the op's schema: same shapes and dtypes as PyTorch), or run "
        f"without the plugin (TORCHLAX_BLOCK_PLUGINS={entry.plugin})."
    )
