#!/usr/bin/env bash
# Issue 8's H200 check: nv against HF transformers on SmolLM2-135M-Instruct (GGUF) in bf16
# (the GPU tests of tests/test_llama_gguf.py and tests/test_llama.py).
# The GPU machine has no network and a call carries at most 64 MiB, so: the wheels of gguf and
# accelerate in .whl/gguf, and the 98 MB GGUF in two git-ignored parts (.whl/smol/part-aa, part-ab;
# `split -b 50000000`, plus .whl/smol/SHA256) carried by two back-to-back calls to a warm machine
# (ignored files stay there between calls); this script, in the second call, puts them together.
source "$(dirname "$0")/gpu_env.sh"
python3 -m pip install -q --no-deps --no-index .whl/gguf/*.whl 2>&1 | tail -2
mkdir -p /tmp/smol
GGUF=/tmp/smol/SmolLM2-135M-Instruct.Q4_1.gguf
cat .whl/smol/part-* > "$GGUF"
if [ "$(sha256sum "$GGUF" | cut -d' ' -f1)" != "$(cat .whl/smol/SHA256)" ]; then
  echo "GGUF parts do not add up (ls: $(ls .whl/smol))"; exit 3
fi
export NV_DEFAULT_GGUF=$GGUF
timeout 450 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/test_llama_gguf.py tests/test_llama.py \
  2>&1 | tail -15 | tee "$LOG/gguf_tests.log"
