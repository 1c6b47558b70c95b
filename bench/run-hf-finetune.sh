#!/usr/bin/env bash
# Fine-tuning a Hugging Face model and handing it back, at Qwen3-30B-A3B's
# dimensions with LAYERS decoder layers (default 2): transformers builds and
# saves the model (bf16, sharded, per-expert tensors: the Hub's layout),
# moert-train fine-tunes it from that directory (--init-from, bf16 recipe),
# export_hf writes it back in f32 and bf16, and transformers' loss on each
# export is compared with our compiled loss on the checkpoint's weights
# (f32: 1e-5 relative, bf16: 1e-2), before and after fine-tuning
# (bench/hf_finetune.py). One batch of 1 x 512 tokens.
#
#   bench/run-hf-finetune.sh prepare [LAYERS]  # here (MLIR): compile the steps
#   bench/run-hf-finetune.sh run [LAYERS]      # on the GPU machine (torch)
#   bench/run-hf-finetune.sh [all] [LAYERS]    # both
#
# MOE_FINETUNE_STEPS: fine-tuning steps (default 20).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir="$root/gpu-artifacts/hf-finetune"
. "$root/bench/common.sh"
bench_args "2" "$@"
layers=${tokens[0]}
base="$root/test/Models/Inputs/qwen3-30b-a3b-2layers.json"
config="$dir/qwen3-30b-a3b-${layers}layers.json"

prepare() {
  "$root/scripts/build.sh"
  mkdir -p "$dir"
  cp /usr/share/doc/hmmer/examples/tutorial/Pkinase.sto "$dir/"
  python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); c["num_hidden_layers"] = int(sys.argv[2]); print(json.dumps(c, indent=2))' \
    "$base" "$layers" >"$config"
  for recipe in none bf16; do
    echo "compile: $layers layers, 1 x 512 tokens, --recipe $recipe"
    "$root/build/bin/moe-train" --config "$config" --batch 1 --seq 512 --target sm_90a \
      --recipe "$recipe" --compile-only --out "$dir/steps-$layers"
  done
}

run() {
  local rt=${MOE_RUNTIME_BUILD:-/tmp/moert-build}
  "$root/scripts/build-runtime.sh" "$rt"
  echo "# Hugging Face fine-tuning round trip on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date -u +%Y-%m-%d)"
  echo "## Qwen3-30B-A3B dims, $layers layers"
  PYTHONPATH="$root/python" MOERT_LIBRARY="$rt/lib/libmoert.so" MOERT_TRAIN="$rt/bin/moert-train" \
    python3 "$root/bench/hf_finetune.py" "$config" "$dir/steps-$layers" "$dir/Pkinase.sto" \
    /tmp/moe-hf-finetune "${MOE_FINETUNE_STEPS:-20}" 2>&1 | grep -v -E "Warning|Loading weights|Writing model"
}

bench_main
