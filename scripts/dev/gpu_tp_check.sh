#!/usr/bin/env bash
# Tensor parallelism on a machine with two GPUs: the TP GPU tests, the all-reduce time per decode step
# (NCCL against the symmetric-memory all-reduce), the TP engine figures at the Qwen3-8B shape (batch-1 ms
# per token and the headline runs, TP=1 and TP=2, and TP=2 without the custom all-reduce), then
# `nv bench` with TP=1 and TP=2. Extra arguments go to nv bench.
#   NV_RESULTS_DIR=DIR bash scripts/dev/gpu_tp_check.sh [nv bench args]
# NVLink multicast (NVLS) stays off, as in every figure of BENCHMARKS.md; SKIP_TESTS=1 skips the tests,
# SKIP_BENCH=1 skips nv bench.
source "$(dirname "$0")/gpu_env.sh"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
record_environment
[ "${SKIP_TESTS:-0}" = 1 ] || "$PYTHON" -m pytest -m gpu -q -rs tests/test_tp_gpu.py packages/nv-engine/tests/test_executor.py \
  -k "tp2 or killed or nccl or all_reduce" 2>&1 | tee "$RESULTS/tp_tests.log"
"$PYTHON" -m torch.distributed.run --nproc-per-node 2 benchmarks/allreduce_bench.py --hidden 4096 --layers 36 2>&1 \
  | grep -v Warning | tee "$RESULTS/allreduce.log"
for run in "--tp 1" "--tp 2" "--tp 2 --disable-custom-all-reduce"; do
  # shellcheck disable=SC2086
  "$PYTHON" benchmarks/tp_engine_bench.py $run --shape qwen3-8b 2>&1 | grep -v Warning | tee -a "$RESULTS/tp_engine.log"
done
[ "${SKIP_BENCH:-0}" = 1 ] || for tp in 1 2; do
  "$PYTHON" -m nv_engine.entrypoints.cli bench --random-weights --shape qwen3-8b --tensor-parallel-size $tp \
    --json "$RESULTS/bench_8b_tp$tp.json" "$@" 2>&1 | tee "$RESULTS/bench_8b_tp$tp.log"
done
