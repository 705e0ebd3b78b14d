#!/usr/bin/env bash
# The GPU check, in one device call: every `-m gpu` test, then the headline benchmark
# (`nv bench --random-weights --shape qwen3-0.6b`, BENCHMARK.md's workload).
# Runs from PYTHONPATH (every package's src dir): the GPU machine has no hatch and no network.
# Logs (and bench.json) go to $OUT when set, else ./out. Extra arguments go to nv bench.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PYTHON=${PYTHON:-python3}
SRC_DIRS=$(ls -d "$ROOT"/packages/*/src | tr '\n' ':')
export PYTHONPATH="${SRC_DIRS}${PYTHONPATH:-}"
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/nv-cache}   # the random checkpoint stays out of $OUT
LOG_DIR=${OUT:-$ROOT/out}
mkdir -p "$LOG_DIR"

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
  "$PYTHON" -c 'import sys, torch, triton, transformers; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)'
} 2>&1 | tee "$LOG_DIR/env.log"

echo "== GPU tests =="
"$PYTHON" -m pytest -m gpu -q -rs packages tests 2>&1 | tee "$LOG_DIR/gpu_tests.log"
tests_rc=${PIPESTATUS[0]}

echo "== nv bench =="
"$PYTHON" -m nv_engine.entrypoints.cli --log-level INFO bench --random-weights --shape qwen3-0.6b \
  --json "$LOG_DIR/bench.json" "$@" 2>&1 | tee "$LOG_DIR/bench.log"
bench_rc=${PIPESTATUS[0]}

echo "gpu tests exit $tests_rc, bench exit $bench_rc"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
