"""Matrix products: ``mm``/``bmm``/``mv``/``dot``, the ``addmm`` family, grouped products
(mixture of experts), ``linalg_cross`` and ``_trilinear``.

Products run at the precision ``torch.get_float32_matmul_precision()`` says (``_precision``:
``HIGHEST`` under the default "highest", so float32 results match PyTorch's CPU kernels);
half-precision inputs accumulate in float32 as PyTorch's do. ``matmul`` is the one product the other families use.
"""

from __future__ import annotations

import jax
import jax.core
import jax.numpy as jnp
from torchlax_core import jax_dtype

from .. import _aten
from .._precision import product_precision
from .._promotion import accumulator, up
from .._table import lowering, named_decomposition
from ._common import HIGHEST, _scalar_name

aten = _aten.aten  # (an op this torch lacks: a Missing, skipped)


def matmul(a, b, out_dtype=None):
    """``a @ b`` (with NumPy broadcasting) at full precision, in ``out_dtype`` (default a's)."""
    out_dtype = out_dtype or a.dtype
    acc = accumulator(a.dtype) if a.dtype == b.dtype else None
    result = jnp.matmul(a, b, precision=product_precision(a.dtype), preferred_element_type=acc)
    return result.astype(out_dtype)


def _scaled_sum(product, self, beta, alpha, dtype):
    """``beta * self + alpha * product`` as the addmm family computes it (self ignored if beta=0)."""
    acc = accumulator(dtype) or dtype
    out = product.astype(acc)
    if alpha != 1:
        out = out * jnp.asarray(alpha, acc)
    if beta != 0:
        scaled = self.astype(acc) if beta == 1 else self.astype(acc) * jnp.asarray(beta, acc)
        out = out + scaled
    return jnp.broadcast_to(out, product.shape).astype(dtype)


# -- products -----------------------------------------------------------------------------------

# How PyTorch names dtypes in the products' dtype errors: ScalarType names (`_scalar_name`), and
# C++ type names.
_C_NAMES = {
    "bool": "bool",
    "uint8": "unsigned char",
    "int8": "signed char",
    "int16": "short int",
    "int32": "int",
    "int64": "long int",
    "float16": "c10::Half",
    "bfloat16": "c10::BFloat16",
    "float32": "float",
    "float64": "double",
    "complex64": "c10::complex<float>",
    "complex128": "c10::complex<double>",
}


def _same_dtype(message, *arrays) -> None:
    """PyTorch's products take one dtype (no promotion): mixed dtypes raise its error, which
    ``message(*names)`` spells (``names`` are ScalarType names, or C++ names for mm)."""
    if len({a.dtype for a in arrays if hasattr(a, "dtype")}) > 1:
        raise RuntimeError(message(*arrays))


@lowering(aten.mm.default)
def mm(self, mat2):
    _same_dtype(
        lambda a, b: (
            "expected m1 and m2 to have the same dtype, but got: "
            f"{_C_NAMES.get(a.dtype.name, a.dtype.name)} != "
            f"{_C_NAMES.get(b.dtype.name, b.dtype.name)}"
        ),
        self,
        mat2,
    )
    return matmul(self, mat2)


@lowering(aten.bmm.default)
def bmm(self, mat2):
    _same_dtype(
        lambda a, b: f"expected scalar type {_scalar_name(a)} but found {_scalar_name(b)}",
        self,
        mat2,
    )
    return matmul(self, mat2)


@lowering(aten.mm.dtype, aten.bmm.dtype)
def mm_dtype(self, mat2, out_dtype):
    acc = accumulator(self.dtype)
    acc = None if acc is None else jnp.promote_types(jax_dtype(out_dtype), acc)
    precision = product_precision(self.dtype)
    result = jnp.matmul(self, mat2, precision=precision, preferred_element_type=acc)
    return result.astype(jax_dtype(out_dtype))


