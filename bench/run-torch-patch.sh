#!/usr/bin/env bash
# The patched Qwen3-MoE block beside transformers (bench/torch_patch.py):
# bf16, forward + backward, recipes bf16 and mxfp8; Qwen3-30B-A3B layer
# dims, or those of a Qwen3-MoE config.json.
#
#   bench/run-torch-patch.sh prepare [--config FILE] [TOKENS...]  # here (MLIR):
#                                                 # the patch's layers for sm_90a
#   bench/run-torch-patch.sh run [--config FILE] [TOKENS...]      # on the GPU
#                                                 # machine (torch, transformers;
#                                                 # builds libmoert)
#   bench/run-torch-patch.sh [all] [--config FILE] [TOKENS...]    # both, on a
#                                                 # machine with everything
#
# TOKENS default to 2048 4096 8192 16384; 3000 (a bucket of 3072 rows) is
# always added to show bucketing. --config: a Qwen3-MoE config.json
# (hidden_size, moe_intermediate_size, num_experts, num_experts_per_tok,
# norm_topk_prob; default test/Models/Inputs/qwen3-30b-a3b-2layers.json,
# Qwen3-30B-A3B's); give the same one to prepare and run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir="$root/gpu-artifacts/torch-patch"
. "$root/bench/common.sh"
default_config="$root/test/Models/Inputs/qwen3-30b-a3b-2layers.json"
config=()
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --config) [ $# -ge 2 ] || { echo "run-torch-patch.sh: --config needs a file" >&2; exit 2; }
              config=(--config "$(realpath "$2")"); shift 2 ;;
    --config=*) config=(--config "$(realpath "${1#--config=}")"); shift ;;
    *) args+=("$1"); shift ;;
  esac
done
for f in "${config[@]:1}"; do
  [ -f "$f" ] || { echo "run-torch-patch.sh: no config file '$f'" >&2; exit 2; }
done
bench_args "2048 4096 8192 16384" "${args[@]}"

prepare() {
  "$root/scripts/build.sh"
  mkdir -p "$dir"
  local cfg=("${config[@]}")
  [ ${#cfg[@]} -gt 0 ] || cfg=(--config "$default_config")
  local recipes=(bf16)
  # MXFP8: blocks of 32 along the hidden and FFN dims (bench/torch_patch.py
  # leaves its rows out otherwise).
  "$root/.venv/bin/python" -c 'import json, sys; c = json.load(open(sys.argv[1]))
sys.exit(c["hidden_size"] % 32 or c["moe_intermediate_size"] % 32)' "${cfg[1]}" &&
    recipes+=(mxfp8)
  for recipe in "${recipes[@]}"; do
    local ts=("${tokens[@]}")
    [ "$recipe" = bf16 ] && ts+=(3000)
    echo "compile: patched block, recipe $recipe, tokens ${ts[*]} (sm_90a)"
    PYTHONPATH="$root/build/python_packages" "$root/.venv/bin/python" -m moe_mlir \
      torch-precompile "$dir" "${cfg[@]}" --tokens "${ts[@]}" --dtype bf16 \
      --recipe "$recipe" --target sm_90a
  done
}

run() { bench_python torch_patch.py "$dir" "${config[@]}" "${tokens[@]}"; }

bench_main
