#!/usr/bin/env bash
# The GPU check: every `-m gpu` test, then the headline benchmark (`nv bench --random-weights --shape
# qwen3-0.6b`, the workload BENCHMARKS.md describes). Extra arguments go to nv bench.
#   NV_RESULTS_DIR=DIR bash scripts/dev/gpu_check.sh [nv bench args]
# Writes env.log, gpu_tests.log, bench.log and bench.json under $NV_RESULTS_DIR (default ./bench-results).
source "$(dirname "$0")/gpu_env.sh"
record_environment

echo "== GPU tests =="
"$PYTHON" -m pytest -m gpu -q -rs packages tests 2>&1 | tee "$RESULTS/gpu_tests.log"
tests_rc=${PIPESTATUS[0]}

echo "== nv bench =="
"$PYTHON" -m nv_engine.entrypoints.cli --log-level INFO bench --random-weights --shape qwen3-0.6b \
  --json "$RESULTS/bench.json" "$@" 2>&1 | tee "$RESULTS/bench.log"
bench_rc=${PIPESTATUS[0]}

echo "gpu tests exit $tests_rc, bench exit $bench_rc"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
