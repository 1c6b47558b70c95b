#!/usr/bin/env bash
# The whole-model training table: moe-train's compiled train step (run by
# moert-train) beside transformers' Qwen3MoeForCausalLM (bench/train_peer.py:
# f32 weights under torch.autocast(bfloat16) and bf16 weights, grouped_mm
# experts, fused AdamW) in one GPU run, at Qwen3-30B-A3B's dimensions with
# LAYERS decoder layers, 1 x 4096 and 4 x 4096 tokens a step. Prints one
# line per run (tokens/s, MFU against the H200's 989 dense bf16 TFLOP/s,
# peak memory, the first step's loss: every run starts from the same
# parameters and data) and the step of one recipe split by stage
# (bench/profile_train.py).
#
#   bench/run-train.sh prepare [LAYERS...]  # here (MLIR): compile the steps
#   bench/run-train.sh run [LAYERS...]      # on the GPU machine (torch)
#   bench/run-train.sh [all] [LAYERS...]    # both
#
# LAYERS: decoder layer counts (default 2 4). MOE_TRAIN_RECIPES: the
# recipes compiled and run (default "bf16 mxfp8"; none is f32; a -lf
# suffix, as in bf16-lf, compiles with --layer-functions, -rc with
# --layer-functions --recompute, -lcN with --loss-chunk-rows N, -dense
# with the dense GEMMs and LM head in the recipe too, as in
# fp8-blockwise-dense);
# MOE_TRAIN_SHAPES: BATCHxSEQ shapes (default "1x4096 4x4096").
# MOE_TRAIN_STEPS: timed steps a run (default 6; the first is not counted).
# MOE_TRAIN_PEERS: bench/train_peer.py's configurations (default
# autocast-grouped,bf16-grouped; none runs ours alone).
# MOE_TRAIN_PROFILE: the recipe whose step (the last shape's) is split by
# stage (default bf16; 0: none).
# MOE_TRAIN_CURVE_STEPS=N: also train each recipe N steps (same
# initialization and data) and print the loss curves side by side, each
# against the first recipe's.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir="$root/gpu-artifacts/train-bench"
. "$root/bench/common.sh"
bench_args "2 4" "$@"
layers=("${tokens[@]}")
read -r -a recipes <<<"${MOE_TRAIN_RECIPES:-bf16 mxfp8}"
read -r -a shapes <<<"${MOE_TRAIN_SHAPES:-1x4096 4x4096}"
check_shapes MOE_TRAIN_SHAPES "${shapes[@]}"

config() { echo "$dir/qwen3-30b-a3b-$1layers.json"; }

prepare() {
  "$root/scripts/build.sh"
  train_data "$dir"
  for l in "${layers[@]}"; do
    qwen_layers_config "$l" >"$(config "$l")"
    for s in "${shapes[@]}"; do
      for r in "${recipes[@]}"; do
        local flags
        read -r -a flags <<<"$(recipe_flags "$r" | tr '\n' ' ')"
        echo "compile: $l layers, $s tokens, ${flags[*]}"
        "$root/build/bin/moe-train" --config "$(config "$l")" --batch "${s%x*}" \
          --seq "${s#*x}" --target sm_90a "${flags[@]}" \
          --compile-only --out "$dir/qwen-$l-$s-$r"
      done
    done
  done
}

