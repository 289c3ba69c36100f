"""The ops whose output size is data, and histograms: ``nonzero``, ``masked_select``, ``unique``
and its variants, ``bincount``, ``histc``, ``histogram``/``histogramdd``.

Those whose output size is data read values on the host: they work eagerly and raise
``DataDependentShapeError`` under tracing (``nonzero_static`` is the traceable form).
"""

from __future__ import annotations

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jax import lax
from torchlax_core import check_index

from .. import _aten
from .._table import lowering
from .indexing import _require_concrete
from .shape import _dim

aten = _aten.aten  # (an op this torch lacks: a Missing, skipped)


# -- outputs whose size is data ---------------------------------------------------------------


@lowering(aten.nonzero.default)
def nonzero(self):
    _require_concrete(
        "aten.nonzero",
        self,
        hint=(", or use torch.nonzero_static(x, size=N) to get a fixed number of rows"),
    )
    return jnp.stack(jnp.nonzero(jnp.atleast_1d(self) if self.ndim == 0 else self), axis=-1)[
        :, : self.ndim
    ].astype(jnp.int64)


@lowering(aten.nonzero_static.default)
def nonzero_static(self, *, size, fill_value=-1):
    if self.ndim == 0:
        return jnp.zeros((size, 0), jnp.int64)
    rows = jnp.nonzero(self, size=size, fill_value=fill_value)
    return jnp.stack(rows, axis=-1).astype(jnp.int64)


@lowering(aten.masked_select.default)
def masked_select(self, mask):
    _require_concrete(
        "aten.masked_select",
        self,
        mask,
        hint=(", or use torch.where(mask, x, fill) to keep the shape static"),
    )
    shape = jnp.broadcast_shapes(self.shape, mask.shape)
    return jnp.broadcast_to(self, shape)[jnp.broadcast_to(mask, shape)]


def _sorted_groups(rows):
    """Sort ``rows`` (n, k) lexicographically and mark where each group of equal rows starts.

    Equality is elementwise ``==``, as PyTorch's CPU kernels test it, so a row holding NaN equals
    no other row and stays a group of its own (``jnp.unique`` would merge NaNs). The sort is
    stable and puts NaN last. Returns the sorting permutation, the group starts and each sorted
    row's group, as NumPy arrays (these ops run eagerly: the sizes are data).
    """
    length = rows.shape[0]
    columns = [rows[:, j] for j in reversed(range(rows.shape[1]))]
    order = jnp.lexsort(columns) if columns else jnp.arange(length)
    ordered = rows[order]
    starts = np.ones(length, dtype=bool)
    if length:
        starts[1:] = np.asarray(jnp.any(ordered[1:] != ordered[:-1], axis=1))
    return np.asarray(order), starts, np.cumsum(starts) - 1


def _group_results(order, starts, group, length, return_inverse, return_counts):
    """The first sorted index of each group, the inverse in input order, and the counts."""
    first = np.flatnonzero(starts)
    inverse = np.empty(length, np.int64)
    inverse[order] = group
    inverse = jnp.asarray(inverse) if return_inverse else _none()
    counts = jnp.asarray(np.diff(np.append(first, length)), jnp.int64) if return_counts else _none()
    return first, inverse, counts


def _unique_flat(self, sorted, return_inverse, return_counts, op):
    _require_concrete(op, self)
    flat = jnp.ravel(self)
    order, starts, group = _sorted_groups(flat[:, None])
    first, inverse, counts = _group_results(
        order, starts, group, flat.shape[0], return_inverse, return_counts
    )
    inverse = jnp.reshape(inverse, self.shape) if return_inverse else inverse
    return flat[order[first]], inverse, counts


def _none():
    return jnp.zeros((0,), jnp.int64)


@lowering(aten._unique2.default)
def unique2(self, sorted=True, return_inverse=False, return_counts=False):
    return _unique_flat(self, sorted, return_inverse, return_counts, "torch.unique")


@lowering(aten._unique.default)
def unique(self, sorted=True, return_inverse=False):
    values, inverse, _ = _unique_flat(self, sorted, return_inverse, False, "torch.unique")
    return values, inverse


