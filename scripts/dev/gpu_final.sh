#!/usr/bin/env bash
# The performance figures of BENCHMARKS.md, most important first: the headline benchmark (falls back to
# NV_FUSED_OPS=off if the fused path fails), GPU tests of the newest kernels, the decode-step profile and
# throughput sweeps (PNG), the server load test, the block-size-64 benchmark.
#   NV_RESULTS_DIR=DIR bash scripts/dev/gpu_final.sh
# SKIP_TESTS=1, SKIP_SWEEP=1, SKIP_LOAD=1 leave a part out; GPU_TESTS overrides the test list. The load
# test needs the server's dependencies (`pip install fastapi uvicorn prometheus-client`, or nv-engine[serve]).
source "$(dirname "$0")/gpu_env.sh"
record_environment
step() { echo "== $1 ($(date +%T))"; }
bench() {  # bench NAME ARGS...
  local name=$1; shift
  timeout 150 "$PYTHON" -m nv_engine.entrypoints.cli bench --random-weights --shape qwen3-0.6b \
    --json "$RESULTS/bench_$name.json" "$@" > "$RESULTS/bench_$name.log" 2>&1
  local rc=$?
  grep -E "Throughput|Wall|Floor|KV cache|Error|error" "$RESULTS/bench_$name.log" | tail -8
  return $rc
}
step bench; bench bs16 || { step "bench fused off"; NV_FUSED_OPS=off bench bs16_unfused; }
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  step tests
  DEFAULT_TESTS="packages/nv-kernels/tests/test_fused_norm.py packages/nv-kernels/tests/test_fused_act.py
    packages/nv-kernels/tests/test_fused_rope.py packages/nv-layers/tests/test_sampler_gpu.py
    tests/test_model_vs_hf.py tests/test_engine_hf.py"
  # shellcheck disable=SC2086  # the list splits into paths
  timeout 200 "$PYTHON" -m pytest -m gpu -q -rs -x ${GPU_TESTS:-$DEFAULT_TESTS} 2>&1 | tail -25 | tee "$RESULTS/tests.log"
fi
CKPT=$XDG_CACHE_HOME/nv/bench-random-qwen3-0.6b-bf16
if [ "${SKIP_SWEEP:-0}" != 1 ]; then
  step sweep
  timeout 200 "$PYTHON" benchmarks/perf_sweep.py --model "$CKPT" --out "$RESULTS" --graph-profile 2>&1 | grep -v -i warn | tail -45
fi
if [ "${SKIP_LOAD:-0}" != 1 ]; then
  step load
  if "$PYTHON" -c "import fastapi, uvicorn, prometheus_client" 2>/dev/null; then
    timeout 200 "$PYTHON" benchmarks/load_test.py --random-weights --shape qwen3-0.6b --checkpoint-dir /tmp/nv-load-ckpt \
      --num-requests 256 --concurrency 64 --result-json "$RESULTS/load.json" -- --dtype bfloat16 --max-model-len 4096 \
      2>&1 | tail -30 | tee "$RESULTS/load.log"
  else
    echo "load test skipped: pip install fastapi uvicorn prometheus-client (nv-engine[serve]) first"
  fi
fi
step "bench block 64"; bench bs64 --block-size 64
step done
