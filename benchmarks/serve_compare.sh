#!/usr/bin/env bash
# `nv serve` against a peer OpenAI-compatible server (vLLM's, for instance) on one GPU, back to back, with one
# client (`nv bench serve`) and one request set (the headline's 256 token-id requests), then the offline
# headline of this tree (the 256-stream figure is quoted as a share of its second run).
#   bash benchmarks/serve_compare.sh [CONCURRENCY ...]          (default: 16 64 256)
# PEER_SERVER_CMD, when set, is a shell command that starts the peer on port 8100 serving "$MODEL" (the
# random Qwen3-0.6B-shaped bf16 checkpoint this script writes), e.g. vLLM's
#   PEER_SERVER_CMD='python3 -m vllm.entrypoints.openai.api_server --model "$MODEL" --port 8100 --max-model-len 4096'
# Each concurrency runs twice per server: "cold" is the first timed run after the server starts, "warm" the
# second. Results: $NV_RESULTS_DIR (default ./bench-results): bench_<server>_c<N>_<run>.json, serve_*.log,
# serve_compare.log (one line per run).
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/dev/gpu_env.sh"
record_environment
CONCURRENCIES=${*:-16 64 256}
export MODEL=$("$PYTHON" - <<'PY'
from pathlib import Path
from nv_engine.model_loader.random_model import nv_cache_dir, write_random_checkpoint
model = nv_cache_dir() / "bench-random-qwen3-0.6b-bf16"
if not (model / "model.safetensors").exists():
    write_random_checkpoint(str(model), "qwen3-0.6b", dtype="bfloat16")
print(model)
PY
)
wait_ready() {   # port pid log: seconds until /health answers 200 (fails if the server died)
  local start=$SECONDS
  until curl -sf "http://127.0.0.1:$1/health" >/dev/null; do
    kill -0 "$2" 2>/dev/null || { echo "server exited:"; tail -20 "$3"; return 1; }
    sleep 1
  done
  echo $((SECONDS - start))
}
bench() {   # server port
  for c in $CONCURRENCIES; do
    for run in cold warm; do
      "$PYTHON" -m nv_engine.entrypoints.cli bench serve --port "$2" --dataset-name headline --num-prompts 256 \
        --max-concurrency "$c" --result-file "$RESULTS/bench_$1_c${c}_$run.json" > "$RESULTS/bench_$1_c${c}_$run.log" 2>&1
      "$PYTHON" - "$1" "$c" "$run" "$RESULTS/bench_$1_c${c}_$run.json" <<'PY' | tee -a "$RESULTS/serve_compare.log"
import json, sys
server, c, run, path = sys.argv[1:]
try:
    r = json.load(open(path))
except OSError:
    print(f"{server} c={c} {run}: no result (see the .log beside it)"); sys.exit()
print(f"{server} c={c} {run}: {r.get('output_throughput', 0):,.0f} out tok/s, TTFT p50/p90/p99 "
      f"{r.get('p50_ttft_ms', 0):,.0f}/{r.get('p90_ttft_ms', 0):,.0f}/{r.get('p99_ttft_ms', 0):,.0f} ms, "
      f"TPOT p50 {r.get('p50_tpot_ms', 0):.2f} ms, ITL p50 {r.get('p50_itl_ms', 0):.2f} ms, failed {r.get('failed', 0)}")
PY
    done
  done
}
: > "$RESULTS/serve_compare.log"
"$PYTHON" -m nv_engine.entrypoints.cli serve "$MODEL" --port 8000 --max-model-len 4096 > "$RESULTS/serve_nv.log" 2>&1 &
NV_PID=$!
echo "nv serve ready after $(wait_ready 8000 $NV_PID "$RESULTS/serve_nv.log") s" | tee -a "$RESULTS/serve_compare.log"
bench nv 8000
kill -INT $NV_PID; wait $NV_PID
if [ -n "${PEER_SERVER_CMD:-}" ]; then
  bash -c "$PEER_SERVER_CMD" > "$RESULTS/serve_peer.log" 2>&1 &
  PEER_PID=$!
  echo "peer ready after $(wait_ready 8100 $PEER_PID "$RESULTS/serve_peer.log") s" | tee -a "$RESULTS/serve_compare.log"
  bench peer 8100
  kill -INT $PEER_PID; wait $PEER_PID
fi
"$PYTHON" "$ROOT/benchmarks/headline_runs.py" offline 2>&1 | grep RESULT | tee -a "$RESULTS/serve_compare.log"
