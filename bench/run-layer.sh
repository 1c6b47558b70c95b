#!/usr/bin/env bash
# The MoE layer table (bench/layer.py): ours beside transformers and a
# torch._grouped_mm layer, forward + backward, balanced and skewed routing,
# at one model's layer dims.
#
#   bench/run-layer.sh prepare [DIMS] [TOKENS...]  # here (MLIR): the layer's
#                                                  # train step for sm_90a
#   bench/run-layer.sh run [DIMS] [TOKENS...]      # on the GPU machine (torch,
#                                                  # transformers; libmoert)
#   bench/run-layer.sh [all] [DIMS] [TOKENS...]    # both, where both exist
#
# DIMS: --dims HIDDEN,FFN,EXPERTS,TOPK, or --config FILE (a Hugging Face
# config.json: hidden_size, moe_intermediate_size, num_experts or
# num_local_experts, num_experts_per_tok); default Qwen3-30B-A3B's,
# 2048,768,128,8. Ours: f32 and --recipe bf16 always; --recipe mxfp8 (and
# its variants) where hidden and FFN are multiples of 32, the MX block;
# --recipe fp8-blockwise where they are multiples of 128, its tile.
# The MXFP8 variants (--pair-round-trips=always, --mx-activations=always)
# too, unless --no-variants. The f32 recipe up to 2048 tokens only.
# TOKENS default to 2048 8192. Each dims set has its artifacts directory,
# so several models can be prepared before one GPU run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/bench/common.sh"
dims=2048,768,128,8
variants=1
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dims) [ $# -ge 2 ] || { echo "run-layer.sh: --dims needs HIDDEN,FFN,EXPERTS,TOPK" >&2; exit 2; }
            dims=$2; shift 2 ;;
    --config) [ $# -ge 2 ] || { echo "run-layer.sh: --config needs a config.json" >&2; exit 2; }
              dims=$(python3 - "$2" <<'PY'
import json, sys
try:
    c = json.load(open(sys.argv[1]))
    e = c.get("num_experts", c.get("num_local_experts"))
    print(f"{c['hidden_size']},{c['moe_intermediate_size']},{e},{c['num_experts_per_tok']}")
except (OSError, ValueError, KeyError) as err:
    sys.exit(f"run-layer.sh: --config {sys.argv[1]}: {type(err).__name__}: {err}")
PY
) || exit 2
              shift 2 ;;
    --no-variants) variants=0; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
[[ "$dims" =~ ^[1-9][0-9]*,[1-9][0-9]*,[1-9][0-9]*,[1-9][0-9]*$ ]] ||
  { echo "run-layer.sh: dims must be HIDDEN,FFN,EXPERTS,TOPK (positive integers), got '$dims'" >&2; exit 2; }
IFS=, read -r H F E K <<<"$dims"
[ "$K" -le "$E" ] || { echo "run-layer.sh: top-k $K is more than the $E experts" >&2; exit 2; }
bench_args "2048 8192" ${args[@]+"${args[@]}"}
dir="$root/gpu-artifacts/layer/${H}x${F}x${E}x${K}"

prepare() {
  "$root/scripts/build.sh"
  mkdir -p "$dir"
  for T in "${tokens[@]}"; do
    # f32 experts: groups as routed; MXFP8: each expert's rows padded to 32
    # (its columnwise MX blocks never mix two experts); blockwise FP8: to 128.
    for pad in 1 32 128; do
      PYTHONPATH="$root/python" "$root/.venv/bin/python" - "$T" "$pad" "$H" "$F" "$E" "$K" \
        >"$dir/layer_${T}_pad$pad.mlir" <<'PY'
import sys
from moe_mlir import layers
T, pad, H, F, E, K = (int(a) for a in sys.argv[1:])
print(layers.as_loss(layers.moe_layer(T, H, F, E, K, name="loss", pad_to=pad),
                     "loss", T, H))
PY
    done
    # f32 only up to 2048 tokens (it runs at about 5k tokens/s).
    recipes=(bf16)
    [ "$T" -le 2048 ] && recipes=(none bf16)
    mx=0
    [ $((H % 32)) -eq 0 ] && [ $((F % 32)) -eq 0 ] && mx=1 && recipes+=(mxfp8)
    [ $((H % 128)) -eq 0 ] && [ $((F % 128)) -eq 0 ] && recipes+=(fp8-blockwise)
    for recipe in "${recipes[@]}"; do
      # Each expert's rows padded to the recipe's row block (moe-train's
      # expertRowPadding): 32 for MXFP8, 128 for blockwise FP8.
      pad=1
      [ "$recipe" = mxfp8 ] && pad=32
      [ "$recipe" = fp8-blockwise ] && pad=128
      echo "compile: layer $T tokens, recipe $recipe, groups padded to $pad (sm_90a)"
      "$root/build/bin/moe-opt" "$dir/layer_${T}_pad$pad.mlir" \
        --moe-train-pipeline="autodiff=true recipe=$recipe" -o "$dir/layer_${T}_$recipe.mlir"
      "$root/build/bin/moe-compile" "$dir/layer_${T}_$recipe.mlir" --target=sm_90a \
        -o "$dir/layer_${T}_$recipe.sm_90a.so"
    done
    [ "$mx" = 1 ] && [ "$variants" = 1 ] || continue
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

run() { bench_python layer.py "$dir" --dims "$H,$F,$E,$K" "${tokens[@]}"; }

bench_main
