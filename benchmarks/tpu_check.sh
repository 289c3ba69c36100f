#!/usr/bin/env bash
# The TPU checks in one go, within 9 minutes, logs and JSON into DIR:
#
#     bash benchmarks/tpu_check.sh DIR        # on a TPU VM, from anywhere
#
# 1. Python: $PYTHON if set; else .venv/bin/python when its JAX sees a TPU (`uv sync --extra
#    tpu`-style install: docs/tpu.md); else the machine's python3 (PYTHONPATH as it is: a TPU
#    image with the workspace's sources on it). Fails at once when JAX sees no TPU.
# 2. The README's first command (examples/quickstart.py) and the examples that run on one
#    device (TPU_EXAMPLES: names, to run fewer), each in its own process (one process at a time holds the chip): DIR/examples.log.
# 3. pytest tests/tpu in ONE process (no pytest-xdist): DIR/tpu_tests.log and DIR/tpu_tests.xml (each
#    comparison's largest difference is a property of its test case).
# 4. benchmarks/tpu.py with what is left of the budget: DIR/tpu.json, DIR/tpu_bench.log.
#    TPU_BENCH_S (default 150) is the time kept for it; TPU_BENCH_ARGS adds arguments (e.g. "--models gpt2 --variants torchax,jax,jit").
# Exit status 0 only if every example and test passed and the benchmark reported no error.
# TPU_CHECK_BUDGET_S (default 540) bounds the whole script.

set -uo pipefail
[ $# -eq 1 ] || { echo "usage: $0 DIR" >&2; exit 2; }
mkdir -p "$1" && DIR=$(cd "$1" && pwd)
cd "$(dirname "$0")/.."
START=$(date +%s)
BUDGET=${TPU_CHECK_BUDGET_S:-540}
export PYTHONUNBUFFERED=1
elapsed() { echo $(( $(date +%s) - START )); }
left() { echo $(( BUDGET - $(elapsed) )); }
say() { echo "[tpu_check $(elapsed)s] $*" | tee -a "$DIR/summary.log"; }

# -- 1. Python with a TPU ---------------------------------------------------------------------
sees_tpu() { "$1" -c "import jax; assert jax.devices()[0].platform == 'tpu'" 2>/dev/null; }
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x .venv/bin/python ] && sees_tpu .venv/bin/python; then PY=.venv/bin/python
else PY=python3
fi
if ! "$PY" -c "import jax, torch, torchlax; d = jax.devices(); print(f'torch {torch.__version__}, jax {jax.__version__}, devices {d}'); assert d[0].platform == 'tpu', 'JAX sees no TPU'" 2>&1 | tee -a "$DIR/summary.log"; then
    say "FAILED: $PY cannot import torch, jax and torchlax with JAX on a TPU (docs/tpu.md)"
    exit 3
fi
say "python: $PY"

# -- 2. the examples ----------------------------------------------------------------------------
EXAMPLES=0
for example in ${TPU_EXAMPLES:-quickstart compile train jax_training export_and_serve plugin}; do
    say "examples/$example.py"
    timeout 120 "$PY" "examples/$example.py" >>"$DIR/examples.log" 2>&1 \
        || { EXAMPLES=1; say "examples/$example.py FAILED (see examples.log)"; }
done

# -- 3. tests/tpu -----------------------------------------------------------------------------
TEST_BUDGET=$(( $(left) - ${TPU_BENCH_S:-150} ))  # the rest is the benchmark's
say "pytest tests/tpu (budget ${TEST_BUDGET}s)"
# pyproject's addopts ask for pytest-xdist (-n auto): replaced, since one process holds the chip
timeout "$TEST_BUDGET" "$PY" -m pytest -o addopts="" -p no:cacheprovider --strict-markers -v \
    -o junit_family=legacy -rfEs --timeout=300 --junitxml="$DIR/tpu_tests.xml" \
    tests/tpu/test_platform_tpu.py $(ls tests/tpu/test_*.py | grep -v test_platform_tpu.py) \
    2>&1 | tee "$DIR/tpu_tests.log"
TESTS=${PIPESTATUS[0]}
say "pytest exit status $TESTS"

# -- 4. the benchmark ---------------------------------------------------------------------------
BENCH_LEFT=$(( $(left) - 10 ))
if [ "$BENCH_LEFT" -gt 60 ]; then
    say "benchmarks/tpu.py (budget ${BENCH_LEFT}s)"
    # shellcheck disable=SC2086  # TPU_BENCH_ARGS is a list of words
    timeout "$BENCH_LEFT" "$PY" benchmarks/tpu.py --out "$DIR/tpu.json" \
        --budget-s $(( BENCH_LEFT - 15 )) ${TPU_BENCH_ARGS:-} 2>&1 | tee "$DIR/tpu_bench.log"
    BENCH=${PIPESTATUS[0]}
else
    say "no time left for benchmarks/tpu.py"
    BENCH=124
fi
say "examples $EXAMPLES, tests $TESTS, benchmark $BENCH (124: out of time)"
[ "$EXAMPLES" -eq 0 ] && [ "$TESTS" -eq 0 ] && [ "$BENCH" -eq 0 ]
