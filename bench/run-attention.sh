#!/usr/bin/env bash
# The attention table (bench/attention.py): our flash kernels beside torch's
# scaled_dot_product_attention backends at Qwen3-30B-A3B's heads (32 query,
# 4 KV, head dim 128, causal), 16384 tokens a call.
#
#   bench/run-attention.sh prepare [SEQ...]  # here (MLIR): compile for sm_90a
#   bench/run-attention.sh run [SEQ...]      # on the GPU machine (torch;
#                                            # builds libmoert)
#   bench/run-attention.sh [all] [SEQ...]    # both, on a machine with everything
#
# SEQ: sequence lengths (default 1024 2048 4096 8192 16384).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir="$root/gpu-artifacts/attention"
. "$root/bench/common.sh"
bench_args "1024 2048 4096 8192 16384" "$@"

prepare() {
  "$root/scripts/build.sh"
  mkdir -p "$dir"
  for S in "${tokens[@]}"; do
    python3 "$root/bench/attention.py" emit "$S" >"$dir/attention_$S.mlir"
    echo "compile: attention at sequence $S (sm_90a)"
    "$root/build/bin/moe-compile" "$dir/attention_$S.mlir" --target=sm_90a \
      -o "$dir/attention_$S.sm_90a.so"
  done
}

run() { bench_python attention.py run "$dir" "${tokens[@]}"; }

bench_main
