#!/usr/bin/env bash
# The GPU checks in one go, within 8 minutes: tests/gpu, then benchmarks/gpu.py.
#
#     bash benchmarks/gpu_check.sh          # from anywhere; runs in the repository root
#
# 1. Python, in this order (it says which it took):
#    a. .venv/bin/python, when it already has JAX's CUDA plugin: nothing is installed;
#    b. `uv sync --locked --group cuda` (torchlax[cuda] at uv.lock's versions): from uv's cache
#       alone (--offline), then from the package index if it can be reached;
#    c. the machine's own python3, when it has a CUDA torch, JAX with a CUDA plugin, and the
#       test dependencies (as GPU images often do): the workspace's packages are put on
#       PYTHONPATH, with generated metadata for their entry points (nothing is installed).
#       Its torch/jax are not uv.lock's versions: the script prints both and warns.
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

venv_ready() {
    [ -x .venv/bin/python ] && .venv/bin/python - <<'EOF' 2>/dev/null
import importlib.metadata as m, importlib.util as u
m.version("jax-cuda13-plugin"), m.version("jax-cuda13-pjrt")
assert u.find_spec("torchlax") and u.find_spec("pytest")
EOF
}

system_python_ready() {
    command -v python3 >/dev/null 2>&1 && python3 - <<'EOF' 2>/dev/null
import importlib.metadata as m, importlib.util as u, sys
import torch
assert torch.version.cuda and sys.version_info >= (3, 11)  # tomllib, below
assert any((d.metadata["Name"] or "").lower().startswith(("jax-cuda12-plugin", "jax-cuda13-plugin"))
           for d in m.distributions())
for module in ("jax", "pluggy", "numpy", "flatbuffers", "transformers", "torchvision", "pytest",
               "pytest_timeout", "xdist"):
    assert u.find_spec(module), module
EOF
}

network() {
    timeout 8 python3 -c "import socket; socket.create_connection(('pypi.org', 443), 5)" \
        >/dev/null 2>&1
}

# -- 1. the environment ----------------------------------------------------------------------
PY=""
if venv_ready; then
    say "using the existing .venv: it has JAX's CUDA plugin (installing nothing)"
    PY=.venv/bin/python
elif command -v uv >/dev/null 2>&1; then
    say ".venv lacks JAX's CUDA plugin: uv sync --locked --group cuda, from uv's cache only"
    if timeout 150 uv sync --locked --group cuda --offline && venv_ready; then
        say "installed the cuda group from uv's cache"
        PY=.venv/bin/python
    elif network; then
        say "not all in uv's cache: uv sync --locked --group cuda from the package index"
        if UV_HTTP_TIMEOUT=30 timeout 240 uv sync --locked --group cuda && venv_ready; then
            say "installed the cuda group from the package index"
            PY=.venv/bin/python
        fi
    else
        say "the package index cannot be reached: not installing"
    fi
else
    say "no .venv with JAX's CUDA plugin, and no uv to make one"
fi
if [ -z "$PY" ] && system_python_ready; then
    SITE=$(mktemp -d /tmp/torchlax-site.XXXXXX)
    python3 - "$SITE" <<'EOF'
# Metadata for each workspace package, so that its entry points (the torchlax plugins, the
# torch.compile backend) are found when its sources are imported from PYTHONPATH.
import pathlib, sys, tomllib
site = pathlib.Path(sys.argv[1])
for pyproject in sorted(pathlib.Path("packages").glob("*/pyproject.toml")):
    project = tomllib.loads(pyproject.read_text())["project"]
    name, version = project["name"], project["version"]
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in points.items()) + "\n"
        for group, points in project.get("entry-points", {}).items()))
EOF
    SOURCES=$(printf '%s:' "$PWD"/packages/*/src)
    export PYTHONPATH="$SITE:$SOURCES${PYTHONPATH:-}"
    PY=python3
    say "using the machine's python3 ($(command -v python3)) with the workspace on PYTHONPATH"
    say "WARNING: $(python3 -c 'import torch, jax; print(f"torch {torch.__version__}, jax {jax.__version__}")'), not uv.lock's torch 2.14.1 / jax 0.10.2: a failure may come from that difference"
fi
if [ -z "$PY" ]; then
    say "FAILED: no Python with torchlax, a CUDA torch and JAX's CUDA plugin. On a machine with network access run: uv sync --group cuda"
    exit 3
fi

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