# The loss curves of every recipe at LAYERS, SHAPE (MOE_TRAIN_CURVE_STEPS).
curves() {
  local runs=() r a
  echo "## loss curves, ${MOE_TRAIN_CURVE_STEPS} steps"
  for r in "${recipes[@]}"; do
    a="$dir/qwen-$1-$2-$r"
    [ -d "$a" ] || continue
    rm -rf "$w/curve-$r" && cp -r "$a" "$w/curve-$r"
    if "$rt/bin/moert-train" "$w/curve-$r"/train_step-sm_90a*.so "${data[@]}" \
      --steps "$MOE_TRAIN_CURVE_STEPS" --eval-every 0 --eval-batches 1 --checkpoint-every 0 \
      --out "$w/curve-$r" --progress none >"$w/curve-$r.log" 2>&1; then
      runs+=("$r=$w/curve-$r/metrics.jsonl")
    else
      echo "moe-mlir $(recipe_flags "$r" | tr '\n' ' '): failed"; tail -n 3 "$w/curve-$r.log"
    fi
    rm -f "$w/curve-$r"/checkpoint*
  done
  [ ${#runs[@]} -gt 0 ] || return 0
  python3 - "${runs[@]}" <<'PY'
import json, statistics, sys
curves = {}
for arg in sys.argv[1:]:
    name, path = arg.split("=", 1)
    curves[name] = [m["loss"] for m in map(json.loads, open(path)) if "loss" in m]
names = list(curves)
n = min(len(c) for c in curves.values())
window = max(1, n // 10)
print("steps      " + "".join(f"{r:>16s}" for r in names) + "   (mean loss of each window)")
for lo in range(0, n, window):
    hi = min(n, lo + window)
    print(f"{lo + 1:5d}-{hi:<5d}" + "".join(
        f"{statistics.mean(curves[r][lo:hi]):16.4f}" for r in names))
ref = statistics.mean(curves[names[0]][n - window:n])
for r in names[1:]:
    last = statistics.mean(curves[r][n - window:n])
    print(f"last {window} steps: {r} {last:.4f} against {names[0]} {ref:.4f}: "
          f"{100 * (last - ref) / ref:+.2f}%")
PY
}

run() {
  local rt=${MOE_RUNTIME_BUILD:-/tmp/moert-build} w=/tmp/moe-train-bench
  "$root/scripts/build-runtime.sh" "$rt"
  rm -rf "$w" && mkdir -p "$w"
  local data
  read -r -a data <<<"$(train_data_args "$dir")"
  echo "# Whole-model training on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date -u +%Y-%m-%d)"
  local largest=""
  for l in "${layers[@]}"; do
    for s in "${shapes[@]}"; do
      echo "## Qwen3-30B-A3B dims, $l layers, $s tokens"
      for r in "${recipes[@]}"; do
        local a="$dir/qwen-$l-$s-$r"
        [ -d "$a" ] || { echo "moe-mlir $(recipe_flags "$r" | tr '\n' ' '): not prepared ($a)"; continue; }
        cp -r "$a" "$w/"
        if "$rt/bin/moert-train" "$w/$(basename "$a")"/train_step-sm_90a*.so "${data[@]}" \
          --steps "${MOE_TRAIN_STEPS:-6}" --eval-every 0 --eval-batches 1 --checkpoint-every 0 \
          --out "$w/$(basename "$a")" --progress none >"$w/$(basename "$a").log" 2>&1; then
          python3 - "$w/$(basename "$a")" "moe-mlir $(recipe_flags "$r" | tr '\n' ' ')" $(( ${s%x*} * ${s#*x} )) <<'PY'
import json, statistics, sys
ms = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
st = [m for m in ms if "loss" in m]
st = st[1:] or st
tps = statistics.median(m["tokens_per_s"] for m in st)
tf = statistics.median(m["tflops"] for m in st)
reserved = max((m.get("memory_reserved_mib", 0) for m in st), default=0)
print(f"{sys.argv[2]:38s} {tps:12.0f} tokens/s {1e3 * int(sys.argv[3]) / tps:10.1f} ms/step "
      f"{max(m['memory_mib'] for m in st):10.0f} MiB peak  MFU {tf / 989:.1%}  ({tf / tps * 1e12:.4g} FLOP/token"
      + (f", {reserved:.0f} MiB reserved)" if reserved else ")")
      + f"  first loss {[m for m in ms if 'loss' in m][0]['loss']:.6f}")
PY
          [ "$r" = "${MOE_TRAIN_PROFILE:-bf16}" ] && largest="$w/$(basename "$a")"
        else
          echo "moe-mlir $(recipe_flags "$r" | tr '\n' ' '): failed"; tail -n 3 "$w/$(basename "$a").log"
        fi
        # The run's checkpoint (parameters and moments, 22 GB at 4 layers)
        # is not needed here; three of them filled the GPU machine's disk.
        rm -f "$w/$(basename "$a")"/checkpoint*
      done
      [ "${MOE_TRAIN_PEERS:-}" = none ] ||
        python3 "$root/bench/train_peer.py" "$(config "$l")" "${s%x*}" "${s#*x}" "${MOE_TRAIN_STEPS:-6}" \
          "${MOE_TRAIN_PEERS:-autocast-grouped,bf16-grouped}" 2>&1 | grep -v Warning || true
      [ -z "${MOE_TRAIN_CURVE_STEPS:-}" ] || curves "$l" "$s"
    done
  done
  local profile=${MOE_TRAIN_PROFILE:-bf16}
  [ -n "$largest" ] || [ "$profile" = 0 ] ||
    echo "no step by stage: MOE_TRAIN_PROFILE=$profile is not a recipe that ran (MOE_TRAIN_RECIPES: ${recipes[*]})"
  if [ -n "$largest" ]; then
    echo "## the step by stage: $(basename "$largest")"
    PYTHONPATH="$root/python" MOERT_LIBRARY="$rt/lib/libmoert.so" \
      python3 "$root/bench/profile_train.py" "$largest"/train_step-sm_90a*.so 12 2>&1 | grep -v Warning
  fi
}

bench_main
