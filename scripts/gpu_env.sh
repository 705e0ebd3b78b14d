# Sourced by the scripts/gpu_*.sh scripts: run from the repo root with every package's src dir and
# tests/ on PYTHONPATH (the GPU machine has no hatch and no network); logs go to $LOG ($OUT when the
# device tool sets it, else ./out); nv's caches (random checkpoints, GGUF conversions) stay out of $OUT.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
LOG=${OUT:-$ROOT/out}
mkdir -p "$LOG"
export PYTHONPATH="$(ls -d "$ROOT"/packages/*/src | tr '\n' ':')$ROOT/tests:${PYTHONPATH:-}"
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/nv-cache} PYTHONUNBUFFERED=1
