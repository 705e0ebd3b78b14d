#!/usr/bin/env bash
# How smoothly `nv serve` streams: TTFT / TPOT / ITL percentiles of vLLM's random workload (512 tokens in,
# 256 out, 1,024 prompts, EOS ignored) at 256 streams (cold, then warm) and at 64 streams, on the random
# Qwen3-0.6B-shaped bf16 checkpoint (with a tokenizer, so the server detokenizes as it would for a real model).
#   bash benchmarks/serve_streaming.sh [OLD_COMMIT|OLD_TREE_DIR ...]
# Each older tree is served and measured first, then this tree, on the same GPU with the same client.
# CLIENT=vllm measures with vLLM's own client (`vllm bench serve`; vLLM must be importable), otherwise with
# `nv bench serve`. SERVE_ARGS adds `nv serve` arguments to every tree (e.g. "--max-num-batched-tokens 4096");
# THIS_VARIANTS measures this tree once more per ';'-separated set of arguments, after its default run (e.g.
# THIS_VARIANTS="--stream-interval 2;--stream-interval 4": tags this-v1, this-v2).
# The server runs at NV_LOGGING_LEVEL=DEBUG, so serve_<tree>.log holds the per-stage timeline every 10 s:
# the engine core loop (step, device wait, outputs, inputs, idle), the frontend's receiver thread (decode,
# handle, deliver) and the event loop's wake-up lag.
# Results: $NV_RESULTS_DIR (default ./bench-results): streaming_<tree>_c<N>_<run>.json, serve_<tree>.log,
# serve_streaming.log (one line per run, and the client's CPU time against its wall time).
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/dev/gpu_env.sh"
record_environment
export MODEL=$("$PYTHON" - <<'PY'
from nv_engine.model_loader.random_model import nv_cache_dir, write_random_checkpoint
model = nv_cache_dir() / "bench-random-qwen3-0.6b-bf16-tokenizer"
if not (model / "model.safetensors").exists():
    write_random_checkpoint(str(model), "qwen3-0.6b", dtype="bfloat16", with_tokenizer=True)
print(model)
PY
)
client() {   # port concurrency result-json
  if [ "${CLIENT:-nv}" = vllm ]; then
    "$PYTHON" -m vllm.entrypoints.cli.main bench serve --backend openai --endpoint /v1/completions \
      --base-url "http://127.0.0.1:$1" --model "$MODEL" --tokenizer "$MODEL" --dataset-name random \
      --random-input-len 512 --random-output-len 256 --num-prompts 1024 --max-concurrency "$2" --ignore-eos \
      --percentile-metrics ttft,tpot,itl --metric-percentiles 50,90,99 \
      --save-result --result-dir "$(dirname "$3")" --result-filename "$(basename "$3")"
  else
    "$PYTHON" -m nv_engine.entrypoints.cli bench serve --port "$1" --dataset-name random --random-input-len 512 \
      --random-output-len 256 --num-prompts 1024 --max-concurrency "$2" --ignore-eos \
      --percentile-metrics ttft,tpot,itl --metric-percentiles 50,90,99 --result-file "$3"
  fi
}
summary() {   # tree concurrency run json
  "$PYTHON" - "$@" <<'PY' | tee -a "$RESULTS/serve_streaming.log"
import json, sys
tree, c, run, path = sys.argv[1:]
try:
    r = json.load(open(path))
except OSError:
    print(f"{tree} c={c} {run}: no result (see the .log beside it)"); sys.exit()
g = lambda k: r.get(k) or 0
print(f"{tree} c={c} {run}: {g('output_throughput'):,.0f} out tok/s; TTFT p50/p99 {g('median_ttft_ms') or g('p50_ttft_ms'):,.0f}"
      f"/{g('p99_ttft_ms'):,.0f} ms; TPOT p50 {g('median_tpot_ms') or g('p50_tpot_ms'):.2f} ms; ITL mean/p50/p99 "
      f"{g('mean_itl_ms'):.1f}/{g('median_itl_ms') or g('p50_itl_ms'):.1f}/{g('p99_itl_ms'):.1f} ms")
PY
}
measure() {   # tag tree-root [extra nv serve arguments]
  local log="$RESULTS/serve_$1.log"
  PYTHONPATH="$(ls -d "$2"/packages/*/src | tr '\n' ':')${PYTHONPATH:-}" NV_LOGGING_LEVEL=DEBUG \
    "$PYTHON" -m nv_engine.entrypoints.cli serve "$MODEL" --port 8000 --max-model-len 4096 ${SERVE_ARGS:-} ${3:-} \
    > "$log" 2>&1 &
  local pid=$! start=$SECONDS
  until curl -sf http://127.0.0.1:8000/health >/dev/null; do
    kill -0 $pid 2>/dev/null || { echo "$1: server exited:"; tail -20 "$log"; return 1; }
    sleep 1
  done
  echo "$1: nv serve ready after $((SECONDS - start)) s" | tee -a "$RESULTS/serve_streaming.log"
  for step in "256 cold" "256 warm" "64 warm"; do
    set -- "$1" "$2" $step
    # the client's CPU time over its wall time: near 1.0 means the (single-process) client is the bottleneck
    local TIMEFORMAT="client cpu %U user + %S sys s over %R s wall"
    { time client 8000 "$3" "$RESULTS/streaming_$1_c$3_$4.json" > "$RESULTS/streaming_$1_c$3_$4.log" 2>&1; } \
      2> "$RESULTS/streaming_$1_c$3_$4.time"
    summary "$1" "$3" "$4" "$RESULTS/streaming_$1_c$3_$4.json"
    tee -a "$RESULTS/serve_streaming.log" < "$RESULTS/streaming_$1_c$3_$4.time"
  done
  kill -INT $pid; wait $pid
}
: > "$RESULTS/serve_streaming.log"
for old in "$@"; do
  if [ -d "$old" ]; then
    measure "$(basename "$old")" "$(cd "$old" && pwd)"
  else
    tree=$(mktemp -d)
    git -C "$ROOT" archive "$old" | tar -x -C "$tree"
    measure "$old" "$tree"
    rm -rf "$tree"
  fi
done
measure this "$ROOT"
IFS=';' read -ra variants <<< "${THIS_VARIANTS:-}"
for i in "${!variants[@]}"; do
  echo "this-v$((i + 1)): ${variants[$i]}" | tee -a "$RESULTS/serve_streaming.log"
  measure "this-v$((i + 1))" "$ROOT" "${variants[$i]}"
done
