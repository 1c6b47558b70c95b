#!/usr/bin/env bash
# Whole-model training on several GPUs: moe-train's train step compiled for
# 1 rank and for N expert-parallel ranks (--ep-size N), run by moert-train
# under mpirun on 1 and N GPUs of this machine, at Qwen3-30B-A3B's
# dimensions with LAYERS decoder layers. Prints one line per run (tokens/s
# in all and per GPU, MFU against the H200's 989 dense bf16 TFLOP/s, the
# first rank's peak GPU memory), the speedup over one GPU, and NCCL's
# all-to-all and all-reduce bandwidth in the same job
# (bench/nccl_all_to_all.py).
#
#   bench/run-train-ranks.sh prepare [LAYERS...]  # here (MLIR): compile the steps
#   bench/run-train-ranks.sh run [LAYERS...]      # on the GPU machine
#   bench/run-train-ranks.sh [all] [LAYERS...]    # both
#
# LAYERS: decoder layer counts (default 4). MOE_TRAIN_RANKS: the rank
# counts besides 1 (default "2"; "2 8" on 8 GPUs; a count above the GPUs
# of the machine is skipped); MOE_TRAIN_RECIPE: bf16 (default) or mxfp8,
# with a -lf suffix for --layer-functions (the 48-layer model), -rc for
# --layer-functions --recompute (what 48 layers need to fit);
# MOE_TRAIN_SHAPE: BATCHxSEQ per rank (default 4x4096); MOE_TRAIN_STEPS
# (default 6; the first is not counted); MOE_TRAIN_DP: data-parallel copies
# (default 1): N ranks are --dp-size MOE_TRAIN_DP --ep-size N/MOE_TRAIN_DP;
# MOE_TRAIN_BASELINE=0 leaves out the one-GPU run (a model that does not fit
# one GPU, such as the 48 layers).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir="$root/gpu-artifacts/train-ranks"
. "$root/bench/common.sh"
bench_args "4" "$@"
layers=("${tokens[@]}")
read -r -a counts <<<"${MOE_TRAIN_RANKS:-2}"
recipe=${MOE_TRAIN_RECIPE:-bf16}
shape=${MOE_TRAIN_SHAPE:-4x4096}
check_shapes MOE_TRAIN_SHAPE "$shape"
dp=${MOE_TRAIN_DP:-1}
[[ "$dp" =~ ^[1-9][0-9]*$ ]] ||
  { echo "run-train-ranks: MOE_TRAIN_DP takes a positive integer, got '$dp'" >&2; exit 2; }
for n in "${counts[@]}"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] ||
    { echo "run-train-ranks: MOE_TRAIN_RANKS takes positive integers, got '$n'" >&2; exit 2; }
  (( n % dp == 0 )) ||
    { echo "run-train-ranks: $n ranks are not MOE_TRAIN_DP=$dp copies of a group" >&2; exit 2; }
done
case "${MOE_TRAIN_BASELINE:-1}" in
  1) with_one=(1 "${counts[@]}") ;;
  0) with_one=("${counts[@]}") ;;
  *) echo "run-train-ranks: MOE_TRAIN_BASELINE is 0 or 1, got '$MOE_TRAIN_BASELINE'" >&2; exit 2 ;;
esac
config() { echo "$dir/qwen3-30b-a3b-$1layers.json"; }

prepare() {
  "$root/scripts/build.sh"
  train_data "$dir"
  for l in "${layers[@]}"; do
    qwen_layers_config "$l" >"$(config "$l")"
    local flags
    read -r -a flags <<<"$(recipe_flags "$recipe" | tr '\n' ' ')"
    for n in "${with_one[@]}"; do
      local d=$(( n > 1 ? dp : 1 ))
      echo "compile: $l layers, $shape tokens a rank, ${flags[*]} --dp-size $d --ep-size $(( n / d ))"
      "$root/build/bin/moe-train" --config "$(config "$l")" --batch "${shape%x*}" \
        --seq "${shape#*x}" --target sm_90a "${flags[@]}" \
        --dp-size "$d" --ep-size $(( n / d )) --compile-only --out "$dir/qwen-$l-ranks$n"
    done
  done
}

run() {
  local rt=${MOE_RUNTIME_BUILD:-/tmp/moert-build} w=/tmp/moe-train-ranks
  "$root/scripts/build-runtime.sh" "$rt"
  rm -rf "$w" && mkdir -p "$w"
  local gpus mpi=(mpirun) data
  read -r -a data <<<"$(train_data_args "$dir")"
  gpus=$(nvidia-smi --list-gpus | wc -l)
  [ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)
  echo "# Whole-model training on $gpus x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date -u +%Y-%m-%d)"
  for l in "${layers[@]}"; do
    echo "## Qwen3-30B-A3B dims, $l layers, $shape tokens a rank, --recipe $recipe"
    local one=""
    for n in "${with_one[@]}"; do
      local a="$dir/qwen-$l-ranks$n" o="$w/qwen-$l-ranks$n"
      [ -d "$a" ] || { echo "$n ranks: not prepared ($a)"; continue; }
      [ "$n" -le "$gpus" ] || { echo "$n ranks: skipped ($gpus GPUs here)"; continue; }
      mkdir -p "$o"
      if "${mpi[@]}" -np "$n" "$rt/bin/moert-train" "$a"/train_step-sm_90a*.so "${data[@]}" \
        --steps "${MOE_TRAIN_STEPS:-6}" --eval-every 0 --eval-batches 1 --checkpoint-every 0 \
        --out "$o" --progress none >"$o.log" 2>&1; then
        one=$(python3 - "$o" "$n" "$(( ${shape%x*} * ${shape#*x} ))" "$one" <<'PY'
import json, statistics, sys
ms = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl") if '"loss"' in l]
ms = ms[1:] or ms
n, one = int(sys.argv[2]), sys.argv[4]
tps = statistics.median(m["tokens_per_s"] for m in ms)
tf = statistics.median(m["tflops"] for m in ms)
speed = f"  {tps / float(one):.2f}x one GPU" if one else ""
print(f"{n} GPU{'s' if n > 1 else ' '} {tps:10.0f} tokens/s {tps / n:10.0f} /GPU "
      f"{1e3 * int(sys.argv[3]) * n / tps:8.1f} ms/step {max(m['memory_mib'] for m in ms):8.0f} "
      f"MiB peak (rank 0)  MFU {tf / n / 989:.1%}{speed}", file=sys.stderr)
print(one or tps)
PY
)
      else
        echo "$n ranks: failed"; tail -n 5 "$o.log"
      fi
      # Checkpoints are not needed here.
      rm -f "$o"/checkpoint*
    done
  done
  if [ "$gpus" -gt 1 ]; then
    python3 -m torch.distributed.run --nproc_per_node="$gpus" "$root/bench/nccl_all_to_all.py" 2>&1 |
      grep -v Warning || true
  fi
}

bench_main
