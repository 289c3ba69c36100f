"""OpInfo conformance: every op of PyTorch's ``op_db`` on torchlax Tensors against eager CPU.

Each test runs one OpInfo at one dtype on a few of its sample inputs, eagerly
(``test_opinfo[eager-add-float32]``) or inside ``jax.jit`` (``test_opinfo[jit-add-float32]``),
and compares values, dtypes and shapes with PyTorch on the CPU. Known failures live in ONE table,
``opinfo_expected_failures.EXPECTED_FAILURES``; an entry that passes fails the test (strict), and
a dtype mismatch is never excused by the table.

``python tests/ops/opinfo_report.py`` runs the same cases in-process and prints coverage.
Eager mode runs every dtype of ``DTYPES`` the op supports (bfloat16 included), and float16
(``HALF_DTYPES``) on the first sample of the ops that compute: pointwise, reduction,
``nn.functional`` and ``special`` OpInfos (``computes``), except those whose
computing ATen ops (``aten_packets``: the packet an OpInfo is named after, else the ATen ops its
first float16 sample dispatches on the CPU, so ``nn.functional.selu`` -> ``aten.elu``) all have
lowerings that declare their float32 computation in their stanza (``declared_opmath``). Why
that restriction loses nothing: float16's longer mantissa shows a missing float32 up-cast that
bfloat16's tolerance hides; the data-movement ops (views, indexing, factories) do the same at
any dtype, and a declared op's up-cast is ``_promotion``'s, checked once in test_promotion.py
(and test_opmath_contract.py keeps lowerings from up-casting by hand), its body then computing
what the float32 case checks. ``test_float16_selection`` pins which ops keep float16 (about 150
eager cases); under ``jax.jit`` float16 runs on a few representative ops (``JIT_HALF_OPS``). Under ``jax.jit`` the suite runs one
dtype per op (float32 where supported, else the first supported one): dtype-specific behaviour is
what eager mode checks (each sample's first call of its signature, which runs the lowering op
by op; the op cache's executable of the same lowering is what jit mode's trace builds, and
``TORCHLAX_OP_CACHE_MIN_CALLS=1`` runs the eager cases through it: all pass but one float32
expected failure, closer to float64 when fused), while jit mode checks that the op traces. That halves the suite's
largest part; ``opinfo_report.py`` and ``TORCHLAX_OPINFO_JIT_DTYPES=all`` run the full matrix.

Environment: ``TORCHLAX_OPINFO_SAMPLES`` (samples per case, default 2),
``TORCHLAX_OPINFO_JIT_DTYPES`` (``one``, the default, or ``all``), ``TORCHLAX_OPINFO_HALF_OPS``
(``compute``, the default, or ``all``: float16 on every op that supports it).
"""

from __future__ import annotations

import os
import random
import sys
import warnings
from dataclasses import dataclass

import jax
import numpy as np
import pytest
import torch
import torchlax_core
from torch.testing._internal.common_device_type import toleranceOverride
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_utils import SEED
from torch.testing._internal.opinfo.core import BinaryUfuncInfo, ReductionOpInfo, UnaryUfuncInfo
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torchlax_ops import _lowerings  # noqa: F401  (fills the lowering tables)
from torchlax_ops._promotion import Promotion
from torchlax_ops._table import DECOMPOSITIONS, LOWERINGS

sys.path.insert(0, os.path.dirname(__file__))
from opinfo_expected_failures import EXPECTED_FAILURES as _TABLE  # noqa: E402
from opinfo_machine_failures import MACHINE_FAILURES  # noqa: E402
from opinfo_wrong_results import KNOWN_WRONG_RESULTS  # noqa: E402

