"""The strides PyTorch's TensorIterator gives the result of an elementwise op.

PyTorch allocates a pointwise op's output in the memory order of its inputs: when all inputs
have one shape and are row-major (or all channels-last, or all share one dense layout) the
output takes that layout; otherwise the dimensions are sorted by the inputs' strides, the
first input that tells two dimensions apart deciding (a broadcast dimension, stride 0, tells
nothing; equal strides put the smaller dimension inside), and the output is dense in that
order. This module answers the same strides from the operands' sizes and strides alone, once
per signature; it knows no op.
"""

from __future__ import annotations

import functools

_Operand = tuple[tuple[int, ...], tuple[int, ...]]  # (sizes, strides) of one tensor argument

# operands' (sizes, strides) -> the result's (sizes, strides), None for row-major
_CACHE: dict[tuple[_Operand, ...], _Operand | None] = {}
_MISS = object()


def iterator_layout(operands: tuple[_Operand, ...]) -> _Operand | None:
    """The ``(sizes, strides)`` of an elementwise result over tensor ``operands`` (in the op's
    argument order), or None where it is row-major (or the operands do not broadcast: the op
    itself raises then)."""
    hit = _CACHE.get(operands, _MISS)
    if hit is _MISS:
        strides = _compute(operands)
        shape = _broadcast_shape([sizes for sizes, _ in operands])
        hit = None if strides is None or shape is None else (shape, strides)
        if len(_CACHE) < 4096:
            _CACHE[operands] = hit
    return hit  # pyright: ignore[reportReturnType]  (_MISS replaced above)


def iterator_strides(operands: tuple[_Operand, ...]) -> tuple[int, ...] | None:
    """The strides of ``iterator_layout``, None where they are row-major."""
    layout = iterator_layout(operands)
    return None if layout is None else layout[1]


def _compute(operands: tuple[_Operand, ...]) -> tuple[int, ...] | None:
    shape = _broadcast_shape([sizes for sizes, _ in operands])
    if shape is None or len(shape) <= 1:
        return None
    strides = _same_shape_layout(operands, shape)
    if strides is _MISS:
        strides = _sorted_layout(operands, shape)
    if strides is None or strides == row_major_strides(shape):
        return None
    return strides  # pyright: ignore[reportReturnType]  (_MISS replaced above)


