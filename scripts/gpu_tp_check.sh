#!/usr/bin/env bash
# Issue 7 on a 2-GPU machine (device kind nvidia-h200-x2), one call: the NCCL tests, the all-reduce
# time per decode step, and `nv bench` at the Qwen3-8B shape with TP=1 and TP=2.
# Logs go to $OUT when set, else ./out. NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
export PYTHONPATH="$(ls -d "$ROOT"/packages/*/src | tr '\n' ':')$ROOT/tests:${PYTHONPATH:-}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/nv-cache}
LOG_DIR=${OUT:-$ROOT/out}
mkdir -p "$LOG_DIR"
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$LOG_DIR/tp_env.log"
[ "${SKIP_TESTS:-0}" = 1 ] || python3 -m pytest -m gpu -q -rs tests/test_tp_gpu.py tests/test_executor.py -k "tp2 or killed or nccl" 2>&1 | tee "$LOG_DIR/tp_tests.log"
python3 -m torch.distributed.run --nproc-per-node 2 scripts/allreduce_bench.py --hidden 4096 --layers 36 2>&1 \
  | grep -v Warning | tee "$LOG_DIR/allreduce.log"
for tp in 1 2; do
  python3 -m nv_engine.entrypoints.cli bench --random-weights --shape qwen3-8b --tensor-parallel-size $tp \
    --json "$LOG_DIR/bench_8b_tp$tp.json" "$@" 2>&1 | tee "$LOG_DIR/bench_8b_tp$tp.log"
done
