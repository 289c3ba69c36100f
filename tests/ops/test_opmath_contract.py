"""Contract: no lowering up-casts half precision by hand; it declares ``opmath=True``.

A lowering whose half-precision arguments compute in float32 and round once (PyTorch's
``pw_cast_for_opmath``) says so in its stanza, ``@lowering(op, opmath=True)``, and
``_promotion.py`` does the casts; ``results=`` in the stanza says where each result rounds back
when that is not the arguments' common dtype (an output like the input, float32 statistics, a
``dtype=`` or ``half_to_float`` argument). This test parses every module of ``torchlax_ops`` but
``_promotion.py`` and fails on a hand-written up-cast: a call of ``up``, a use of ``HALF``, an
``.astype(float32)``, or a local tuple of the half dtypes. The dtype helpers ``opmath_dtype`` and
``accumulator`` stay allowed: they answer for a ``dtype=`` argument or an accumulator, which no
declaration can.

``ALLOWED`` lists the functions that still must, each with why; an entry that no longer
up-casts fails the test too, so the list only shrinks.
"""

from __future__ import annotations

import ast
import pathlib

import torchlax_ops

ALLOWED = {
    "_lowerings/matmul.py:_trilinear": (
        "rounds i1*i2 to the half-precision result dtype before the product with i3, as PyTorch"
    ),
    "_lowerings/pooling.py:_adaptive_avg_pool3d_kernel": (
        "not an up-cast: half precision sums in the input dtype, as the scalar kernel does"
    ),
    "_lowerings/resampling.py:_nearest_index": (
        "not data: source indices on the host in float32, as PyTorch's kernel computes them"
    ),
    "_lowerings/resampling.py:_reflect": "the parity of the flip count, exact in float32",
    "_lowerings/resampling.py:_grid_sample": (
        "not an up-cast: half precision takes the scalar kernel's unfused steps"
    ),
    "_lowerings/resampling.py:_linspace_from_neg_one": (
        "the base grid rounds to the half dtype at each step before the float32 product"
    ),
    "_lowerings/resampling.py:affine_grid_generator": (
        "the base grid rounds to the half dtype at each step before the float32 product"
    ),
    "_attention_kernels.py:_bias": (
        "not an up-cast of data: the additive bias JAX's Pallas kernel adds to its float32 scores"
    ),
    "_splash_kernel.py:backward": (
        "the splash kernel's dq is that of q scaled first: scaled back in float32, rounded once"
    ),
    "_lowerings/random.py:multinomial": (
        "log-probabilities in float32 for every dtype but float64, half or not"
    ),
}

_FLOAT32 = {"float32"}
_HALF_NAMES = {"float16", "bfloat16"}


def _name(node: ast.AST) -> str | None:
    """``jnp.float32`` / ``np.float32`` / ``float32`` / ``"float32"`` -> ``"float32"``."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Call) and len(node.args) == 1:  # jnp.dtype(jnp.float32)
        return _name(node.args[0])
    return None


def _hand_upcasts(node: ast.AST) -> list[str]:
    found = []
    for inner in ast.walk(node):
        if isinstance(inner, ast.Call):
            callee = _name(inner.func)
            if callee in ("up", "_up"):
                found.append("up(...)")
            elif callee == "astype" and inner.args and _name(inner.args[0]) in _FLOAT32:
                found.append(".astype(float32)")
        elif isinstance(inner, ast.Name) and inner.id in ("HALF", "_HALF", "_LOW_PRECISION"):
            found.append(inner.id)
        elif isinstance(inner, ast.Tuple | ast.List | ast.Set):
            names = {_name(e) for e in inner.elts}
            if names == _HALF_NAMES:
                found.append("a tuple of the half dtypes")
    return found


def _offenders() -> dict[str, list[str]]:
    package = pathlib.Path(torchlax_ops.__file__).parent
    offenders = {}
    for path in sorted(package.rglob("*.py")):
        if path.name == "_promotion.py":
            continue
        module = ast.parse(path.read_text())
        for node in module.body:
            imports = isinstance(node, ast.Import | ast.ImportFrom)
            found = [] if imports else _hand_upcasts(node)
            if found:
                name = getattr(node, "name", f"line {node.lineno}")
                offenders[f"{path.relative_to(package).as_posix()}:{name}"] = found
    return offenders


def test_no_lowering_up_casts_half_precision_by_hand():
    offenders = _offenders()
    new = {k: v for k, v in offenders.items() if k not in ALLOWED}
    stale = sorted(set(ALLOWED) - set(offenders))
    assert not new, (
        f"These functions up-cast half precision by hand: {new}. Declare it in the lowering's "
        "stanza (@lowering(op, opmath=True)) or, if it cannot be declared, add the function to "
        "ALLOWED with the reason."
    )
    assert not stale, f"These ALLOWED entries no longer up-cast by hand; remove them: {stale}"


def test_the_contract_sees_each_kind_of_hand_upcast():
    source = """
def f(x):
    return up(x), x.astype(jnp.float32), x.dtype in HALF, (jnp.float16, jnp.bfloat16)
"""
    assert sorted(_hand_upcasts(ast.parse(source))) == sorted(
        ["up(...)", ".astype(float32)", "HALF", "a tuple of the half dtypes"]
    )
