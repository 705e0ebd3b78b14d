#!/usr/bin/env bash
# Quantized weights at the Qwen3-8B shape, the figures BENCHMARKS.md's quantization rows and targets name: the
# quantization GPU tests; the headline (`nv bench`) with bf16, then FP8 weights; batch-1 ms per token with bf16,
# FP8 and INT4 (AWQ layout) weights; then the kernels per projection (W8A8 past 16 rows, the FP8 skinny GEMM and
# INT4 at 1-16 rows). The random 8B checkpoint (16 GB) is written once to $XDG_CACHE_HOME, drawn on the GPU.
#   NV_RESULTS_DIR=DIR bash scripts/dev/gpu_quant_check.sh
# Writes env.log, quant_tests.log, bench-8b-{bf16,fp8}.json and .log, batch1-8b.log and kernels.log under
# $NV_RESULTS_DIR (default ./bench-results).
source "$(dirname "$0")/gpu_env.sh"
record_environment

echo "== quantization GPU tests =="
"$PYTHON" -m pytest -m gpu -q -rs tests/test_gpu_fp8_weights.py tests/test_gpu_int4_weights.py \
  packages/nv-kernels/tests/test_gpu_int4_gemm.py 2>&1 | tee "$RESULTS/quant_tests.log"
tests_rc=${PIPESTATUS[0]}

bench_rc=0
for quantization in bf16 fp8; do
  echo "== nv bench, Qwen3-8B shape, $quantization weights =="
  extra=()
  [ "$quantization" != bf16 ] && extra=(--quantization "$quantization")
  "$PYTHON" -m nv_engine.entrypoints.cli bench --random-weights --shape qwen3-8b --disable-tqdm "${extra[@]}" \
    --json "$RESULTS/bench-8b-$quantization.json" 2>&1 | tee "$RESULTS/bench-8b-$quantization.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || bench_rc=1
done

echo "== batch 1, Qwen3-8B shape: bf16, FP8, INT4 weights =="
for quantization in "" fp8 awq; do
  "$PYTHON" benchmarks/small_batch_profile.py qwen3-8b --batches "" --no-profile \
    ${quantization:+--quantization "$quantization"} 2>&1 | grep -E '^\{' | tee -a "$RESULTS/batch1-8b.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || bench_rc=1
done

echo "== kernels per projection =="
(
  "$PYTHON" benchmarks/bench_w8a8_gemm.py --json "$RESULTS/w8a8_gemm.json"
  "$PYTHON" benchmarks/bench_small_gemm.py --fp8 --quick --models 8b --m 1,4,16 --json "$RESULTS/small_gemm.json"
  "$PYTHON" benchmarks/bench_int4_gemm.py --m 1,8,16 --no-sweep
) 2>&1 | tee "$RESULTS/kernels.log"

echo "quantization tests exit $tests_rc, benchmarks $bench_rc"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
