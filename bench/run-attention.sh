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
# MOE_ATTENTION_FLAGS: moe-compile flags for a variant of the kernels (for
# example --flash-dkv-overlap), kept in a directory of its own
# (gpu-artifacts/attention+FLAGS), so that both run in one job; its stages
# print with `python3 bench/attention.py stages DIR SEQ`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
flags=${MOE_ATTENTION_FLAGS:-}
dir="$root/gpu-artifacts/attention${flags:++$(echo "$flags" | tr -d ' -')}"
. "$root/bench/common.sh"
bench_args "1024 2048 4096 8192 16384" "$@"

prepare() {
  "$root/scripts/build.sh"
  mkdir -p "$dir"
  for S in "${tokens[@]}"; do
    python3 "$root/bench/attention.py" emit "$S" >"$dir/attention_$S.mlir"
    echo "compile: attention at sequence $S (sm_90a)"
    # shellcheck disable=SC2086 # the flags are words
    "$root/build/bin/moe-compile" "$dir/attention_$S.mlir" --target=sm_90a $flags \
      -o "$dir/attention_$S.sm_90a.so"
  done
}

run() { bench_python attention.py run "$dir" "${tokens[@]}"; }

bench_main
