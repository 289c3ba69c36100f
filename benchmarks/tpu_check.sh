#!/usr/bin/env bash
# The TPU checks in one go, within 9 minutes, logs and JSON into DIR as they come:
#
#     bash benchmarks/tpu_check.sh DIR        # on a TPU VM, from anywhere
#     TPU_CHECK_ALLOW_CPU=1 bash benchmarks/tpu_check.sh DIR   # rehearsal where there is no TPU
#
# On the team's TPU machine (../shared/tpu/README.md; `TPU_EXTRA_WHEELS="torchax==0.0.13"` when
# preparing), a fresh machine spending ~2 min on its setup first:
#     source .tpu/device-setup.sh && TPU_CHECK_BUDGET_S=420 with_torchlax bash benchmarks/tpu_check.sh "$OUT"
#
# 1. Python: $PYTHON if set; else .venv/bin/python when its JAX sees a TPU (`uv sync --extra
#    tpu`-style install: docs/tpu.md); else the machine's python3 (PYTHONPATH as it is: a TPU
#    image with the workspace's sources on it). Fails at once when JAX sees no TPU, unless
#    TPU_CHECK_ALLOW_CPU=1: then every step runs on the CPU, the TPU tests skip with their
#    reasons and the benchmark runs its --smoke shapes (a check of the script, not of a TPU).
# 2. pytest tests/tpu in ONE process (no pytest-xdist; attention, precision, models, platform):
#    DIR/tpu_tests.log (as it runs) and DIR/tpu_tests.xml (each comparison's largest difference
#    is a property of its test case).
# 3. benchmarks/tpu.py, GPT-2 rows by default (TPU_BENCH_ARGS replaces "--models gpt2 --variants
#    jit,torchax,jax"; each variant in its own process, at most TPU_VARIANT_S seconds, default
#    300: a GPT-2 step took 100-130 s to compile on the team's v5e, so 9 minutes hold the tests
#    and the first row; the others in runs of their own): DIR/tpu.json (rewritten after every
#    row), DIR/tpu_bench.log. TPU_BENCH_S (default 330) is the time kept for it.
# 4. The examples that run on one device, with what is left (TPU_EXAMPLES: names; quickstart
#    and compile already passed on the chip), each in its own process: DIR/examples.log.
# DIR/summary.log says what ran, for how long and how it ended.
# Exit status 0 only if every test and example passed and the benchmark reported no error.
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
elif [ "${TPU_CHECK_ALLOW_CPU:-0}" = 1 ] && [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=python3
fi
SMOKE=""
if ! "$PY" -c "import jax, torch, torchlax; d = jax.devices(); print(f'torch {torch.__version__}, jax {jax.__version__}, devices {d}'); assert d[0].platform == 'tpu', 'JAX sees no TPU'" 2>&1 | tee -a "$DIR/summary.log"; then
    if [ "${TPU_CHECK_ALLOW_CPU:-0}" != 1 ] || ! "$PY" -c "import jax, torch, torchlax"; then
        say "FAILED: $PY cannot import torch, jax and torchlax with JAX on a TPU (docs/tpu.md)"
        exit 3
    fi
    say "no TPU (TPU_CHECK_ALLOW_CPU=1): a rehearsal on the CPU; the TPU tests skip, the benchmark runs --smoke"
    SMOKE="--smoke"
fi
say "python: $PY"
BENCH_S=${TPU_BENCH_S:-330}

# -- 2. tests/tpu -----------------------------------------------------------------------------
TEST_BUDGET=$(( $(left) - BENCH_S ))  # the rest is the benchmark's and the examples'
say "pytest tests/tpu (budget ${TEST_BUDGET}s)"
# pyproject's addopts ask for pytest-xdist (-n auto): replaced, since one process holds the chip.
# test_without_tpu.py is the CPU's (it runs the benchmark's smoke mode): not needed here.
timeout "$TEST_BUDGET" "$PY" -m pytest -o addopts="" -p no:cacheprovider --strict-markers -v \
    -o junit_family=legacy -rfEs --timeout=300 --junitxml="$DIR/tpu_tests.xml" \
    tests/tpu/test_platform_tpu.py tests/tpu/test_attention_tpu.py \
    $(ls tests/tpu/test_*.py | grep -v -e test_platform_tpu.py -e test_attention_tpu.py -e test_without_tpu.py) \
    2>&1 | tee "$DIR/tpu_tests.log"
TESTS=${PIPESTATUS[0]}
say "pytest exit status $TESTS (124: out of time; the log shows how far it went)"

# -- 3. the benchmark: GPT-2 rows ---------------------------------------------------------------
BENCH_LEFT=$(( $(left) - 10 ))
if [ "$BENCH_LEFT" -gt 60 ]; then
    say "benchmarks/tpu.py (budget ${BENCH_LEFT}s)"
    # shellcheck disable=SC2086  # TPU_BENCH_ARGS is a list of words
    timeout "$BENCH_LEFT" "$PY" benchmarks/tpu.py --out "$DIR/tpu.json" $SMOKE \
        --budget-s $(( BENCH_LEFT - 15 )) --variant-s "${TPU_VARIANT_S:-300}" \
        ${TPU_BENCH_ARGS:---models gpt2 --variants jit,torchax,jax} 2>&1 | tee "$DIR/tpu_bench.log"
    BENCH=${PIPESTATUS[0]}
else
    say "no time left for benchmarks/tpu.py"
    BENCH=124
fi
say "benchmark exit status $BENCH"

# -- 4. the examples ------------------------------------------------------------------------------
EXAMPLES=0
for example in ${TPU_EXAMPLES:-train jax_training export_and_serve plugin}; do
    if [ "$(left)" -lt 30 ]; then
        say "examples/$example.py: no time left"
        EXAMPLES=124
        continue
    fi
    say "examples/$example.py"
    timeout $(( $(left) < 120 ? $(left) : 120 )) "$PY" "examples/$example.py" >>"$DIR/examples.log" 2>&1 \
        || { EXAMPLES=1; say "examples/$example.py FAILED (see examples.log)"; }
done
say "tests $TESTS, benchmark $BENCH, examples $EXAMPLES (124: out of time)"
[ "$EXAMPLES" -eq 0 ] && [ "$TESTS" -eq 0 ] && [ "$BENCH" -eq 0 ]