@lowering(aten.mv.default)
def mv(self, vec):
    _same_dtype(
        lambda a, b: (
            "addmv input tensors must have the same dtype, but got "
            f"{_scalar_name(b)}, {_scalar_name(a)}, and {_scalar_name(b)}"
        ),
        self,
        vec,
    )
    return matmul(self, vec)


@lowering(aten.dot.default)
def dot(self, tensor):
    _same_dtype(_dot_message, self, tensor)
    return matmul(self, tensor)


def _dot_message(a, b):
    return (
        f"dot : expected both vectors to have same dtype, but found {_scalar_name(a)} and "
        f"{_scalar_name(b)}"
    )


@lowering(aten.vdot.default)
def vdot(self, other):
    _same_dtype(_dot_message, self, other)
    return matmul(jnp.conj(self), other)


@lowering(aten.addmm.default)
def addmm(self, mat1, mat2, *, beta=1, alpha=1):
    _same_dtype(
        lambda a, b: (
            f"mat1 and mat2 must have the same dtype, but got {_scalar_name(a)} "
            f"and {_scalar_name(b)}"
        ),
        mat1,
        mat2,
    )
    _same_dtype(
        lambda a, b: (
            f"self and mat2 must have the same dtype, but got {_scalar_name(a)} "
            f"and {_scalar_name(b)}"
        ),
        self,
        mat2,
    )
    return _scaled_sum(_raw_matmul(mat1, mat2), self, beta, alpha, mat1.dtype)


@lowering(aten.addmv.default)
def addmv(self, mat, vec, *, beta=1, alpha=1):
    _same_dtype(
        lambda a, b, c: (
            "addmv input tensors must have the same dtype, but got "
            f"{_scalar_name(a)}, {_scalar_name(b)}, and {_scalar_name(c)}"
        ),
        self,
        mat,
        vec,
    )
    return _scaled_sum(_raw_matmul(mat, vec), self, beta, alpha, mat.dtype)


@lowering(aten.baddbmm.default)
def baddbmm(self, batch1, batch2, *, beta=1, alpha=1):
    _same_dtype(
        lambda a, b: f"expected scalar type {_scalar_name(a)} but found {_scalar_name(b)}",
        batch1,
        batch2,
    )
    _same_dtype(
        lambda a, b, c: (
            f"Input dtypes must be the same, got: input "
            f"{_C_NAMES.get(a.dtype.name)}, batch1: {_C_NAMES.get(b.dtype.name)}, batch2: "
            f"{_C_NAMES.get(c.dtype.name)}"
        ),
        self,
        batch1,
        batch2,
    )
    return _scaled_sum(_raw_matmul(batch1, batch2), self, beta, alpha, batch1.dtype)


@lowering(aten.addbmm.default)
def addbmm(self, batch1, batch2, *, beta=1, alpha=1):
    _same_dtype(
        lambda a, b: (
            f"self and mat2 must have the same dtype, but got {_scalar_name(a)} "
            f"and {_scalar_name(b)}"
        ),
        batch1,
        batch2,
    )
    _same_dtype(
        lambda a, b: (
            f"self and mat2 must have the same dtype, but got {_scalar_name(a)} "
            f"and {_scalar_name(b)}"
        ),
        self,
        batch1,
    )
    acc = accumulator(batch1.dtype)
    precision = product_precision(batch1.dtype)
    product = jnp.einsum(
        "bij,bjk->ik", batch1, batch2, precision=precision, preferred_element_type=acc
    )
    return _scaled_sum(product, self, beta, alpha, batch1.dtype)


@lowering(aten.addr.default)
def addr(self, vec1, vec2, *, beta=1, alpha=1):
    return _scaled_sum(jnp.outer(vec1, vec2), self, beta, alpha, jnp.result_type(vec1, vec2))


def _raw_matmul(a, b):
    # Kept in the accumulator dtype so alpha/beta scaling rounds once, as PyTorch does.
    precision = product_precision(a.dtype)
    return jnp.matmul(a, b, precision=precision, preferred_element_type=accumulator(a.dtype))


