#!/usr/bin/env bash
# How long `nv serve` takes to start: seconds from launch until /health answers 200 and until a first completion
# (16 tokens) has answered, for the random Qwen3-0.6B-shaped bf16 checkpoint (`--max-model-len 4096`).
#   bash benchmarks/serve_start.sh [WARM_RUNS]      (default 2)
# The first start uses an empty Triton cache (a fresh TRITON_CACHE_DIR: every kernel compiles, as on a new
# install); the next WARM_RUNS reuse that cache. Each line also gives the engine core's share: from its spawn (which
# comes before the frontend reads the model's config) to ready, the forkserver's preload included; the frontend's
# imports before the spawn are the rest. The engine core's INFO lines (compiles ahead,
# graph captures, warm-up, build time) are in $RESULTS/start_<run>.log, one line per start in
# $RESULTS/serve_start.log.
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/dev/gpu_env.sh"
record_environment
WARM_RUNS=${1:-2}
MODEL=$("$PYTHON" - <<'PY'
from nv_engine.model_loader.random_model import nv_cache_dir, write_random_checkpoint
model = nv_cache_dir() / "bench-random-qwen3-0.6b-bf16"
if not (model / "model.safetensors").exists():
    write_random_checkpoint(str(model), "qwen3-0.6b", dtype="bfloat16")
print(model)
PY
)
export TRITON_CACHE_DIR=$(mktemp -d)
: > "$RESULTS/serve_start.log"
for run in cold $(seq -f "warm%g" 1 "$WARM_RUNS"); do
  start=$(date +%s.%N)
  "$PYTHON" -m nv_engine.entrypoints.cli serve "$MODEL" --port 8000 --max-model-len 4096 > "$RESULTS/start_$run.log" 2>&1 &
  pid=$!
  until curl -sf http://127.0.0.1:8000/health >/dev/null; do
    kill -0 $pid 2>/dev/null || { echo "nv serve exited:"; tail -20 "$RESULTS/start_$run.log"; exit 1; }
    sleep 0.05
  done
  health=$(date +%s.%N)
  curl -sf http://127.0.0.1:8000/v1/completions -H 'content-type: application/json' \
    -d "{\"model\": \"$MODEL\", \"prompt\": [1, 2, 3], \"max_tokens\": 16}" >/dev/null
  answered=$(date +%s.%N)
  # the core's share: "engine core ready N s after its spawn" (the frontend's share is the rest)
  core=$(grep -o "engine core ready [0-9.]* s after its spawn" "$RESULTS/start_$run.log" | grep -o "[0-9.]* s" | head -1)
  echo "$run: /health after $("$PYTHON" -c "print(round($health - $start, 1))") s," \
    "first answer after $("$PYTHON" -c "print(round($answered - $start, 1))") s (core ready ${core:-?} after its spawn)" \
    | tee -a "$RESULTS/serve_start.log"
  kill -INT $pid; wait $pid
done
rm -rf "$TRITON_CACHE_DIR"