def _check_unique_dim_of_empty(self, dim: int) -> None:
    """PyTorch's checks of ``unique(dim=)`` on an empty tensor: only ``dim`` may be 0-sized."""
    if self.size:
        return
    if self.shape[dim] != 0:
        raise RuntimeError(
            "There are 0 sized dimensions, and they aren't selected, so unique cannot be applied"
        )
    if sum(n == 0 for n in self.shape) > 1:
        raise RuntimeError(
            "Number of zero sized dimensions is more than one, so unique cannot be applied "
        )


@lowering(aten.unique_dim.default)
def unique_dim(self, dim, sorted=True, return_inverse=False, return_counts=False):
    _require_concrete("torch.unique(dim=...)", self)
    dim = _dim(dim, self.ndim)
    _check_unique_dim_of_empty(self, dim)
    if not self.size:
        return self, _none(), _none()
    moved = jnp.moveaxis(self, dim, 0)
    length = moved.shape[0]
    order, starts, group = _sorted_groups(moved.reshape(length, -1))
    first, inverse, counts = _group_results(
        order, starts, group, length, return_inverse, return_counts
    )
    return jnp.moveaxis(moved[order[first]], 0, dim), inverse, counts


@lowering(aten.unique_consecutive.default)
def unique_consecutive(self, return_inverse=False, return_counts=False, dim=None):
    _require_concrete("torch.unique_consecutive", self)
    if dim is not None:
        _check_unique_dim_of_empty(self, _dim(dim, self.ndim))
    moved = jnp.ravel(self)[:, None] if dim is None else jnp.moveaxis(self, _dim(dim, self.ndim), 0)
    length = moved.shape[0]
    rows = moved.reshape(length, int(np.prod(moved.shape[1:], dtype=np.int64)))
    starts = np.ones(length, dtype=bool)
    if length:
        starts[1:] = np.asarray(jnp.any(rows[1:] != rows[:-1], axis=1))
    first = np.flatnonzero(starts)
    values = moved[first] if dim is not None else jnp.ravel(self)[first]
    if dim is not None:
        values = jnp.moveaxis(values, 0, _dim(dim, self.ndim))
    group = np.cumsum(starts) - 1
    if return_inverse:
        inverse = jnp.asarray(group, jnp.int64)
        inverse = inverse.reshape(self.shape) if dim is None else inverse
    else:
        inverse = _none()
    counts = jnp.asarray(np.diff(np.append(first, length)), jnp.int64) if return_counts else _none()
    return values, inverse, counts


@lowering(aten.bincount.default)
def bincount(self, weights=None, minlength=0):
    _require_concrete(
        "aten.bincount",
        self,
        hint=(", or use torch.zeros(n).scatter_add_(0, x, weights) with a fixed n"),
    )
    if self.ndim != 1:
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    check_index(
        self, 0, 2**63 - 1, RuntimeError, "bincount only supports 1-d non-negative integral inputs."
    )
    length = max(int(jnp.max(self)) + 1 if self.size else 0, minlength)
    if weights is None:
        return jnp.zeros(length, jnp.int64).at[self].add(1)
    dtype = jnp.float32 if weights.dtype == jnp.float32 else jnp.float64
    return jnp.zeros(length, dtype).at[self].add(weights.astype(dtype))


@lowering(aten.histc.default)
def histc(self, bins=100, min=0, max=0):
    data = jnp.ravel(self)
    low, high = jnp.asarray(min, self.dtype), jnp.asarray(max, self.dtype)
    if min == max and data.size:
        low, high = jnp.min(data), jnp.max(data)
    same = low == high
    low, high = jnp.where(same, low - 1, low), jnp.where(same, high + 1, high)
    position = jnp.floor((data - low) / (high - low) * bins).astype(jnp.int64)
    position = jnp.where(data == high, bins - 1, position)
    keep = (data >= low) & (data <= high)
    return jnp.zeros(bins, self.dtype).at[jnp.where(keep, position, bins)].add(1, mode="drop")


