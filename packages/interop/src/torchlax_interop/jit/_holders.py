"""The plain objects ``torchlax.jit``'s state walk enters: a trainer, a config, a
``dataclass``, a ``SimpleNamespace`` holding the model and optimizer (``self.cfg.model``).

Which objects are entered (``enterable``) and what of them is read (``attributes``: the
instance ``__dict__`` and the ``__slots__`` Python declared), kept apart from the walk itself
(``_state``) so that the rule is in one place.
"""

from __future__ import annotations

import enum
import logging
import operator
import threading
import types
from typing import Any

import jax
import torch

from ._objects import slot_names

# Python marks the types its class statement creates (and C types built the same way) as heap
# types; a static C type's instance dict, where it has one, is the type's business.
_HEAP_TYPE = 1 << 9

# Objects with attributes the walk does not enter, though they are Python objects:
# - data pipelines: a dataset's samples and a loader's iterators and workers are data, not
#   state, and can be large (a dataset holding a list of every sample);
# - loggers: a logger reaches the logging manager, and through it every logger of the process;
# - threads: a thread's target and arguments belong to another thread's work;
# - JAX arrays: C++ objects (a heap type without attributes to read);
# - what the walk handles itself, or that holds no state of its own: modules, optimizers,
#   schedulers, tensors (state), classes, Python modules, enum members, and functions and
#   methods (the walk follows the jitted function's closures and globals and those of the
#   functions they hold, not every callback an object keeps: its globals reach the program).
_NOT_ENTERED = (
    torch.utils.data.DataLoader,
    torch.utils.data.Dataset,
    logging.Logger,
    logging.Handler,
    threading.Thread,
    jax.Array,
    torch.nn.Module,
    torch.optim.Optimizer,
    torch.optim.lr_scheduler.LRScheduler,
    torch.Tensor,
    type,
    types.FunctionType,
    types.MethodType,
    types.BuiltinFunctionType,
    types.ModuleType,
    enum.Enum,
)


def enterable(obj: Any) -> bool:
    """Whether the walk enters ``obj``'s attributes: an instance of a class written in
    Python (or a ``SimpleNamespace``) that is none of ``_NOT_ENTERED``."""
    cls = type(obj)
    if cls is types.SimpleNamespace:
        return True
    return bool(cls.__flags__ & _HEAP_TYPE) and not isinstance(obj, _NOT_ENTERED)


def attributes(obj: Any) -> tuple[dict | None, tuple[str, ...]]:
    """``obj``'s instance dict (None if it has none, or one that is not a plain dict) and the
    names of the ``__slots__`` its classes declare."""
    try:
        attrs = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        attrs = None
    if type(attrs) is not dict:
        attrs = None
    return attrs, tuple(slot_names(type(obj)))


def slot_values(obj: Any, names: tuple[str, ...]) -> tuple:
    """The values of ``obj``'s slots ``names`` (``ABSENT`` for an unset one), read past any
    ``__getattribute__`` of the class."""
    values = []
    for name in names:
        try:
            values.append(object.__getattribute__(obj, name))
        except AttributeError:
            values.append(ABSENT)
    return tuple(values)


ABSENT = object()  # an unset slot


def same_values(now: tuple, then: tuple) -> bool:
    """Whether two tuples of values hold the same objects (by identity)."""
    return len(now) == len(then) and all(map(operator.is_, now, then))
