#!/usr/bin/env bash
# The blockwise FP8 recipe's tables in one GPU run, each with its peers:
# the GPU check of its kernels against the CPU (scripts/gpu-check.sh
# fp8block), the grouped GEMMs at 16384 tokens (bench/run-gemm.sh), the MoE
# layer forward + backward at 16384 tokens with the layer's step by stage
# (bench/run-layer.sh, bench/profile_layer.py), and the 4-layer model of
# Qwen3-30B-A3B's dims at 4 x 4096 tokens, bf16 beside fp8-blockwise and
# the transformers peers, the fp8-blockwise step by stage, then both
# recipes' loss curves at 1 x 4096 (bench/run-train.sh).
#
#   bench/run-fp8block.sh prepare   # here (MLIR): compile everything for sm_90a
#   bench/run-fp8block.sh run       # there (no MLIR): build libmoert, run
#   bench/run-fp8block.sh [all]     # both, on a machine with everything
#
# Each table goes to stdout and to $MOE_BENCH_OUT (default
# /tmp/moe-fp8block): gpu-check.txt, gemm.txt, layer.txt,
# layer-profile.txt, train.txt, train-profile.txt, curves.txt.
# MOE_CURVE_STEPS: the loss curves' steps (default 200; 0 skips them).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/bench/common.sh"
# (No tokens: the tables' sizes are the targets'.)
[ $# -le 1 ] && [[ "${1:-all}" =~ ^(prepare|run|all|-h|--help)$ ]] ||
  { echo "usage: bench/run-fp8block.sh [prepare|run|all] (--help for more)" >&2; exit 2; }
bench_args "" "$@"
curve=${MOE_CURVE_STEPS:-200}
[[ "$curve" =~ ^[0-9]+$ ]] ||
  { echo "run-fp8block.sh: MOE_CURVE_STEPS must be a number of steps, got '$curve'" >&2; exit 2; }
layer="$root/gpu-artifacts/layer/2048x768x128x8/layer_16384_fp8-blockwise.sm_90a.so"
train="$root/gpu-artifacts/train-bench/qwen-4-4x4096-fp8-blockwise"

prepare() {
  "$root/scripts/gpu-check.sh" prepare fp8block
  "$root/bench/run-gemm.sh" prepare 16384
  "$root/bench/run-layer.sh" prepare --no-variants 16384
  local shapes=4x4096
  [ "$curve" = 0 ] || shapes="4x4096 1x4096"
  MOE_TRAIN_RECIPES="bf16 fp8-blockwise" MOE_TRAIN_SHAPES="$shapes" \
    "$root/bench/run-train.sh" prepare 4
}

run() {
  local out=${MOE_BENCH_OUT:-/tmp/moe-fp8block} rt=${MOE_RUNTIME_BUILD:-/tmp/moert-build}
  mkdir -p "$out"
  # A table's failure is reported and the others still run.
  local status=0
  step() { # NAME COMMAND...: runs it; its output (less torch's warnings) to
            # stdout and $out/NAME
    local name=$1 rc=0
    shift
    echo "== $name"
    "$@" >"$out/$name.log" 2>&1 || rc=$?
    grep -v -e Warning -e _warn_once "$out/$name.log" >"$out/$name" || true
    rm -f "$out/$name.log"
    cat "$out/$name"
    if [ "$rc" != 0 ]; then
      echo "$name: failed (exit $rc)"
      status=1
    fi
  }
  step gpu-check.txt "$root/scripts/gpu-check.sh" run
  step gemm.txt "$root/bench/run-gemm.sh" run 16384
  step layer.txt "$root/bench/run-layer.sh" run --no-variants 16384
  step layer-profile.txt env PYTHONPATH="$root/python" MOERT_LIBRARY="$rt/lib/libmoert.so" \
    python3 "$root/bench/profile_layer.py" "$layer" 16384 45
  step train.txt env MOE_TRAIN_RECIPES="bf16 fp8-blockwise" MOE_TRAIN_SHAPES=4x4096 \
    MOE_TRAIN_PROFILE=0 "$root/bench/run-train.sh" run 4
  step train-profile.txt env PYTHONPATH="$root/python" MOERT_LIBRARY="$rt/lib/libmoert.so" \
    python3 "$root/bench/profile_train.py" "$train"/train_step-sm_90a-fp8-blockwise.so 30
  if [ "$curve" != 0 ]; then
    step curves.txt env MOE_TRAIN_RECIPES="bf16 fp8-blockwise" MOE_TRAIN_SHAPES=1x4096 \
      MOE_TRAIN_PEERS=none MOE_TRAIN_PROFILE=0 MOE_TRAIN_CURVE_STEPS="$curve" \
      "$root/bench/run-train.sh" run 4
  fi
  return $status
}

bench_main
