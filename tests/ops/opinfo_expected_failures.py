"""The one table of OpInfo cases known to fail, each with its reason.

Key: ``(op_name, variant_or_None, dtype_or_None, mode)``; ``dtype`` None covers every dtype,
``mode`` is ``"eager"`` or ``"jit"``. A listed case that passes fails ("unexpected success,
remove from table"). A dtype or shape mismatch is never excused by this table.

Regenerate with ``python tests/ops/opinfo_report.py --write-table`` after lowering ops.
"""

EXPECTED_FAILURES: dict[tuple[str, str | None, str | None, str], str] = {}
