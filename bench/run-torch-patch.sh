#!/usr/bin/env bash
# The patched Qwen3-MoE block beside transformers (bench/torch_patch.py):
# Qwen3-30B-A3B layer dims, bf16, forward + backward, recipes bf16 and mxfp8.
#
#   bench/run-torch-patch.sh prepare [TOKENS...]  # here (MLIR): the patch's
#                                                 # layers for sm_90a
#   bench/run-torch-patch.sh run [TOKENS...]      # on the GPU machine (torch,
#                                                 # transformers; builds libmoert)
#   bench/run-torch-patch.sh [all] [TOKENS...]    # both, on a machine with everything
#
# TOKENS default to 2048 4096 8192 16384; 3000 (a bucket of 3072 rows) is
# always added to show bucketing.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir="$root/gpu-artifacts/torch-patch"
. "$root/bench/common.sh"
bench_args "2048 4096 8192 16384" "$@"

prepare() {
  "$root/scripts/build.sh"
  mkdir -p "$dir"
  PYTHONPATH="$root/build/python_packages" "$root/.venv/bin/python" - "$dir" "${tokens[@]}" <<'PY'
import sys
import moe_mlir.torch as mt
out, counts = sys.argv[1], [int(t) for t in sys.argv[2:]]
for recipe, ts in (("bf16", counts + [3000]), ("mxfp8", counts)):
    for t in ts:
        print(f"compile: patched block, {t} tokens, recipe {recipe} (sm_90a)", flush=True)
        mt.precompile(out, 2048, 768, 128, 8, t, dtype="bf16", recipe=recipe, target="sm_90a")
PY
}

run() { bench_python torch_patch.py "$dir" "${tokens[@]}"; }

bench_main
