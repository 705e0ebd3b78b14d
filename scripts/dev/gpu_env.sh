# Sourced by scripts/dev/gpu_*.sh, scripts/dev/compare_trees.sh and benchmarks/*.sh. Runs from the repo root
# with every package's src dir and tests/ on PYTHONPATH, so a GPU machine needs only the dependencies installed
# (torch with CUDA, triton, transformers, pytest; no hatch, no editable installs). Results (logs, JSON) go to
# $RESULTS: $NV_RESULTS_DIR when set, else ./bench-results (git-ignored). nv's caches (random checkpoints, GGUF
# conversions) go to $XDG_CACHE_HOME, /tmp/nv-cache by default, so results stay small.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$(pwd)
RESULTS=${NV_RESULTS_DIR:-$ROOT/bench-results}
mkdir -p "$RESULTS"
export PYTHONPATH="$(ls -d "$ROOT"/packages/*/src | tr '\n' ':')$ROOT/tests:${PYTHONPATH:-}"
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/nv-cache} PYTHONUNBUFFERED=1
PYTHON=${PYTHON:-python3}

# env.log: the date, the GPU and the versions every figure in BENCHMARKS.md is quoted with.
record_environment() {
  {
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
    "$PYTHON" -c 'import sys, torch, triton, transformers; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)'
  } 2>&1 | tee "$RESULTS/env.log"
}
