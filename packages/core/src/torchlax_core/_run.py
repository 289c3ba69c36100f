"""``run_op``: the one function that runs an ATen op on torchlax Tensors.

Every entry point goes through it: ``Tensor.__torch_dispatch__`` (every op on a Tensor), the
``jax`` device's kernels (factories with ``device="jax"``, ``cpu_tensor.to("jax")``) and
``Environment.dispatch`` (compiled programs, export). It owns what they share:

- the implementation lookup: one dict lookup in ``env._resolved``, built once per op by
  ``Environment._resolve``;
- JAX's 64-bit mode: on while the op runs (outside it JAX would silently narrow int64 and
  float64 data, in lowerings and in the core's own array code alike), so nothing under an
  implementation needs to switch it on again;
- an op that fails while PyTorch's autograd engine runs it (see ``BackwardFailure``);
- an op that JAX refuses with its own argument error where PyTorch would have refused it
  first: PyTorch's error is raised instead (``_meta_errors``);
- an op that read state another thread's compiled call holds in flux (a tracer of its trace,
  an array donated to its run): run again once that call is done (``_state_lock``).
"""

from __future__ import annotations

from typing import Any

from torch._C import _current_graph_task_id

from ._meta_errors import pytorch_error
from ._state_lock import NOT_RETRIED as _NOT_RETRIED
from ._state_lock import retry_after_state_settles
from ._x64 import x64, x64_flag


def run_op(env: Any, func: Any, args: tuple, kwargs: dict, *, from_dispatcher: bool = True):
    """Run ``func`` on ``args``/``kwargs`` in ``env`` and return torchlax Tensors.

    ``from_dispatcher`` says that PyTorch's dispatcher called in (a C++ frame is below): an
    op failing inside the autograd engine then returns a ``BackwardFailure`` instead of
    raising. Python callers (``Environment.dispatch``) pass ``False`` and get the exception.
    """
    impl = None
    try:
        impl = env._resolved.get(func)
        if impl is None:
            impl = env._resolve(func)
        if x64_flag.value:
            return impl(args, kwargs)
        with x64():
            return impl(args, kwargs)
    except Exception as exc:
        if impl is not None:
            # Another thread's compiled call held the state this op read (see _state_lock).
            again = retry_after_state_settles(exc, impl, args, kwargs)
            if again is not _NOT_RETRIED:
                return again
        error = pytorch_error(func, args, kwargs, exc)
        if not from_dispatcher or _current_graph_task_id() == -1:
            if error is None:
                raise
            raise error from exc
        return BackwardFailure(func, error or exc)


class BackwardFailure:
    """What an op that failed inside the autograd engine returns instead of raising.

    A Python exception raised there unwinds through PyTorch's stream guard for the ``jax``
    device, whose (Python-backed, ``noexcept``) methods then abort the process. Returning an
    object PyTorch cannot convert makes it raise its own C++ error instead, whose message
    carries this object's repr: the op and the original error.
    """

    def __init__(self, func, exc: BaseException):
        self.func = func
        self.exc = exc

    def __repr__(self) -> str:
        return (
            f"<torchlax: {self.func} failed during backward with "
            f"{type(self.exc).__name__}: {self.exc}>"
        )
