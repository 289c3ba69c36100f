"""PyTorch's refusal of an in-place write into a tensor whose elements share memory.

``x = torch.zeros(1, 3).expand(4, 3); x.add_(1)``: on PyTorch's CPU the four rows are one row
in memory, and the kernel raises ("more than one element of the written-to tensor refers to a
single memory location") instead of computing a result that depends on the order of writes.
torchlax writes functionally, so it would compute something: the write must be refused first.

PyTorch does not refuse it for every op (``fill_``, ``zero_``, ``masked_fill_``, ``index_put_``
and ``index_fill_`` accept it), so PyTorch is asked: its CPU kernel runs on stand-ins of the
arguments' layouts (the written tensor with its own strides, so with the same overlap, on a
storage as small as it; the others broadcast zeros). The verdict is kept per op and layouts.
Only a written tensor that is a view other than an alias (a root or ``detach()`` is laid out
densely) pays for reading its strides.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils._pytree import tree_leaves, tree_map

from ._registry import op_name
from ._tensor import Tensor

# How PyTorch words the refusal (assert_no_internal_overlap).
_OVERLAP = "more than one element of the written-to tensor refers to a single memory location"

_verdicts: dict = {}  # (op, layouts of the arguments) -> PyTorch's message, or None
_MAX_VERDICTS = 1024


def overlap_checked(func, impl: Callable) -> Callable:
    """``impl`` of ``func``, first refusing a write into an overlapping tensor as PyTorch does;
    ``impl`` itself for an op that writes no tensor's data."""
    written = _written(func)
    if not written:
        return impl

    def checked(args, kwargs):
        for target in written:
            dst = kwargs.get(target) if isinstance(target, str) else _at(args, target)
            if _may_overlap(dst):
                _refuse_if_pytorch_does(func, args, kwargs)
                break
        return impl(args, kwargs)

    return checked


def _at(args: tuple, i: int):
    return args[i] if i < len(args) else None


def _written(func) -> tuple:
    """Positions (or names, for keyword-only ones) of the arguments whose data ``func`` writes."""
    if not isinstance(func, torch._ops.OpOverload) or not func._schema.is_mutable:
        return ()
    if torch.Tag.inplace_view in func.tags:  # t_, squeeze_, as_strided_: metadata only
        return ()
    return tuple(
        a.name if a.kwarg_only else i
        for i, a in enumerate(func._schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    )


def _may_overlap(dst) -> bool:
    if isinstance(dst, list | tuple):
        return any(_may_overlap(t) for t in dst)
    if not isinstance(dst, Tensor):
        return False
    view = dst._view
    if view is None or view.compute is None:
        return False  # a root or an alias of one: dense
    return any(s == 0 and n > 1 for n, s in zip(dst.shape, dst.stride(), strict=True))


def _layout(x):
    if isinstance(x, torch.Tensor):
        return (tuple(x.shape), tuple(x.stride()), x.dtype)
    if isinstance(x, torch.device):
        return "device"
    return repr(x)


def _refuse_if_pytorch_does(func, args: tuple, kwargs: dict) -> None:
    key = (func, tuple(_layout(x) for x in tree_leaves((args, kwargs))))
    if key not in _verdicts:
        if len(_verdicts) >= _MAX_VERDICTS:
            _verdicts.clear()
        _verdicts[key] = _asked(func, args, kwargs)
    message = _verdicts[key]
    if message is not None:
        raise RuntimeError(message)


def _asked(func, args: tuple, kwargs: dict) -> str | None:
    """PyTorch's overlap refusal of ``func`` on CPU stand-ins of the arguments, or ``None``."""
    written = set(_written(func))

    def stand_in(x, write: bool):
        if isinstance(x, torch.device):
            return torch.device("cpu")  # never back into torchlax
        if not isinstance(x, torch.Tensor):
            return x
        if write:  # its own strides: the same overlap, on a storage as small as its own
            return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype).zero_()
        return torch.zeros((), dtype=x.dtype).expand(x.shape)

    cpu_args = tuple(
        tree_map(lambda x, w=i in written: stand_in(x, w), a) for i, a in enumerate(args)
    )
    cpu_kwargs = {
        k: tree_map(lambda x, w=k in written: stand_in(x, w), v) for k, v in kwargs.items()
    }
    try:
        func(*cpu_args, **cpu_kwargs)
    except RuntimeError as error:
        if _OVERLAP in str(error):
            return f"{op_name(func)}: {error}"
    except Exception:  # noqa: BLE001  only a question: any other refusal is the op's to make
        pass
    return None