def _even_edges(left, right, count, dtype):
    """``count`` evenly spaced edges from ``left`` to ``right`` as ATen's linspace computes them
    (in the output dtype; the first half counts up from ``left``, the rest down from ``right``)."""
    left, right = left.astype(dtype), right.astype(dtype)
    step = (right - left) / max(count - 1, 1)
    i = jnp.arange(count)
    # The barrier keeps XLA from fusing multiply and add into an FMA, which rounds differently.
    up = left + lax.optimization_barrier(step * i.astype(dtype))
    down = right - lax.optimization_barrier(step * (count - 1 - i).astype(dtype))
    return jnp.where(i < count // 2, up, down)


def _outer_edges(points, bins, range):
    """Per dimension, the histogram's outermost edges: ``range``, else the data's extremes
    (0 and 1 for no data); equal edges are moved half a unit apart, as in PyTorch."""
    dims = points.shape[1]
    if range is not None:
        if len(range) != 2 * dims:
            raise RuntimeError(
                f"histogramdd: for a {dims}-dimensional histogram, range should "
                f"have {2 * dims} elements, but got {len(range)}"
            )
        left = jnp.asarray(range[0::2], jnp.float64)
        right = jnp.asarray(range[1::2], jnp.float64)
        if not isinstance(left, jax.core.Tracer) and bool(jnp.any(left > right)):
            raise ValueError(
                "histogramdd: expected the lower edge of each range to be at most its upper edge"
            )
    elif points.shape[0]:
        left = jnp.min(points, axis=0).astype(jnp.float64)
        right = jnp.max(points, axis=0).astype(jnp.float64)
    else:
        left, right = jnp.zeros(dims, jnp.float64), jnp.ones(dims, jnp.float64)
    same = left == right
    return jnp.where(same, left - 0.5, left), jnp.where(same, right + 0.5, right)


def _bin_edges(points, bins, range):
    for b in bins:
        if b <= 0:
            raise RuntimeError("histogramdd(): bins must be > 0, but got " + str(b))
    left, right = _outer_edges(points, bins, range)
    return [_even_edges(left[d], right[d], b + 1, points.dtype) for d, b in enumerate(bins)]


def _points(self, dims):
    """The input as an (N, D) array of points (a plain histogram has D = 1)."""
    return self.reshape(-1, dims)


def _histogram_counts(points, edges, weight, density):
    """Counts (or summed weights) per bin; a value on an inner edge goes to the bin on its
    right, one on the last edge to the last bin, values outside the edges nowhere."""
    bins = [e.shape[0] - 1 for e in edges]
    flat = jnp.zeros(points.shape[0], jnp.int64)
    inside = jnp.ones(points.shape[0], jnp.bool_)
    for d, e in enumerate(edges):
        x = points[:, d]
        position = jnp.searchsorted(e, x, side="right") - 1
        position = jnp.minimum(position, bins[d] - 1)
        inside &= (x >= e[0]) & (x <= e[-1])
        flat = flat * bins[d] + position
    total = int(np.prod(bins, dtype=np.int64))
    flat = jnp.where(inside, flat, total)
    amount = jnp.ones(points.shape[0], points.dtype) if weight is None else weight.reshape(-1)
    hist = jnp.zeros(total, points.dtype).at[flat].add(amount.astype(points.dtype), mode="drop")
    hist = hist.reshape(bins)
    if density:
        hist = hist / jnp.sum(hist)
        for d, e in enumerate(edges):
            shape = [1] * len(bins)
            shape[d] = bins[d]
            hist = hist / jnp.diff(e).reshape(shape)
    return hist


def _dims_of(self):
    return self.shape[-1] if self.ndim else 1


@lowering(aten.histogram.bin_ct)
def histogram(self, bins=100, *, range=None, weight=None, density=False):
    points = _points(self, 1)
    edges = _bin_edges(points, [bins], range)
    return _histogram_counts(points, edges, weight, density), edges[0]


@lowering(aten.histogram.bins_tensor)
def histogram_bins_tensor(self, bins, *, weight=None, density=False):
    points = _points(self, 1)
    return _histogram_counts(points, [bins], weight, density), bins


@lowering(aten._histogramdd_bin_edges.default)
def histogramdd_bin_edges(self, bins, *, range=None, weight=None, density=False):
    return _bin_edges(_points(self, _dims_of(self)), bins, range)


@lowering(aten._histogramdd_from_bin_cts.default)
def histogramdd_from_bin_cts(self, bins, *, range=None, weight=None, density=False):
    points = _points(self, _dims_of(self))
    return _histogram_counts(points, _bin_edges(points, bins, range), weight, density)


@lowering(aten._histogramdd_from_bin_tensors.default)
def histogramdd_from_bin_tensors(self, bins, *, weight=None, density=False):
    return _histogram_counts(_points(self, _dims_of(self)), bins, weight, density)