# Grouped products (mixture-of-experts layers): ``offs`` holds each group's cumulative end along
# the grouped dimension (int32), so a group's rows, contraction slice or columns are static-shape
# masks of a traced ``offs``: the same program serves every routing. Positions past the last
# offset belong to no group and come out 0.
_GROUPED_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def _group_of(positions, offs):
    """The group index of each position (``len(offs)`` for positions past the last offset)."""
    return jnp.searchsorted(offs, positions, side="right")


def _check_grouped_mm(op, self, mat2, offs, bias, out_dtype) -> None:
    """PyTorch's checks of ``_grouped_mm``'s arguments: dtypes, ranks, ``offs`` given exactly
    when a matrix is 2-d, the contraction sizes."""
    for name, x in (("self", self), ("mat2", mat2)):
        if x.dtype not in _GROUPED_DTYPES:
            raise RuntimeError(
                f"{op}: expected {name} to be a float32, bfloat16 or float16 matrix, got {x.dtype}."
            )
        if x.ndim not in (2, 3):
            raise RuntimeError(f"{op}: {name} must be 2-d or 3-d, got {x.ndim}-d.")
    if self.dtype != mat2.dtype:
        raise RuntimeError(
            f"{op}: self ({self.dtype}) and mat2 ({mat2.dtype}) must have the same dtype."
        )
    if bias is not None:
        raise RuntimeError(
            f"{op}: bias is not supported (PyTorch does not support it yet); add "
            "it to the result instead."
        )
    if out_dtype is not None and jax_dtype(out_dtype) != self.dtype:
        raise RuntimeError(
            f"{op}: the output dtype must match self's dtype ({self.dtype}), got "
            f"{jax_dtype(out_dtype)}."
        )
    both_3d = self.ndim == 3 and mat2.ndim == 3
    if both_3d != (offs is None):
        raise RuntimeError(
            f"{op}: pass offs when either matrix is 2-d, and no offs when both are 3-d."
        )
    if offs is not None and (offs.ndim != 1 or offs.dtype != jnp.int32):
        raise RuntimeError(
            f"{op}: offs must be a 1-d int32 tensor of cumulative group ends, got "
            f"{offs.ndim}-d {offs.dtype}."
        )
    if self.shape[-1] != mat2.shape[-2]:
        raise RuntimeError(
            f"{op}: contraction sizes differ: self has {self.shape[-1]} columns, "
            f"mat2 has {mat2.shape[-2]} rows."
        )


@lowering(aten._grouped_mm.default)
def _grouped_mm(self, mat2, offs=None, bias=None, out_dtype=None):
    op = "aten._grouped_mm"
    _check_grouped_mm(op, self, mat2, offs, bias, out_dtype)
    both_3d = self.ndim == 3 and mat2.ndim == 3
    acc = accumulator(self.dtype)
    precision = product_precision(self.dtype)

    def dot(spec, *operands):
        return jnp.einsum(spec, *operands, precision=precision, preferred_element_type=acc)

    if both_3d:  # (G, M, K) @ (G, K, N): a batched product
        if self.shape[0] != mat2.shape[0]:
            raise RuntimeError(f"{op}: self has {self.shape[0]} groups, mat2 {mat2.shape[0]}.")
        out = dot("gmk,gkn->gmn", self, mat2)
    elif self.ndim == 2 and mat2.ndim == 3:  # rows of self grouped: row r uses mat2[group(r)]
        assert offs is not None  # checked above: given unless both are 3-d
        if offs.shape[0] != mat2.shape[0]:
            raise RuntimeError(f"{op}: offs has {offs.shape[0]} groups, mat2 {mat2.shape[0]}.")
        sizes = jnp.diff(offs, prepend=jnp.zeros((1,), offs.dtype))
        out = jax.lax.ragged_dot(self, mat2, sizes, precision=precision, preferred_element_type=acc)
        rows = jnp.arange(self.shape[0])
        out = jnp.where((rows < offs[-1])[:, None], out, 0)
    elif self.ndim == 2:  # the contraction grouped: one (M, N) product per slice of K
        assert offs is not None  # checked above: given unless both are 3-d
        k = jnp.arange(self.shape[1])
        member = _group_of(k, offs)[None, :] == jnp.arange(offs.shape[0])[:, None]  # (G, K)
        out = dot("mk,gk,kn->gmn", self, member.astype(self.dtype), mat2)
    else:  # (G, M, K) @ (K, N): columns of mat2 grouped, column n uses self[group(n)]
        assert offs is not None  # checked above: given unless both are 3-d
        if offs.shape[0] != self.shape[0]:
            raise RuntimeError(f"{op}: offs has {offs.shape[0]} groups, self {self.shape[0]}.")
        group = _group_of(jnp.arange(mat2.shape[1]), offs)  # (N,)
        full = dot("gmk,kn->gmn", self, mat2)
        columns = jnp.arange(mat2.shape[1])
        picked = full[jnp.minimum(group, self.shape[0] - 1), :, columns].T  # (M, N)
        out = jnp.where((group < self.shape[0])[None, :], picked, 0)
    return out.astype(self.dtype)


