"""Hugging Face ``generate()`` on the ``jax`` device: a KV cache whose length comes in buckets.

``transformers``' default ``DynamicCache`` grows by one token per decoding step, so every step
of an eager ``generate()`` has new shapes, and torchlax compiles the concatenations, the
attention and what follows them anew for each length. On a model whose parameters are on the
``jax`` device, this module makes ``generate()`` use ``transformers``' ``StaticCache`` instead,
its length rounded up to a bucket (the next power of two, at least ``minimum``): the attention
reads the whole bucket, the positions not yet written masked out by ``transformers`` itself,
so every decoding step of a bucket has the same shapes, and after the first steps (an op's
first call of a signature runs op by op, its second compiles) the steps compile nothing; a
later ``generate()`` whose prompt plus new tokens fits the same bucket reuses them.

It applies only where the default cache would have been a ``DynamicCache`` and a static one
gives the same tokens: a decoder-only model that ``transformers`` marks as supporting static
caches (``_can_compile_fullgraph``), greedy search, sampling or beam search, no cache or
``cache_implementation`` given, ``use_cache`` on, and ``forward`` not replaced on the instance
(a ``torch.compile``'d or ``torchlax.jit``'d forward keeps what its wrapper expects). CPU and
other devices' models are untouched. Opting out: ``cache_implementation="dynamic"`` for one
call, ``set_generate_buckets(None)`` or ``TORCHLAX_GENERATE_BUCKETS=0`` for all.

The hook is ``GenerationMixin._prepare_cache_for_generation``, the one place ``generate()``
chooses its cache and the only one that knows the generation's length (``max_cache_length``);
it is wrapped when ``transformers.generation.utils`` is imported (at once if it already is,
otherwise by a one-shot import hook: importing torchlax does not import transformers). A
``transformers`` whose method takes other arguments is left alone.
"""

from __future__ import annotations

import copy
import functools
import importlib.abc
import importlib.util
import inspect
import os
import sys
import threading
from typing import Any

from torchlax_core.internal import get_logger

_logger = get_logger("generate")

_TARGET = "transformers.generation.utils"
_NEEDED = ("generation_config", "model_kwargs", "generation_mode", "max_cache_length")
# Modes whose cache only grows (assisted and contrastive decoding crop it; DoLa reads layers).
_MODES = frozenset({"greedy_search", "sample", "beam_search", "beam_sample"})


def _minimum_from_environment() -> int | None:
    value = os.environ.get("TORCHLAX_GENERATE_BUCKETS", "").strip().lower()
    if value in ("", "on", "true"):
        return 64
    if value in ("0", "off", "false", "none"):
        return None
    try:
        return max(1, int(value))
    except ValueError:
        _logger.warning(
            "TORCHLAX_GENERATE_BUCKETS=%r is not a number or 0/off: using the default smallest "
            "bucket, 64 tokens.",
            value,
        )
        return 64


_minimum: int | None = _minimum_from_environment()


def set_generate_buckets(minimum: int | None = 64) -> None:
    """Set how ``generate()`` sizes the KV cache of a Hugging Face model on the ``jax`` device.

    With ``minimum`` a number, the default cache becomes a ``StaticCache`` whose length is the
    next power of two of the generation's length (prompt plus new tokens), at least
    ``minimum``: every decoding step within that length has the same shapes and compiles
    nothing after the first steps. ``None`` keeps ``transformers``' ``DynamicCache``, which
    compiles each op anew for every length. The default comes from
    ``TORCHLAX_GENERATE_BUCKETS`` (``0``/``off`` turns it off, a number sets ``minimum``),
    else 64.
    """
    global _minimum
    if minimum is not None and (isinstance(minimum, bool) or not isinstance(minimum, int)):
        raise TypeError(
            f"set_generate_buckets(minimum) takes a number of tokens or None (off), "
            f"got {minimum!r}."
        )
    if minimum is not None and minimum < 1:
        raise ValueError(
            f"set_generate_buckets(minimum) must be at least 1 token, got {minimum}; pass None "
            f"to turn the bucketed cache off."
        )
    _minimum = minimum


def bucket_length(length: int, minimum: int) -> int:
    """The cache length for a generation of ``length`` tokens: a power of two, >= ``minimum``."""
    bucket = 1
    while bucket < length:
        bucket *= 2
    return max(bucket, minimum)


