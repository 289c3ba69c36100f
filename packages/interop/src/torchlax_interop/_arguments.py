"""Values interop cannot take, refused with an error that names the argument and what to do.

``call_jax``'s results (``None``, a string, a PRNG key, a float0 array), ``to_torch`` of a PRNG
key, ``from_torch`` of a nested tensor, and ``torchlax.jit``'s ``static_argnums`` and tensor
arguments (sparse, quantized): each used to fail deep inside JAX, DLPack or PyTorch with words
that named neither. ``InteropArgumentError`` is a ``TypeError``, as before.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import torch
from torch.utils import _pytree as pytree
from torchlax_core import TorchlaxError


class InteropArgumentError(TorchlaxError, TypeError):
    """A value torchlax cannot move between PyTorch and JAX, or a bad argument of ``jit``."""


def _is_key(dtype) -> bool:
    return jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def check_call_jax_result(fn: Any, result: Any) -> None:
    """Refuse what ``call_jax``'s function returned if a leaf cannot become a tensor."""
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    where = f"torchlax.call_jax: the JAX function {name}"
    if result is None:
        raise InteropArgumentError(
            f"{where} returned None. Return the jax.Array (or a tuple, list or dict of arrays) "
            "that the call's results should be."
        )
    leaves = jax.tree_util.tree_leaves(result, is_leaf=lambda v: v is None)
    for leaf in leaves:
        if leaf is None:
            raise InteropArgumentError(
                f"{where} returned None inside its result {type(result).__name__}. Leave the "
                "entry out, or return an array in its place."
            )
        if isinstance(leaf, bool | int | float | complex):
            continue
        dtype = getattr(leaf, "dtype", None)
        if not isinstance(leaf, jax.Array | np.ndarray | np.generic) or dtype is None:
            raise InteropArgumentError(
                f"{where} returned a {type(leaf).__name__} ({leaf!r:.60}); it must return "
                "jax.Arrays (or numbers), which become tensors. Return other values outside "
                "call_jax."
            )
        _check_array_dtype(dtype, f"{where} returned")


def _check_array_dtype(dtype, what: str) -> None:
    if _is_key(dtype):
        raise InteropArgumentError(
            f"{what} a PRNG key array ({dtype}), which has no torch dtype. Convert it with "
            "jax.random.key_data(key) (uint32 data) and back with jax.random.wrap_key_data."
        )
    if dtype == jax.dtypes.float0:
        raise InteropArgumentError(
            f"{what} a float0 array (JAX's gradient of an integer input), which has no torch "
            "dtype. Return zeros of the input's dtype instead, or leave the gradient out."
        )


def check_to_torch_array(array: Any) -> None:
    """Refuse an array ``to_torch`` cannot convert (a PRNG key, float0) with what to do."""
    dtype = getattr(array, "dtype", None)
    if dtype is not None:
        _check_array_dtype(dtype, "torchlax.to_torch got")


def check_from_torch_tensor(tensor: torch.Tensor) -> None:
    """Refuse a tensor ``from_torch`` cannot convert (a nested tensor) with what to do."""
    if tensor.is_nested:
        raise InteropArgumentError(
            "torchlax.from_torch got a nested tensor (torch.nested), whose rows have different "
            "shapes; a jax.Array is rectangular. Convert each row (tensor.unbind()) or pad it "
            "(tensor.to_padded_tensor(0.0)) first."
        )


def check_static_argnums(static_argnums: Any) -> tuple[int, ...]:
    """``torchlax.jit``'s ``static_argnums`` as a tuple of ints (None: none, as in
    ``jax.jit``), or an error naming it."""
    if static_argnums is None:
        return ()
    values = (static_argnums,) if isinstance(static_argnums, int) else static_argnums
    if isinstance(values, str) or not _all_ints(values):
        raise InteropArgumentError(
            f"torchlax.jit: static_argnums must be an int or a sequence of ints (positions of "
            f"arguments), got {static_argnums!r}. Name keyword arguments with static_argnames."
        )
    return tuple(values)


def check_static_argnames(static_argnames: Any) -> tuple[str, ...]:
    """``torchlax.jit``'s ``static_argnames`` as a tuple of names (None: none, as in
    ``jax.jit``), or an error naming it."""
    if static_argnames is None:
        return ()
    values = (static_argnames,) if isinstance(static_argnames, str) else static_argnames
    try:
        names = tuple(values)
    except TypeError:  # not iterable
        names = None
    if names is None or not all(isinstance(n, str) for n in names):
        raise InteropArgumentError(
            f"torchlax.jit: static_argnames must be a str or a sequence of str (names of keyword "
            f"arguments), got {static_argnames!r}. Give positions with static_argnums."
        )
    return names


def _all_ints(values: Any) -> bool:
    try:
        return all(isinstance(v, int) and not isinstance(v, bool) for v in values)
    except TypeError:  # not iterable
        return False


def check_jit_arguments(args: tuple, kwargs: dict) -> None:
    """Refuse a tensor argument of ``torchlax.jit`` that a program cannot take (sparse,
    quantized), naming it and what to do."""
    for leaf in pytree.tree_leaves((args, kwargs)):
        if isinstance(leaf, torch.Tensor) and (leaf.layout != torch.strided or leaf.is_quantized):
            _refuse_jit_argument(args, kwargs, leaf)


def _refuse_jit_argument(args: tuple, kwargs: dict, bad: torch.Tensor) -> None:
    path = next(p for p, v in pytree.tree_flatten_with_path((args, kwargs))[0] if v is bad)
    where = ("argument " if path[0] == pytree.SequenceKey(0) else "keyword argument ") + (
        pytree.keystr(path[1:])
    )
    if bad.layout != torch.strided:
        raise InteropArgumentError(
            f"torchlax.jit: {where} is a {bad.layout} tensor; compiled programs take dense "
            "tensors. Pass tensor.to_dense(), or call the function without torchlax.jit."
        )
    raise InteropArgumentError(
        f"torchlax.jit: {where} is a quantized tensor ({bad.dtype}), which JAX has no dtype "
        "for. Pass tensor.dequantize(), or call the function without torchlax.jit."
    )
