"""OpInfo cases where torchlax returns the wrong dtype or shape: open bugs, not excuses.

The expected-failure table (``opinfo_expected_failures.py``) never excuses a wrong dtype or
shape. These cases do return one today; they are listed here, by name, so the suite can run
green while they are fixed. Each is tested strictly: it must still fail with a dtype or shape
mismatch (any other outcome fails the test, a pass included: then delete the entry). They
count as failures in ``opinfo_report.py``'s figures.
"""

from __future__ import annotations

_QUANTILE = ("PyTorch's composite ends with an in-place squeeze_ (an inplace_view op); torchlax "
             "cannot change a tensor's shape in place, so the result keeps shape (1,) instead of ()")
_BATCH_NORM = ("saved mean/invstd come back with the wrong shape (eval mode) or in float32 where "
               "PyTorch keeps bfloat16")

KNOWN_WRONG_RESULTS: dict[tuple[str, str | None, str | None, str], str] = {
    **{(op, None, dtype, mode): _QUANTILE
       for op in ("quantile", "nanquantile")
       for dtype in ("float32", "float64") for mode in ("eager", "jit")},
    **{(op, None, dtype, mode): _BATCH_NORM
       for op in ("native_batch_norm", "_native_batch_norm_legit")
       for dtype in ("float32", "float64", "bfloat16") for mode in ("eager", "jit")},
    **{("_batch_norm_with_update", None, "bfloat16", mode): _BATCH_NORM
       for mode in ("eager", "jit")},
}
