#!/usr/bin/env bash
# One device call for the performance issue's evidence, most important first: the headline benchmark
# (falls back to NV_FUSED_OPS=off if the fused path fails), GPU tests of the newest kernels, the
# decode-step profile and throughput sweeps (PNG), the server load test, the block-size-64 benchmark.
# Needs the serve wheels carried in .whl/serve (see scripts/load_test.py). Logs go to $OUT.
source "$(dirname "$0")/gpu_env.sh"
step() { echo "== $1 ($(date +%T))"; }
bench() {  # bench NAME ARGS...
  local name=$1; shift
  timeout 150 python3 -m nv_engine.entrypoints.cli bench --random-weights --shape qwen3-0.6b --json "$LOG/bench_$name.json" "$@" \
    > "$LOG/bench_$name.log" 2>&1
  local rc=$?
  grep -E "Throughput|Wall|Floor|KV cache|Error|error" "$LOG/bench_$name.log" | tail -8
  return $rc
}
step bench; bench bs16 || { step "bench fused off"; NV_FUSED_OPS=off bench bs16_unfused; }
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  step tests
  timeout 200 python3 -m pytest -m gpu -q -rs -x ${GPU_TESTS:-packages/nv-kernels/tests/test_fused_norm.py packages/nv-kernels/tests/test_fused_act.py packages/nv-kernels/tests/test_fused_rope.py packages/nv-layers/tests/test_sampler_gpu.py tests/test_model_vs_hf.py tests/test_engine_hf.py} 2>&1 | tail -25 | tee "$LOG/tests.log"
fi
CKPT=$XDG_CACHE_HOME/nv/bench-random-qwen3-0.6b-bf16
if [ "${SKIP_SWEEP:-0}" != 1 ]; then
  step sweep
  timeout 200 python3 scripts/perf_sweep.py --model "$CKPT" --out "$LOG" --graph-profile 2>&1 | grep -v -i warn | tail -45
fi
if [ "${SKIP_LOAD:-0}" != 1 ]; then
  step load
  python3 -m pip install -q --no-index --find-links .whl/serve fastapi uvicorn prometheus-client 2>&1 | tail -2
  timeout 200 python3 scripts/load_test.py --random-weights --shape qwen3-0.6b --checkpoint-dir /tmp/nv-load-ckpt \
    --num-requests 256 --concurrency 64 --result-json "$LOG/load.json" -- --dtype bfloat16 --max-model-len 4096 \
    2>&1 | tail -30 | tee "$LOG/load.log"
fi
step "bench block 64"; bench bs64 --block-size 64
step done
