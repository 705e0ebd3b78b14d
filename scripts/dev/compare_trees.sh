#!/usr/bin/env bash
# The headline through the LLM API for an older commit and this tree, back to back on one GPU, in the order
# old, new, old, new (the first pair also pays Triton's compiles into a fresh cache; compare the second pair):
#   bash scripts/dev/compare_trees.sh OLD_COMMIT      (or a directory holding the old tree)
# Results: RESULT lines on stdout and in $NV_RESULTS_DIR/compare_trees.log (default ./bench-results).
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
record_environment
OLD_REF=${1:?usage: compare_trees.sh OLD_COMMIT|OLD_TREE_DIR}
if [ -d "$OLD_REF" ]; then
  OLD_TREE=$(cd "$OLD_REF" && pwd) KEEP_OLD=1
else
  OLD_TREE=$(mktemp -d) KEEP_OLD=0
  git -C "$ROOT" archive "$OLD_REF" | tar -x -C "$OLD_TREE"
fi
run() {   # tag tree
  PYTHONPATH="$(ls -d "$2"/packages/*/src | tr '\n' ':')" "$PYTHON" "$ROOT/benchmarks/headline_runs.py" "$1" 2>&1 \
    | grep -E "RESULT|Error"
}
{
  run old-1 "$OLD_TREE"; run new-1 "$ROOT"; run old-2 "$OLD_TREE"; run new-2 "$ROOT"
} | tee "$RESULTS/compare_trees.log"
[ "$KEEP_OLD" = 1 ] || rm -rf "$OLD_TREE"