DTYPES = (torch.float32, torch.float64, torch.int64, torch.bool, torch.bfloat16)
HALF_DTYPES = (torch.float16,)  # eager mode, first sample only
MODES = ("eager", "jit")
MAX_SAMPLES = int(os.environ.get("TORCHLAX_OPINFO_SAMPLES", "2"))
JIT_DTYPES = os.environ.get("TORCHLAX_OPINFO_JIT_DTYPES", "one")
if JIT_DTYPES not in ("one", "all"):
    raise ValueError(f"TORCHLAX_OPINFO_JIT_DTYPES must be 'one' or 'all', not {JIT_DTYPES!r}.")
HALF_OPS = os.environ.get("TORCHLAX_OPINFO_HALF_OPS", "compute")
if HALF_OPS not in ("compute", "all"):
    raise ValueError(f"TORCHLAX_OPINFO_HALF_OPS must be 'compute' or 'all', not {HALF_OPS!r}.")

# Ops whose values are random: checked for shape, dtype and reproducibility under a seed.
RANDOM_OPS = frozenset(
    {
        "bernoulli",
        "cauchy",
        "exponential",
        "geometric",
        "log_normal",
        "multinomial",
        "normal",
        "uniform",
        "rand_like",
        "randn",
        "randn_like",
        "randint",
        "randint_like",
        "nn.functional.dropout",
        "nn.functional.dropout2d",
        "nn.functional.dropout3d",
        "nn.functional.alpha_dropout",
        "nn.functional.feature_alpha_dropout.with_train",
        "nn.functional.rrelu",
        "nn.functional.fractional_max_pool2d",
        "nn.functional.fractional_max_pool3d",
        "svd_lowrank",
        "pca_lowrank",
        # Its samples include dropout_p=0.5 with training=True (dropout on the attention weights).
        "nn.functional.multi_head_attention_forward",
    }
)
# Ops whose values are uninitialised memory in PyTorch: only shape and dtype are compared.
UNINITIALISED_OPS = frozenset(
    {
        "empty",
        "empty_like",
        "empty_strided",
        "empty_permuted",
        "new_empty",
        "new_empty_strided",
        "resize_",
        "resize_as_",
    }
)
# Ops that return host values or whose sample inputs have data-dependent output shapes: by
# nature they cannot run under jax.jit, so they are tested eagerly only.
EAGER_ONLY = frozenset(
    {
        "item",
        "allclose",
        "equal",
        "nonzero",
        "argwhere",
        "unique",
        "unique_consecutive",
        "masked_select",
        "repeat_interleave",
        "bincount",
        "__getitem__",
        "index_put",
        "tensor_split",
        "narrow",
    }
)

# float16 under jax.jit (first sample): one op per way half precision is declared, to check that
# the casts trace and round as they do eagerly: promotion (add, mul), opmath (exp, gelu), a
# float32 accumulator (matmul, addmm, conv2d), reductions and scans (sum, mean, var, cumsum),
# results= (softmax's half_to_float, layer norm's float32 statistics, batch norm's running
# statistics, vector norm's dtype=), and composites of them (cross entropy, pooling, attention).
JIT_HALF_OPS = frozenset(
    {
        "add",
        "mul",
        "exp",
        "nn.functional.gelu",
        "matmul",
        "nn.functional.conv2d",
        "sum",
        "mean",
        "softmax",
        "nn.functional.layer_norm",
        "nn.functional.batch_norm",
        "linalg.vector_norm",
        "log_softmax",
        "addmm",
        "var",
        "cumsum",
        "nn.functional.cross_entropy",
        "nn.functional.avg_pool2d",
        "nn.functional.scaled_dot_product_attention",
    }
)

# OpInfos whose PyTorch reference cannot run on a CPU at all (runtime-compiled CUDA kernels:
# eager PyTorch raises "Jiterator is only supported on CUDA and ROCm GPUs"), so there is
# nothing to compare against here. They are not counted in the coverage figures.
CUDA_ONLY = frozenset(
    {
        "jiterator_unary",
        "jiterator_binary",
        "jiterator_binary_return_by_ref",
        "jiterator_2inputs_2outputs",
        "jiterator_4inputs_with_extra_args",
    }
)

