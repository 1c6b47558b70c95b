#!/usr/bin/env bash
# The MoE layer table (bench/layer.py): ours beside transformers and a
# torch._grouped_mm layer, forward + backward, balanced and skewed routing.
#
#   bench/run-layer.sh prepare [TOKENS...]  # here (MLIR): the layer's train
#                                           # step for sm_90a, f32 and MXFP8
#   bench/run-layer.sh run [TOKENS...]      # on the GPU machine (torch,
#                                           # transformers; builds libmoert)
#   bench/run-layer.sh [all] [TOKENS...]    # both, on a machine with everything
#
# TOKENS default to 2048 8192.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir="$root/gpu-artifacts/layer"
. "$root/bench/common.sh"
bench_args "2048 8192" "$@"

prepare() {
  "$root/scripts/build.sh"
  mkdir -p "$dir"
  for T in "${tokens[@]}"; do
    # f32 experts: groups as routed; MXFP8: each expert's rows padded to 32
    # (its columnwise MX blocks never mix two experts).
    for pad in 1 32; do
      PYTHONPATH="$root/python" "$root/.venv/bin/python" - "$T" "$pad" \
        >"$dir/layer_${T}_pad$pad.mlir" <<'PY'
import sys
from moe_mlir import layers
T, pad = int(sys.argv[1]), int(sys.argv[2])
H, F, E, K = 2048, 768, 128, 8
print(layers.as_loss(layers.moe_layer(T, H, F, E, K, name="loss", pad_to=pad),
                     "loss", T, H))
PY
    done
    for recipe in none mxfp8; do
      pad=1
      [ "$recipe" = mxfp8 ] && pad=32
      echo "compile: layer $T tokens, recipe $recipe, groups padded to $pad (sm_90a)"
      "$root/build/bin/moe-opt" "$dir/layer_${T}_pad$pad.mlir" \
        --moe-train-pipeline="autodiff=true recipe=$recipe" -o "$dir/layer_${T}_$recipe.mlir"
      "$root/build/bin/moe-compile" "$dir/layer_${T}_$recipe.mlir" --target=sm_90a \
        -o "$dir/layer_${T}_$recipe.sm_90a.so"
    done
    # The speed-first variant: every pair of MX round trips in one kernel,
    # whatever it holds (the default splits pairs that raise the peak).
    echo "compile: layer $T tokens, recipe mxfp8, --pair-round-trips=always (sm_90a)"
    "$root/build/bin/moe-compile" "$dir/layer_${T}_mxfp8.mlir" --target=sm_90a \
      --pair-round-trips=always -o "$dir/layer_${T}_mxfp8-paired.sm_90a.so"
    # The memory-first variant: every SwiGLU epilogue's activation 8-bit for
    # the GEMMs reading it (the default only where that lowers the peak).
    echo "compile: layer $T tokens, recipe mxfp8, --mx-activations=always (sm_90a)"
    "$root/build/bin/moe-compile" "$dir/layer_${T}_mxfp8.mlir" --target=sm_90a \
      --mx-activations=always -o "$dir/layer_${T}_mxfp8-mx.sm_90a.so"
  done
}

run() { bench_python layer.py "$dir" "${tokens[@]}"; }

bench_main