def _broadcast_shape(shapes: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    ndim = max(len(s) for s in shapes)
    out = [1] * ndim
    for s in shapes:
        for i, n in enumerate(s, ndim - len(s)):
            if n != 1:
                if out[i] not in (1, n):
                    return None
                out[i] = n
    return tuple(out)


def _same_shape_layout(operands, shape):
    """TensorIterator's fast setup: every operand of the result's shape (no 0-d operand
    among others) and all row-major, all channels-last, or all one dense layout. ``_MISS``
    where it does not apply."""
    if any(sizes != shape for sizes, _ in operands):
        return _MISS
    if all(_is_contiguous(shape, strides) for _, strides in operands):
        return None
    if len(shape) == 4 and all(_is_contiguous(shape, st, (1, 3, 2, 0)) for _, st in operands):
        return _channels_last(shape)
    first = operands[0][1]
    if all(strides == first and _is_dense(shape, strides) for _, strides in operands):
        return first
    return _MISS


def _sorted_layout(operands, shape) -> tuple[int, ...] | None:
    """The general rule: sort the dimensions by the operands' strides (broadcast dimensions
    stride 0), then lay the result out densely in that order."""
    ndim = len(shape)
    aligned = [_broadcast_strides(sizes, strides, shape) for sizes, strides in operands]

    def order(inner: int, outer: int) -> int:
        """1: ``inner`` belongs outside ``outer``; -1: it stays inside; 0: no operand says."""
        for strides in aligned:
            a, b = strides[inner], strides[outer]
            if a == 0 or b == 0:
                continue
            if a != b:
                return -1 if a < b else 1
            if shape[inner] > shape[outer]:
                return 1
        return 0

    perm = list(reversed(range(ndim)))  # innermost dimension first
    for i in range(1, ndim):  # an insertion sort that keeps undecided pairs where they are
        moving = i
        for j in range(i - 1, -1, -1):
            verdict = order(perm[j], perm[moving])
            if verdict > 0:
                perm[j], perm[moving] = perm[moving], perm[j]
                moving = j
            elif verdict < 0:
                break
    if perm == list(reversed(range(ndim))):
        return None
    strides = [0] * ndim
    step = 1
    for d in perm:
        strides[d] = step
        step *= shape[d]
    return tuple(strides)


def _broadcast_strides(sizes, strides, shape) -> tuple[int, ...]:
    offset = len(shape) - len(sizes)
    aligned = [0] * len(shape)
    for i, (n, s) in enumerate(zip(sizes, strides, strict=True)):
        aligned[offset + i] = 0 if n == 1 and shape[offset + i] != 1 else s
    return tuple(aligned)


@functools.lru_cache(maxsize=4096)
def row_major_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """PyTorch's contiguous strides of ``shape`` (``make_contiguous_strides_for``, a size 0
    counting as 1), cached: torch's own costs ~10 us of Python per call, on the path of every
    result laid out other than row-major."""
    strides = []
    step = 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def dense_strides_in_order(
    shape: tuple[int, ...], strides: tuple[int, ...]
) -> tuple[int, ...] | None:
    """The strides of a dense tensor of ``shape`` whose dimensions are laid out in the order of
    ``strides`` (largest first, ties in dimension order, as TensorIterator compares them), or
    None where that order is row-major."""
    order = sorted(range(len(shape)), key=lambda d: (-strides[d], d))
    if order == list(range(len(shape))):
        return None
    dense = [0] * len(shape)
    size = 1
    for d in reversed(order):
        dense[d] = size
        size *= shape[d]
    return tuple(dense)


def traced_strides(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...] | None:
    """The strides a compiled program's input of ``shape`` and ``strides`` is traced with
    (``torchlax.jit``'s arguments; a ``torch.compile`` graph's placeholders, by their fake
    values), so that the ops that lay out their results like an input (TensorIterator,
    ``empty_like``) give eager PyTorch's strides: dense strides in the dimension order of
    ``strides`` (for a slice, those of a dense tensor of that order: TensorIterator only
    compares strides), 0 where it is broadcast (an ``expand()``ed input: a stride-0 dimension
    tells TensorIterator nothing, so ``x.t() + 1`` is row-major, where a dense order would
    lay it out transposed), or None for row-major order or an empty tensor."""
    if 0 in shape:
        return None
    broadcast = [s == 0 and n > 1 for n, s in zip(shape, strides, strict=True)]
    if not any(broadcast):
        return dense_strides_in_order(shape, strides)
    traced = [0] * len(shape)
    size = 1
    for d in sorted(range(len(shape)), key=lambda d: (strides[d], -d)):  # innermost first
        if not broadcast[d]:
            traced[d] = size
            size *= shape[d]
    return tuple(traced)


def _channels_last(shape) -> tuple[int, ...]:
    n, c, h, w = shape
    return (h * w * c, 1, w * c, c)


def _is_contiguous(shape, strides, order=None) -> bool:
    """PyTorch's ``is_contiguous`` (``order``: dimensions innermost first; row-major by
    default): size-1 dimensions' strides do not count, an empty tensor is contiguous."""
    if 0 in shape and order is None:
        return True
    expected = 1
    for d in reversed(range(len(shape))) if order is None else order:
        if shape[d] != 1:
            if strides[d] != expected:
                return False
            expected *= shape[d]
    return True


def _is_dense(shape, strides) -> bool:
    """PyTorch's ``is_non_overlapping_and_dense``: a permutation of a dense layout, size-0/1
    dimensions' strides aside."""
    expected = 1
    for d in sorted(range(len(shape)), key=lambda d: (shape[d] < 2, strides[d])):
        if shape[d] < 2:
            return True
        if strides[d] != expected:
            return False
        expected *= shape[d]
    return True