@named_decomposition("transformers::grouped_mm_fallback")
def _transformers_grouped_mm_fallback(input, weight, offs):
    # Hugging Face's MoE layers call this custom op under tracing (torch.compiler.is_compiling(),
    # as inside torchlax.jit) for non-bfloat16 weights; its CPU kernel loops over offs.tolist().
    # Rows past the last offset are 0 in both.
    return aten._grouped_mm(input, weight, offs)


@lowering(aten.linalg_cross.default)
def linalg_cross(self, other, *, dim=-1):
    shape = jnp.broadcast_shapes(self.shape, other.shape)
    return jnp.cross(jnp.broadcast_to(self, shape), jnp.broadcast_to(other, shape), axis=dim)


# -- bilinear -------------------------------------------------------------------------------------


@lowering(aten._trilinear.default)
def _trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    # sum over ``sumdim`` of i1 * i2 * i3, each unsqueezed at its ``expand`` dims. As PyTorch
    # does, i1 * i2 is contracted first over the summed dims i3 lacks and rounded to the result
    # dtype, then contracted with i3; an operand's size-1 dim that broadcasts carries no index.
    dtype = jnp.result_type(i1.dtype, i2.dtype, i3.dtype)
    operands = [up(i1), up(i2), up(i3)]
    total = i1.ndim + len(expand1)
    letters = [chr(ord("a") + d) for d in range(total)]
    shapes = []
    for x, expand in zip(operands, (expand1, expand2, expand3), strict=True):
        dims = iter(x.shape)
        shapes.append([1 if d in expand else next(dims) for d in range(total)])
    sizes = [next((s[d] for s in shapes if s[d] != 1), 1) for d in range(total)]  # broadcast
    specs, squeezed = [], []
    for x, expand, shape in zip(operands, (expand1, expand2, expand3), shapes, strict=True):
        kept = [d for d in range(total) if d not in expand]
        broadcast = [i for i, d in enumerate(kept) if shape[d] == 1 and sizes[d] != 1]
        squeezed.append(jnp.squeeze(x, axis=tuple(broadcast)) if broadcast else x)
        specs.append("".join(letters[d] for d in kept if not (shape[d] == 1 and sizes[d] != 1)))
    first_sums = {letters[d] for d in sumdim if letters[d] not in specs[2]}
    pair = "".join(c for c in letters if c in specs[0] + specs[1] and c not in first_sums)
    partial = jnp.einsum(
        f"{specs[0]},{specs[1]}->{pair}", squeezed[0], squeezed[1], precision=HIGHEST
    )
    partial = up(partial.astype(dtype))
    kept = [d for d in range(total) if d not in sumdim]
    output = "".join(letters[d] for d in kept if letters[d] in pair + specs[2])
    out = jnp.einsum(f"{pair},{specs[2]}->{output}", partial, squeezed[2], precision=HIGHEST)
    out = out.reshape([sizes[d] for d in kept])  # dims of size 1 everywhere come back
    return out.astype(dtype)