def _model_takes_buckets(model: Any) -> bool:
    """A decoder-only model on the jax device that transformers lets use a static cache, with
    its class's own forward (an instance-level wrapper may expect the dynamic cache)."""
    if "forward" in vars(model):
        return False
    config = getattr(model, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False):
        return False
    if not getattr(model, "_can_compile_fullgraph", False):
        return False
    supports = getattr(model, "_supports_default_dynamic_cache", None)
    if supports is not None and not supports():
        return False
    try:
        return model.device.type == "jax"
    except (AttributeError, StopIteration):  # no parameters
        return False


def _call_takes_buckets(arguments: dict[str, Any]) -> bool:
    """No cache chosen by the caller, a cache wanted, and a mode whose cache only grows."""
    config = arguments["generation_config"]
    model_kwargs = arguments["model_kwargs"] or {}
    return (
        getattr(config, "cache_implementation", None) is None
        and getattr(config, "use_cache", True) is not False
        and not getattr(config, "is_assistant", False)
        and model_kwargs.get("cache") is None
        and model_kwargs.get("past_key_values") is None
        and str(getattr(arguments["generation_mode"], "value", arguments["generation_mode"]))
        in _MODES
    )


def _prepare_cache(original, signature: inspect.Signature, model, args, kwargs):
    minimum = _minimum
    if minimum is None or not _model_takes_buckets(model):
        return original(model, *args, **kwargs)
    bound = signature.bind(model, *args, **kwargs)
    if not _call_takes_buckets(bound.arguments):
        return original(model, *args, **kwargs)
    # A copy: the caller's config (and what generate() reads from it later) keeps the default.
    static = copy.copy(bound.arguments["generation_config"])
    static.cache_implementation = "static"
    length = bucket_length(int(bound.arguments["max_cache_length"]), minimum)
    static.max_cache_len = max(length, getattr(static, "max_cache_len", None) or 0)
    bound.arguments["generation_config"] = static
    return original(*bound.args, **bound.kwargs)


def _install(module: Any) -> None:
    """Wrap ``module.GenerationMixin._prepare_cache_for_generation`` (once)."""
    mixin = getattr(module, "GenerationMixin", None)
    original = getattr(mixin, "_prepare_cache_for_generation", None)
    if original is None or getattr(original, "__torchlax_wrapped__", None) is not None:
        return
    signature = inspect.signature(original)
    if not all(name in signature.parameters for name in _NEEDED):
        _logger.debug(
            "torchlax leaves generate()'s cache to transformers: its "
            "_prepare_cache_for_generation takes %s, not the expected %s.",
            list(signature.parameters),
            _NEEDED,
        )
        return

    @functools.wraps(original)
    def _prepare_cache_for_generation(self, *args, **kwargs):
        return _prepare_cache(original, signature, self, args, kwargs)

    _prepare_cache_for_generation.__torchlax_wrapped__ = original  # pyright: ignore[reportAttributeAccessIssue]
    mixin._prepare_cache_for_generation = _prepare_cache_for_generation  # pyright: ignore[reportOptionalMemberAccess]


class _InstallingLoader(importlib.abc.Loader):
    """Runs the real loader of ``transformers.generation.utils``, then ``_install``."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        _install(module)

    def __getattr__(self, name: str):  # get_source, get_filename, ... for inspect and pdb
        return getattr(self._loader, name)


class _ImportHook(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when ``transformers.generation.utils`` is imported, it asks the
    other finders for its spec and wraps the spec's loader, then leaves ``sys.meta_path``."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _TARGET:
            return None
        _remove_hook()
        spec = importlib.util.find_spec(fullname)  # the hook is out: the real finders answer
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _InstallingLoader(spec.loader)
        return spec


_hook = _ImportHook()
_lock = threading.Lock()


def _remove_hook() -> None:
    with _lock:
        if _hook in sys.meta_path:
            sys.meta_path.remove(_hook)


def activate() -> None:
    """Wrap transformers' cache choice now if it is imported, else when it is."""
    module = sys.modules.get(_TARGET)
    if module is not None:
        _install(module)
        return
    with _lock:
        if _hook not in sys.meta_path:
            sys.meta_path.insert(0, _hook)
