#!/usr/bin/env bash
# The MoE layer table (bench/layer.py): ours beside transformers and a
# torch._grouped_mm layer, forward + backward, balanced and skewed routing.
#
#   bench/run-layer.sh prepare [TOKENS...]  # here (MLIR): the layer's train
#                                           # step for sm_90a, f32 and MXFP8
#   bench/run-layer.sh run [TOKENS...]      # on the GPU machine (torch,
#                                           # transformers; builds libmoert)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir="$root/gpu-artifacts/layer"
mode=${1:-run}
shift || true
tokens=("$@")
[ ${#tokens[@]} -gt 0 ] || tokens=(2048 8192)

prepare() {
  "$root/scripts/build.sh"
  mkdir -p "$dir"
  for T in "${tokens[@]}"; do
    PYTHONPATH="$root/python" "$root/.venv/bin/python" - "$T" >"$dir/layer_$T.mlir" <<'PY'
import sys
from moe_mlir import layers
T = int(sys.argv[1])
H, F, E, K = 2048, 768, 128, 8
text = layers.moe_layer(T, H, F, E, K, name="loss")
n = T * H
text = text.replace(f"%w2: tensor<{E}x{F}x{H}xf32>) -> tensor<{T}x{H}xf32> {{",
                    f"%w2: tensor<{E}x{F}x{H}xf32>, %dy: tensor<{T}x{H}xf32> {{moe.no_grad}}) -> tensor<f32> {{")
# sum(out * dy) in two stages (rows, then the column of row sums): a
# reduction straight to a scalar would run in one GPU thread.
text = text.replace(f"  return %out : tensor<{T}x{H}xf32>", f"""  %prod = arith.mulf %out, %dy : tensor<{T}x{H}xf32>
  %onesh = arith.constant dense<1.0> : tensor<{H}x1xf32>
  %er = tensor.empty() : tensor<{T}x1xf32>
  %zr = linalg.fill ins(%zero : f32) outs(%er : tensor<{T}x1xf32>) -> tensor<{T}x1xf32>
  %rows = linalg.matmul ins(%prod, %onesh : tensor<{T}x{H}xf32>, tensor<{H}x1xf32>) outs(%zr : tensor<{T}x1xf32>) -> tensor<{T}x1xf32>
  %rflat = tensor.collapse_shape %rows [[0, 1]] : tensor<{T}x1xf32> into tensor<{T}xf32>
  %rrow = tensor.expand_shape %rflat [[0, 1]] output_shape [1, {T}] : tensor<{T}xf32> into tensor<1x{T}xf32>
  %onest = arith.constant dense<1.0> : tensor<{T}x1xf32>
  %e1 = tensor.empty() : tensor<1x1xf32>
  %z1 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<1x1xf32>) -> tensor<1x1xf32>
  %m = linalg.matmul ins(%rrow, %onest : tensor<1x{T}xf32>, tensor<{T}x1xf32>) outs(%z1 : tensor<1x1xf32>) -> tensor<1x1xf32>
  %l = tensor.collapse_shape %m [] : tensor<1x1xf32> into tensor<f32>
  return %l : tensor<f32>""")
print(text)
PY
    for recipe in none mxfp8; do
      echo "compile: layer $T tokens, recipe $recipe (sm_90a)"
      "$root/build/bin/moe-opt" "$dir/layer_$T.mlir" \
        --moe-train-pipeline="autodiff=true recipe=$recipe" -o "$dir/layer_${T}_$recipe.mlir"
      "$root/build/bin/moe-compile" "$dir/layer_${T}_$recipe.mlir" --target=sm_90a \
        -o "$dir/layer_${T}_$recipe.sm_90a.so"
    done
  done
}

run() {
  local rt=${MOE_RUNTIME_BUILD:-/tmp/moert-build}
  "$root/scripts/build-runtime.sh" "$rt"
  PYTHONPATH="$root/python" MOERT_LIBRARY="$rt/lib/libmoert.so" \
    python3 "$root/bench/layer.py" "$dir" "${tokens[@]}"
}

case "$mode" in
  prepare) prepare ;;
  run) run ;;
  *) echo "usage: bench/run-layer.sh prepare|run [TOKENS...]" >&2; exit 2 ;;
esac
