#!/usr/bin/env bash
# Every benchmark table of the project at the sizes of its targets, ours
# beside the peers in one GPU run: the grouped GEMMs (bench/run-gemm.sh) and
# the MoE layer forward + backward (bench/run-layer.sh).
#
#   bench/run-all.sh [all]     # on a machine with MLIR, CUDA, torch and an H100/H200
#   bench/run-all.sh prepare   # here (MLIR): compile everything for sm_90a
#   bench/run-all.sh run       # there (no MLIR needed): build libmoert, run
#
# Tokens: MOE_BENCH_TOKENS (default 2048 8192 16384 32768 65536) for the
# layer, MOE_GEMM_TOKENS (default 2048 8192 16384 65536) for the GEMMs.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mode=${1:-all}
case "$mode" in
  prepare|run|all) ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "usage: bench/run-all.sh [prepare|run|all] (--help for more)" >&2; exit 2 ;;
esac
read -r -a layer <<<"${MOE_BENCH_TOKENS:-2048 8192 16384 32768 65536}"
read -r -a gemm <<<"${MOE_GEMM_TOKENS:-2048 8192 16384 65536}"
"$root/bench/run-gemm.sh" "$mode" "${gemm[@]}"
"$root/bench/run-layer.sh" "$mode" "${layer[@]}"
