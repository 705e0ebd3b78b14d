#!/usr/bin/env bash
# One device call for the performance issue's evidence: selected GPU tests (kernels, layers, model
# vs HF, engine), the headline benchmark at block sizes 16 and 64, the decode-step profile and the
# throughput sweeps (PNG), and the server load test (256 requests at concurrency 64).
# Needs the serve wheels carried in .whl/serve (see scripts/load_test.py). Logs go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
LOG=${OUT:-$ROOT/out}
mkdir -p "$LOG"
export PYTHONPATH="$(ls -d "$ROOT"/packages/*/src | tr '\n' ':')$ROOT/tests:${PYTHONPATH:-}"
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/nv-cache} PYTHONUNBUFFERED=1
step() { echo "== $1 ($(date +%T))"; }
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  step tests
  timeout 240 python3 -m pytest -m gpu -q -rs -x ${GPU_TESTS:-packages/nv-kernels packages/nv-layers tests/test_model_vs_hf.py tests/test_engine_hf.py} 2>&1 | tail -25 | tee "$LOG/tests.log"
fi
step bench
for bs in ${BLOCK_SIZES:-16 64}; do
  timeout 150 python3 -m nv_engine.cli bench --random-weights --shape qwen3-0.6b --block-size $bs \
    --json "$LOG/bench_bs$bs.json" 2>&1 | grep -E "Throughput|Wall|Floor|KV cache" | tee "$LOG/bench_bs$bs.log"
done
CKPT=$XDG_CACHE_HOME/nv/bench-random-qwen3-0.6b-bf16
if [ "${SKIP_SWEEP:-0}" != 1 ]; then
  step sweep
  timeout 200 python3 scripts/perf_sweep.py --model "$CKPT" --out "$LOG" --graph-profile 2>&1 | grep -v -i warn | tail -40
fi
if [ "${SKIP_LOAD:-0}" != 1 ]; then
  step load
  python3 -m pip install -q --no-index --find-links .whl/serve fastapi uvicorn prometheus-client 2>&1 | tail -2
  timeout 240 python3 scripts/load_test.py --random-weights --shape qwen3-0.6b --checkpoint-dir /tmp/nv-load-ckpt --num-requests 256 --concurrency 64 \
    --result-json "$LOG/load.json" -- --dtype bfloat16 --max-model-len 4096 2>&1 | tail -30 | tee "$LOG/load.log"
fi
step done
