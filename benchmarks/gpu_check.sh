#!/usr/bin/env bash
# The GPU checks in one go, within 8 minutes: tests/gpu, then benchmarks/gpu.py.
#
#     bash benchmarks/gpu_check.sh          # from anywhere; runs in the repository root
#
# 1. Python: uses .venv/bin/python when it already has JAX's CUDA plugin (nothing is
#    installed). Otherwise installs the `cuda` dependency group (torchlax[cuda]) from uv.lock
#    with `uv sync --locked --group cuda`: first from uv's cache alone (--offline), then from
#    the package index, which needs network access. Says which it did.
# 2. Checks that PyTorch and JAX both see the GPU (fails here rather than skip every test).
# 3. pytest tests/gpu (marker `gpu`), then benchmarks/gpu.py with what is left of the budget
#    (results in benchmarks/results/gpu.json), then a summary. Exit status 0 only if the
#    environment is ready, every test passed and the benchmark ran without a failure or copy.
#
# GPU_CHECK_BUDGET_S (default 470) bounds the whole script. If $OUT is set (a results folder),
# the logs and gpu.json are copied there too.

set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET_S:-470}
LOGS=benchmarks/results
mkdir -p "$LOGS"
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # torch and XLA share the GPU in one process
export PYTHONUNBUFFERED=1

elapsed() { echo $(( $(date +%s) - START )); }
left() { echo $(( BUDGET - $(elapsed) )); }
say() { echo "[gpu_check $(elapsed)s] $*"; }

has_plugin() {
    [ -x .venv/bin/python ] && .venv/bin/python - <<'EOF' 2>/dev/null
import importlib.metadata as m, importlib.util as u
m.version("jax-cuda13-plugin"), m.version("jax-cuda13-pjrt")
assert u.find_spec("torchlax") and u.find_spec("pytest")
EOF
}

# -- 1. the environment ----------------------------------------------------------------------
ENV_STATUS="ready"
if has_plugin; then
    say "using the existing .venv: it has JAX's CUDA plugin (installing nothing)"
elif command -v uv >/dev/null 2>&1; then
    say ".venv lacks JAX's CUDA plugin: uv sync --locked --group cuda, from uv's cache only"
    if timeout 150 uv sync --locked --group cuda --offline; then
        say "installed the cuda group from uv's cache"
    else
        say "not all in uv's cache: uv sync --locked --group cuda from the package index"
        if timeout $(( $(left) > 240 ? 200 : 120 )) uv sync --locked --group cuda; then
            say "installed the cuda group from the package index"
        else
            ENV_STATUS="uv sync --group cuda failed (no network or cache?)"
        fi
    fi
    has_plugin || ENV_STATUS="no JAX CUDA plugin in .venv after uv sync ($ENV_STATUS)"
else
    ENV_STATUS="no .venv with JAX's CUDA plugin, and no uv to install it"
fi
if [ "$ENV_STATUS" != "ready" ]; then
    say "FAILED: $ENV_STATUS. Sync on a machine with network access: uv sync --group cuda"
    exit 3
fi
PY=.venv/bin/python

# -- 2. does everyone see the GPU? -----------------------------------------------------------
command -v nvidia-smi >/dev/null 2>&1 \
    && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if ! timeout 120 "$PY" - <<'EOF'
import sys
import jax, torch
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), jax {jax.__version__}")
if not torch.cuda.is_available():
    sys.exit("PyTorch sees no CUDA device")
try:
    gpus = jax.devices("gpu")
except RuntimeError as exc:
    sys.exit(f"JAX has no GPU backend: {exc}")
print(f"torch: {torch.cuda.get_device_name(0)}; JAX: {gpus}")
EOF
then
    say "FAILED: the GPU is not usable from both PyTorch and JAX (see above)"
    exit 4
fi

# -- 3. tests, then benchmarks ---------------------------------------------------------------
say "pytest tests/gpu"
TEST_BUDGET=$(( $(left) - 200 < 260 ? $(left) - 200 : 260 ))  # keep ~200 s for benchmarks
timeout "$TEST_BUDGET" "$PY" -m pytest -n 0 -q -rfEs --timeout=240 tests/gpu \
    2>&1 | tee "$LOGS/gpu_tests.log"
TESTS=${PIPESTATUS[0]}
say "pytest exit status $TESTS"

BENCH_LEFT=$(( $(left) - 15 ))
if [ "$BENCH_LEFT" -gt 60 ]; then
    say "benchmarks/gpu.py (budget ${BENCH_LEFT}s)"
    rm -f "$LOGS/gpu.json"  # what is there afterwards is this run's
    timeout "$BENCH_LEFT" "$PY" benchmarks/gpu.py --budget-s $(( BENCH_LEFT - 60 )) \
        2>&1 | tee "$LOGS/gpu_bench.log"
    BENCH=${PIPESTATUS[0]}
else
    say "no time left for benchmarks/gpu.py"
    BENCH=124
fi

# -- summary ---------------------------------------------------------------------------------
echo
echo "==================== gpu_check summary ($(elapsed)s) ===================="
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name --format=csv,noheader
echo "tests/gpu:          exit $TESTS  ($(grep -E '[0-9]+ (passed|failed|error)' "$LOGS/gpu_tests.log" | tail -1))"
echo "benchmarks/gpu.py:  exit $BENCH  (124 = ran out of time)"
if [ -f "$LOGS/gpu.json" ]; then
    [ "$BENCH" -eq 124 ] && PARTIAL=" (partial: the rows measured before the time ran out)"
    echo "results:            $LOGS/gpu.json${PARTIAL:-}"
fi
if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
    cp "$LOGS"/gpu_tests.log "$LOGS"/gpu_bench.log "$LOGS"/gpu.json "$OUT"/ 2>/dev/null
fi
[ "$TESTS" -eq 0 ] && [ "$BENCH" -eq 0 ]
