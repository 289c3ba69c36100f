"""``aten``: ``torch.ops.aten`` as the lowering modules name it, where an op this torch lacks is
a ``Missing`` placeholder instead of an ``AttributeError``.

The lowering modules name ops at import time (``@lowering(aten.linalg_matrix_sqrth.default)``).
An op an older or newer PyTorch does not have would fail that import, and with it the whole
``ops`` plugin: every op unlowered. Named through this namespace, it becomes a ``Missing``
(its overloads too: ``aten.x.default`` of a missing ``x``), which ``_table`` skips, recording
its name in ``MISSING`` for the plugin to log once. Ops that exist are PyTorch's own objects.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["MISSING", "Missing", "aten"]

MISSING: list[str] = []  # the names of the missing ops the tables were asked to record


class Missing:
    """An ATen op (or an overload of one) that the installed PyTorch does not have."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __getattr__(self, overload: str) -> Missing:
        if overload.startswith("__") and overload.endswith("__"):
            raise AttributeError(overload)
        return Missing(f"{self.name}.{overload}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"{self.name} does not exist in the installed PyTorch {torch.__version__}."
        )

    def __repr__(self) -> str:
        return f"<{self.name}: not in PyTorch {torch.__version__}>"


class _Namespace:
    """``torch.ops.aten`` with ``Missing`` for the ops it lacks."""

    def __init__(self, namespace: Any, name: str):
        self._namespace = namespace
        self._name = name

    def __getattr__(self, op: str) -> Any:
        try:
            found = getattr(self._namespace, op)  # (ops such as aten.__lshift__ too)
        except AttributeError:
            if op.startswith("__") and op.endswith("__"):
                raise  # a protocol's probe (copy, pickle), not an op
            found = Missing(f"{self._name}.{op}")
        setattr(self, op, found)  # (looked up once)
        return found


aten: Any = _Namespace(torch.ops.aten, "aten")
