"""The current environment: each thread's ``enable()`` stack, ``current_env()`` and the default.

The bottom of the core: every other core module may import it, and it imports only ``_x64``
at import time (``default_env`` imports ``_environment`` once, when it creates the default
environment). ``Tensor.__torch_dispatch__`` calls ``current_env`` on every op.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from ._x64 import set_x64_globally, x64

if TYPE_CHECKING:
    from ._environment import Environment

_lock = threading.Lock()
_default: Environment | None = None
_globally_enabled = False
_x64_before_global: bool | None = None


class _Scopes:
    """What ``enable`` and ``prng_key_scope`` chose in one thread: immutable, replaced whole.

    ``envs`` is the ``enable`` stack (innermost last); ``keys`` pairs each key scope with the
    environment it belongs to, so ``env_a.prng_key_scope`` leaves ``env_b``'s randomness alone.
    """

    __slots__ = ("envs", "keys")

    def __init__(self, envs: tuple = (), keys: tuple = ()):
        self.envs = envs
        self.keys = keys


_NO_SCOPES = _Scopes()
# Per thread (and per asyncio task): each thread starts with no scopes, so `enable(env)` or a
# traced program's key scope in one thread never reaches another.
_scopes: contextvars.ContextVar[_Scopes | None] = contextvars.ContextVar(
    "torchlax_scopes", default=None
)
# PyTorch's autograd engine runs the backward of non-CPU tensors (the `jax` device is
# PrivateUse1) on its own device thread, where the caller's contextvars are not visible. It
# does carry the caller's torch thread-local state there: each graph task captures it when
# `backward()`/`autograd.grad` starts and installs it around every node it runs, including
# the Python objects stashed with `torch._C._stash_obj_in_tls`. So every change of scopes is
# mirrored there, and a thread that has no scopes of its own reads them from it only while it
# runs a graph task (never otherwise: asyncio tasks sharing a thread would see each other's).
_TLS_KEY = "torchlax.scopes"
_graph_task_id = torch._C._current_graph_task_id
_tls_has = torch._C._is_key_in_tls
_tls_get = torch._C._get_obj_in_tls
_tls_set = torch._C._stash_obj_in_tls


def _current_scopes() -> _Scopes:
    scopes = _scopes.get()
    if scopes is None:
        if _graph_task_id() != -1 and _tls_has(_TLS_KEY):
            return _tls_get(_TLS_KEY) or _NO_SCOPES
        return _NO_SCOPES
    return scopes


@contextlib.contextmanager
def _scoped(scopes: _Scopes) -> Iterator[None]:
    previous_tls = _tls_get(_TLS_KEY) if _tls_has(_TLS_KEY) else None
    token = _scopes.set(scopes)
    _tls_set(_TLS_KEY, scopes)
    try:
        yield
    finally:
        _scopes.reset(token)
        _tls_set(_TLS_KEY, previous_tls)


def default_env() -> Environment:
    """The process-wide environment, created (and its plugins loaded) on first use.

    Created once even when several threads ask at once: the others wait for it.
    """
    global _default
    if _default is None:
        with _lock:
            if _default is None:
                from ._environment import Environment  # once per process: the top of the core

                _default = Environment()
    return _default


def current_env() -> Environment:
    """This thread's innermost ``torchlax.enable(env)`` environment, else the default one."""
    scopes = _scopes.get()
    if scopes is not None:
        envs = scopes.envs
        if envs:
            return envs[-1]
    elif _graph_task_id() != -1:  # on autograd's device thread: the caller's scopes
        envs = _current_scopes().envs
        if envs:
            return envs[-1]
    return _default or default_env()


def is_enabled() -> bool:
    """Whether ``device="jax"`` tensors may be created here (inside ``enable`` or globally)."""
    return _globally_enabled or bool(_current_scopes().envs)


# module.to("jax") swaps each parameter's contents in place inside `enable` (as for CUDA, where
# it sets .data): the Parameter objects stay, so tied weights stay tied. The switch is
# process-wide in torch, so it is counted: on while any thread is inside `enable`.
_swap_lock = threading.Lock()
_swap_users = 0
_swap_before = False


def _swap_params_on() -> None:
    global _swap_users, _swap_before
    with _swap_lock:
        if _swap_users == 0:
            _swap_before = torch.__future__.get_swap_module_params_on_conversion()
            torch.__future__.set_swap_module_params_on_conversion(True)
        _swap_users += 1


def _swap_params_off() -> None:
    global _swap_users
    with _swap_lock:
        _swap_users -= 1
        if _swap_users == 0:
            torch.__future__.set_swap_module_params_on_conversion(_swap_before)


@contextlib.contextmanager
def enable(env: Environment | None = None) -> Iterator[Environment]:
    """Scope torchlax in this thread: inside, ``device="jax"`` creates torchlax Tensors.

    ``torch.randn(2, 3, device="jax")``, ``tensor.to("jax")`` and ``module.to("jax")`` then
    work; CPU code keeps running on the CPU. JAX's 64-bit mode is on within the block, so
    plain JAX code there sees int64/float64 as torch does; outside it JAX is unaffected.
    Other threads are not affected (they keep their own scopes); ``backward()`` called inside
    the block runs with ``env`` too, although PyTorch runs it on its own device thread.
    """
    env = env or default_env()
    scopes = _current_scopes()
    _swap_params_on()
    try:
        with _scoped(_Scopes((*scopes.envs, env), scopes.keys)), x64():
            yield env
    finally:
        _swap_params_off()


def enable_globally(env: Environment | None = None) -> Environment:
    """Enable torchlax for the rest of the process (undo with ``disable_globally``).

    Also turns on JAX's 64-bit mode process-wide, so that plain JAX code handed torchlax's
    int64/float64 arrays keeps their dtypes. Prefer the scoped ``enable()`` to leave plain JAX
    code outside it untouched.
    """
    global _globally_enabled, _default, _x64_before_global, _swap_before
    if env is not None:
        _default = env
    if not _globally_enabled:
        _x64_before_global = set_x64_globally(True)
        with _swap_lock:  # see enable()
            if _swap_users:
                _swap_before = True
            else:
                torch.__future__.set_swap_module_params_on_conversion(True)
    _globally_enabled = True
    return default_env()


def disable_globally() -> None:
    """Undo ``enable_globally`` (and restore JAX's 64-bit setting)."""
    global _globally_enabled, _x64_before_global, _swap_before
    if _globally_enabled and _x64_before_global is not None:
        set_x64_globally(_x64_before_global)
        with _swap_lock:
            if _swap_users:  # restored when the last enable() exits
                _swap_before = False
            else:
                torch.__future__.set_swap_module_params_on_conversion(False)
    _globally_enabled = False
    _x64_before_global = None
