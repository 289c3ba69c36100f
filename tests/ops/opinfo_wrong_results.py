"""OpInfo cases where torchlax returns the wrong dtype or shape: open bugs, not excuses.

The expected-failure table (``opinfo_expected_failures.py``) never excuses a wrong dtype or
shape. These cases do return one today; they are listed here, by name, so the suite can run
green while they are fixed. Each is tested strictly: it must still fail with a dtype or shape
mismatch (any other outcome fails the test, a pass included: then delete the entry). They
count as failures in ``opinfo_report.py``'s figures.
"""

from __future__ import annotations

KNOWN_WRONG_RESULTS: dict[tuple[str, str | None, str | None, str], str] = {
    # none today: quantile/nanquantile (in-place squeeze_) and the batch-norm saved statistics
    # were fixed; add an entry here only with the bug it stands for.
}
