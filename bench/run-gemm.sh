#!/usr/bin/env bash
# The grouped GEMM table (bench/gemm.py): ours (bf16, exact MXFP8, MXFP8 on
# FP8 wgmma) beside torch._grouped_mm and torch._scaled_grouped_mm at the
# Qwen3-30B-A3B expert shapes, balanced and skewed routing.
#
#   bench/run-gemm.sh prepare [TOKENS...]  # here (MLIR): compile for sm_90a
#   bench/run-gemm.sh run [TOKENS...]      # on the GPU machine (torch;
#                                          # builds libmoert)
#   bench/run-gemm.sh [all] [TOKENS...]    # both, on a machine with everything
#
# TOKENS (default 2048 8192 16384 65536) x top-8 rows per GEMM.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir="$root/gpu-artifacts/gemm"
. "$root/bench/common.sh"
bench_args "2048 8192 16384 65536" "$@"

prepare() {
  "$root/scripts/build.sh"
  mkdir -p "$dir"
  for T in "${tokens[@]}"; do
    rows=$((T * 8))
    python3 "$root/bench/gemm.py" emit "$rows" >"$dir/gemm_$rows.mlir"
    echo "compile: grouped GEMMs at $rows rows (sm_90a; with --mxfp8-fp8-mma; with --fp8block-exact)"
    "$root/build/bin/moe-compile" "$dir/gemm_$rows.mlir" --target=sm_90a \
      -o "$dir/gemm_$rows.sm_90a.so"
    "$root/build/bin/moe-compile" "$dir/gemm_$rows.mlir" --target=sm_90a --mxfp8-fp8-mma \
      -o "$dir/gemm_$rows.fp8-mma.sm_90a.so"
    "$root/build/bin/moe-compile" "$dir/gemm_$rows.mlir" --target=sm_90a --fp8block-exact \
      -o "$dir/gemm_$rows.fp8block-exact.sm_90a.so"
  done
}

run() { bench_python gemm.py run "$dir" "${tokens[@]}"; }

bench_main