BASE_TOLERANCE = {  # (atol, rtol): XLA's math functions differ from ATen's by a few ulps
    torch.float32: (1e-5, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.bfloat16: (1e-2, 1.6e-2),
    torch.float16: (1e-3, 1e-3),  # torch.testing's own float16 default rtol
    # complex results (FFTs: XLA's and MKL's/pocketfft's transforms round differently)
    torch.complex64: (1e-5, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}


def case_name(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class Case:
    mode: str
    op: object
    dtype: torch.dtype

    @property
    def id(self) -> str:
        return f"{self.mode}-{case_name(self.op)}-{dtype_name(self.dtype)}"

    @property
    def key(self) -> tuple:
        return (self.op.name, self.op.variant_test_name or None, dtype_name(self.dtype), self.mode)


def computes(op) -> bool:
    """Whether ``op`` does arithmetic (float16 then rounds differently), not only moves data."""
    return isinstance(op, UnaryUfuncInfo | BinaryUfuncInfo | ReductionOpInfo) or op.name.startswith(
        ("nn.functional.", "special.")
    )


def _declares_opmath(fn) -> bool:
    promotion = getattr(fn, "promotion", None)
    opmath = getattr(fn, "opmath", None) is not None
    return opmath or (promotion is not None and promotion[1] != Promotion.NO_OPMATH)


def _packet_lowerings():
    """ATen packet -> its lowerings (None for a packet with a torch-level decomposition too)."""
    packets: dict = {}
    for op, fn in LOWERINGS:
        packets.setdefault(getattr(op, "overloadpacket", op), []).append(fn)
    for op, _ in DECOMPOSITIONS:
        packets[getattr(op, "overloadpacket", op)] = None
    return packets


_PACKETS = _packet_lowerings()


# ATen ops that move or allocate data without arithmetic: float16 rounds nothing in them that
# the ops around them do not, so they neither need nor prevent a declaration (views likewise).
DATA_MOVEMENT = frozenset(
    getattr(torch.ops.aten, name)
    for name in (
        "_to_copy",
        "clone",
        "copy_",
        "detach",
        "alias",
        "lift_fresh",
        "empty",
        "empty_like",
        "new_empty",
        "zeros_like",
        "ones_like",
        "new_zeros",
        "zeros",
        "ones",
        "fill_",
        "scalar_tensor",
        "_local_scalar_dense",
    )
)


class _AtenOps(TorchDispatchMode):
    """Records the ATen overload packets a call dispatches (below autograd and PyTorch's
    composite decompositions: what a torchlax Tensor's ``__torch_dispatch__`` receives)."""

    def __init__(self):
        super().__init__()
        self.packets: set = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            self.packets.add(func.overloadpacket)
        return func(*args, **(kwargs or {}))


def aten_packets(op) -> set | None:
    """The computing ATen packets ``op`` reaches: the packet it is named after when torchlax
    lowers that packet (``aten_name``), else those its first float16 sample dispatches on the
    CPU (``nn.functional.elu`` -> ``aten.elu``, ``nn.functional.cross_entropy`` ->
    ``aten._log_softmax`` and ``aten.nll_loss_forward``), data movement left out. None when the
    sample cannot run or reaches no computing op (the op then keeps its float16 case)."""
    packet = getattr(torch.ops.aten, op.aten_name.replace(".", "_"), None)
    if packet in _PACKETS:
        return {packet}
    if case_name(op) in RANDOM_OPS or op.name in RANDOM_OPS:
        return None
    found = samples(op, torch.float16)
    if not found:
        return None
    sample = found[0]
    recorded = _AtenOps()
    try:
        with recorded, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecations of the sample's op, shown by its test
            op.op(sample.input, *sample.args, **sample.kwargs)
    except Exception:
        return None
    return (recorded.packets - DATA_MOVEMENT) or None


def declared_opmath(op) -> bool:
    """Whether every lowering of every computing ATen op that ``op`` reaches (``aten_packets``)
    computes half precision in float32 by its declaration (``promote=`` other than NO_OPMATH,
    or ``opmath=True``): float16 then checks nothing the float32 and bfloat16 cases do not."""
    packets = aten_packets(op)
    if not packets:
        return False
    for packet in packets:
        lowerings = _PACKETS.get(packet)
        if not lowerings or not all(_declares_opmath(fn) for fn in lowerings):
            return False
    return True


def all_cases(jit_dtypes: str = "all", half_ops: str = "all") -> list[Case]:
    """Every (mode, op, dtype) case; with ``jit_dtypes="one"`` jit mode keeps one dtype per op,
    with ``half_ops="compute"`` float16 runs on the ops that ``computes`` and whose lowerings do
    not declare their float32 computation (``declared_opmath``) only."""
    cases = []
    for op in op_db:
        if op.name in CUDA_ONLY:
            continue
        supported = op.supported_dtypes("cpu")
        dtypes = [d for d in DTYPES if d in supported]
        for mode in MODES:
            if mode == "jit" and op.name in EAGER_ONLY:
                continue
            if mode == "jit" and jit_dtypes == "one":
                dtypes = [torch.float32] if torch.float32 in dtypes else dtypes[:1]
            cases.extend(Case(mode, op, d) for d in dtypes)
        half = [d for d in HALF_DTYPES if d in supported]
        if half and (half_ops == "all" or (computes(op) and not declared_opmath(op))):
            cases.extend(Case("eager", op, d) for d in half)
        if op.name in JIT_HALF_OPS and not op.variant_test_name:
            cases.extend(Case("jit", op, d) for d in HALF_DTYPES if d in supported)
    return cases


EXPECTED_FAILURES = {**_TABLE, **MACHINE_FAILURES}


def expected_failure(case: Case) -> str | None:
    name, variant, dtype, mode = case.key
    for d in (dtype, None):
        reason = EXPECTED_FAILURES.get((name, variant, d, mode))
        if reason is not None:
            return reason
    return None


# -- running one case ---------------------------------------------------------------------------


class DtypeMismatch(AssertionError):
    """torchlax's result dtype differs from PyTorch's: never excused by the failure table."""


class ShapeMismatch(AssertionError):
    pass


def tolerance(op, dtype):
    """OpInfo's own tolerance overrides for ``dtype`` (the loosest of them), else zero."""
    atol = rtol = 0.0
    for info in op.decorators:
        for decorator in getattr(info, "decorators", ()):
            if isinstance(decorator, toleranceOverride) and dtype in decorator.d:
                atol = max(atol, decorator.d[dtype].atol)
                rtol = max(rtol, decorator.d[dtype].rtol)
    return atol, rtol


def seed(value: int) -> None:
    """``torch.manual_seed(value)`` for the generator these tests draw from: the CPU one (the
    samples, PyTorch's reference run, and torchlax's PRNG keys, drawn from it: the "jax"
    device's ``manual_seed_all`` has nothing more to seed). ``torch.manual_seed`` also queues
    the seed for CUDA, XPU and MTIA, each recording the caller's stack while not initialised:
    ~1.2 ms a call at pytest's depth (loaded), and a case seeds 7 times."""
    torch.default_generator.manual_seed(value)


def samples(op, dtype):
    # Not op.sample_inputs(): its iterator looks for the running unittest test by walking the
    # interpreter stack with inspect (about 0.4 s a call here, most of a case's time). Each
    # sample is seeded as that iterator seeds it when no unittest test runs (set_rng_seed).
    seed(0)
    generated = iter(op.sample_inputs_func(op, "cpu", dtype, False))
    found = []
    for _ in range(1 if dtype in HALF_DTYPES else MAX_SAMPLES):
        seed(SEED)
        random.seed(SEED)
        np.random.seed(SEED)
        sample = next(generated, None)
        if sample is None:
            break
        found.append(sample)
    return found


def clone(x):
    return x.clone() if isinstance(x, torch.Tensor) else x


# Ops whose samples pass tensor arguments that PyTorch requires on the CPU whatever the input's
# device (tensor_split's indices, read on the host): only the sample's input moves.
HOST_TENSOR_ARGS = frozenset({"tensor_split"})
# Ops that read their input's storage, not only its elements (as_strided's partial_views pass
# base[5:15]): the input moves as its base, and the view is taken again on torchlax.
STORAGE_READERS = frozenset({"as_strided"})


def storage_of(x):
    """(a copy of the base, size, stride, offset) of a view, for STORAGE_READERS; else None."""
    if not isinstance(x, torch.Tensor) or x._base is None:
        return None
    return x._base.detach().clone(), x.size(), x.stride(), x.storage_offset()


def to_jax(tree, op=None, storage=None):
    """The sample on torchlax: tensors moved to "jax", and a ``device="cpu"`` argument too."""

    def move(x):
        if isinstance(x, torch.Tensor):
            return x.to("jax")
        if isinstance(x, torch.device | str) and x in ("cpu", torch.device("cpu")):
            return torch.device("jax")  # e.g. x.to("cpu", torch.float64): the tested device
        return x

    if op is not None and op.name in HOST_TENSOR_ARGS:
        sample_input, args, kwargs = tree
        return move(sample_input), args, kwargs
    sample_input, args, kwargs = pytree.tree_map(move, tree)
    if storage is not None:
        base, size, stride, offset = storage
        sample_input = base.to("jax").as_strided(size, stride, offset)
    if "device" in kwargs and torch.device(kwargs["device"]).type == "cpu":
        kwargs = {**kwargs, "device": "jax"}
    return sample_input, args, kwargs


def to_cpu(tree):
    def convert(x):
        if isinstance(x, jax.Array):
            x = torchlax_core.wrap(x)
        return x.cpu() if isinstance(x, torch.Tensor) else x

    return pytree.tree_map(convert, tree)


def call(op, args_tree):
    sample_input, args, kwargs = args_tree
    return op.op(sample_input, *args, **kwargs)


def run_eager(op, jax_tree):
    out = call(op, jax_tree)
    return out, jax_tree


def run_jit(op, jax_tree):
    """Trace ``op`` with the sample's tensors as jit inputs and everything else static."""
    leaves, spec = pytree.tree_flatten(jax_tree)
    positions = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    host_outputs = {}

    env = torchlax_core.current_env()

    def program(key, *arrays):
        values = list(leaves)
        for i, a in zip(positions, arrays):
            values[i] = torchlax_core.wrap(a)
        tree = pytree.tree_unflatten(values, spec)
        with env.prng_key_scope(key):  # random ops draw from a key input, as torchlax.jit does
            out = call(op, tree)
        out_leaves, out_spec = pytree.tree_flatten(out)
        host_outputs["spec"] = out_spec
        host_outputs["leaves"] = out_leaves
        in_after = [pytree.tree_flatten(tree)[0][i].jax() for i in positions]
        return [x.jax() for x in out_leaves if isinstance(x, torch.Tensor)], in_after

    key = env.next_prng_key()  # drawn from torch's generator: reproducible under a seed
    out_arrays, in_after = jax.jit(program)(key, *[leaves[i].jax() for i in positions])
    arrays = iter(out_arrays)
    out_leaves = [
        next(arrays) if isinstance(x, torch.Tensor) else x for x in host_outputs["leaves"]
    ]
    values = list(leaves)
    for i, a in zip(positions, in_after):
        values[i] = a
    return pytree.tree_unflatten(out_leaves, host_outputs["spec"]), pytree.tree_unflatten(
        values, spec
    )


def _fix_eigenvector_phases(out, tree):
    """(eigenvalues, eigenvectors) with each eigenvector scaled so its largest entry is real
    and positive. LAPACK defines eigenvectors only up to a sign (real) or a unit phase
    (complex), and MKL's LAPACK (PyTorch's CPU build) and JAX's pick differently."""
    values, vectors = out
    if vectors.numel() == 0:
        return out
    pivot = vectors.abs().argmax(dim=-2, keepdim=True)
    lead = vectors.gather(-2, pivot)
    return values, vectors * (lead.abs() / lead).conj()


def _tie_order_free(dim_at, indices_at):
    """Indices replaced by the values they pick, for an unstable sort or topk: PyTorch leaves
    the order of equal elements unspecified (its CPU sort is std::sort's, not stable), so any
    index of an equal value is right. ``stable=True`` keeps the exact comparison."""

    def canonical(out, tree):
        sample_input, args, kwargs = tree
        if kwargs.get("stable") or sample_input.dim() == 0:
            return out
        dim = kwargs.get("dim", args[dim_at] if len(args) > dim_at else -1)
        single = isinstance(out, torch.Tensor)
        parts = [out] if single else list(out)
        parts[indices_at] = sample_input.gather(dim, parts[indices_at])
        return parts[0] if single else tuple(parts)

    return canonical


# Ops whose outputs PyTorch defines only up to an equivalence: both sides are mapped to one
# representative before comparing values (dtype and shape are compared as they come).
CANONICAL_FORM = {
    "linalg.eig": _fix_eigenvector_phases,
    "linalg.eigh": _fix_eigenvector_phases,
    "sort": _tie_order_free(dim_at=0, indices_at=1),
    "argsort": _tie_order_free(dim_at=0, indices_at=0),
    "topk": _tie_order_free(dim_at=1, indices_at=1),
}


def compare(
    actual,
    expected,
    *,
    atol,
    rtol,
    values=True,
    what="output",
    tensors_only=False,
    canonical=None,
    tree=None,
):
    for leaf in pytree.tree_leaves(actual):
        if isinstance(leaf, torch.Tensor) and not isinstance(leaf, torchlax_core.Tensor):
            raise AssertionError(f"{what}: torchlax returned a {leaf.device} tensor, not a jax one")
    actual = to_cpu(actual)
    if canonical is not None and values:
        for a, e in zip(pytree.tree_leaves(actual), pytree.tree_leaves(expected)):
            if isinstance(e, torch.Tensor) and (a.dtype != e.dtype or a.shape != e.shape):
                break  # reported as a dtype/shape mismatch below
        else:
            actual, expected = canonical(actual, tree), canonical(expected, tree)
    actual_leaves, _ = pytree.tree_flatten(actual)
    expected_leaves, _ = pytree.tree_flatten(expected)
    if len(actual_leaves) != len(expected_leaves):
        raise AssertionError(
            f"{what}: torchlax returned {len(actual_leaves)} values, PyTorch {len(expected_leaves)}"
        )
    for i, (a, e) in enumerate(zip(actual_leaves, expected_leaves)):
        where = f"{what}[{i}]"
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor | jax.Array):
                raise AssertionError(
                    f"{where}: expected a tensor, torchlax gave {type(a).__name__}"
                )
            if a.dtype != e.dtype:
                raise DtypeMismatch(f"{where}: dtype {a.dtype}, PyTorch gives {e.dtype}")
            if a.shape != e.shape:
                raise ShapeMismatch(
                    f"{where}: shape {tuple(a.shape)}, PyTorch gives {tuple(e.shape)}"
                )
            if values:
                base_atol, base_rtol = BASE_TOLERANCE.get(e.dtype, (0.0, 0.0))
                torch.testing.assert_close(
                    a,
                    e,
                    atol=max(atol, base_atol),
                    rtol=max(rtol, base_rtol),
                    equal_nan=True,
                    check_device=False,
                    msg=lambda m, where=where: f"{where}: {m}",
                )
        elif tensors_only:
            continue
        elif values and isinstance(e, float) and isinstance(a, float):
            torch.testing.assert_close(
                a, e, atol=max(atol, 1e-7), rtol=max(rtol, 1e-7), equal_nan=True
            )
        elif values and a != e:
            raise AssertionError(f"{where}: torchlax gave {a!r}, PyTorch {e!r}")


def run_case(case: Case) -> None:
    """Raise if torchlax disagrees with eager PyTorch on any sample of ``case``."""
    op, dtype = case.op, case.dtype
    atol, rtol = tolerance(op, dtype)
    runner = run_jit if case.mode == "jit" else run_eager
    random = case_name(op) in RANDOM_OPS or op.name in RANDOM_OPS
    uninitialised = op.name in UNINITIALISED_OPS
    with torchlax_core.enable():
        for n, sample in enumerate(samples(op, dtype)):
            tree = (sample.input, tuple(sample.args), dict(sample.kwargs))
            pristine = pytree.tree_map(clone, tree)  # the CPU run may mutate ``tree``
            storage = storage_of(sample.input) if op.name in STORAGE_READERS else None
            seed(1)
            expected = call(op, tree)
            seed(1)
            actual, jax_after = runner(op, to_jax(pristine, op, storage))
            what = f"sample {n}"
            values = not (random or uninitialised)
            compare(
                actual,
                expected,
                atol=atol,
                rtol=rtol,
                values=values,
                what=what,
                canonical=CANONICAL_FORM.get(op.name),
                tree=pristine,
            )
            if values and op.name not in HOST_TENSOR_ARGS:  # in-place ops: mutated inputs too
                compare(
                    jax_after, tree, atol=atol, rtol=rtol, what=f"{what} inputs", tensors_only=True
                )
            if random:  # the same seed draws the same values
                seed(1)
                again, _ = runner(op, to_jax(pristine, op, storage))
                compare(again, to_cpu(actual), atol=0, rtol=0, what=f"{what} reseeded")


# -- pytest -------------------------------------------------------------------------------------

CASES = all_cases(JIT_DTYPES, HALF_OPS)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_opinfo(case: Case):
    torchlax_core.default_env().config.fallback_to_torch = False
    wrong = KNOWN_WRONG_RESULTS.get(case.key)
    if wrong is not None:
        try:
            run_case(case)
        except (DtypeMismatch, ShapeMismatch):
            pytest.xfail(f"open bug (wrong dtype or shape): {wrong}")
        pytest.fail(
            f"{case.key!r} no longer returns a wrong dtype or shape: remove it from "
            "tests/ops/opinfo_wrong_results.py",
            pytrace=False,
        )
    reason = expected_failure(case)
    if reason is None:
        run_case(case)
        return
    try:
        run_case(case)
    except (DtypeMismatch, ShapeMismatch):
        raise  # a wrong dtype or shape is a bug even where the table expects a failure
    except Exception:
        pytest.xfail(reason)
    pytest.fail(
        f"unexpected success, remove from table: {case.key!r} in "
        "tests/ops/opinfo_expected_failures.py",
        pytrace=False,
    )


def _half_ops(mode: str) -> set[str]:
    return {case_name(c.op) for c in CASES if c.mode == mode and c.dtype in HALF_DTYPES}


@pytest.mark.skipif(HALF_OPS != "compute", reason="float16 runs on every op")
def test_float16_selection():
    """The float16 run keeps the ops that compute without a declaration and skips those whose
    ATen ops all declare opmath, ``nn.functional`` OpInfos included (mapped through the ATen
    ops they dispatch)."""
    eager = _half_ops("eager")
    kept = {"sum", "nn.functional.conv2d", "nn.functional.cross_entropy", "nn.functional.linear"}
    assert kept <= eager, kept - eager
    skipped = {"exp", "nn.functional.elu", "nn.functional.silu", "nn.functional.layer_norm"}
    assert not skipped & eager, skipped & eager
    assert aten_packets(_OPS["nn.functional.selu"]) == {torch.ops.aten.elu}
    assert JIT_HALF_OPS <= _half_ops("jit")


_OPS = {case_name(op): op for op in op_db}
