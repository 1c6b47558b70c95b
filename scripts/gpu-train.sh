#!/usr/bin/env bash
# Training on a GPU beside transformers, in one run:
# - the small protein model (examples/protein-moe) trains with moert-train on
#   the GPU and on the CPU from the same initialization and batches (their
#   losses must agree step by step at the start);
# - a model of Qwen3-30B-A3B's dimensions (two layers) trains a few steps, in
#   f32 and in bf16 (--recipe bf16) at 1 x 512 tokens, and in bf16 at 1 x 4096;
# - transformers' own Qwen3-MoE of both configs trains with torch AdamW in
#   the same run (bench/train_peer.py): tokens/s and peak memory side by side.
#
#   scripts/gpu-train.sh prepare   # here (MLIR): compile the train steps and
#                                  # copy the sequences into gpu-artifacts/train
#   scripts/gpu-train.sh run       # on the GPU machine (CUDA, torch, no MLIR)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir="$root/gpu-artifacts/train"
chip=${MOE_GPU_CHIP:-sm_90a}
mode=${1:-all}
protein="$root/examples/protein-moe/config.json"
qwen="$root/test/Models/Inputs/qwen3-30b-a3b-2layers.json"
pb=8 ps=128 qb=1 qs=512 ls=4096

prepare() {
  "$root/scripts/build.sh"
  "$root/scripts/build-runtime.sh" --vendor-json # nlohmann/json, for the GPU machine
  mkdir -p "$dir/data"
  cp /usr/share/doc/hmmer/examples/tutorial/{Pkinase.sto,fn3.sto,globins45.fa} "$dir/data/"
  for t in cpu "$chip"; do
    "$root/build/bin/moe-train" --config "$protein" --batch $pb --seq $ps --target "$t" \
      --compile-only --out "$dir/protein"
  done
  for recipe in none bf16; do
    "$root/build/bin/moe-train" --config "$qwen" --batch $qb --seq $qs --target "$chip" \
      --recipe $recipe --compile-only --out "$dir/qwen-$recipe"
  done
  "$root/build/bin/moe-train" --config "$qwen" --batch 1 --seq $ls --target "$chip" \
    --recipe bf16 --compile-only --out "$dir/qwen-bf16-$ls"
}

run() {
  local rt=${MOE_RUNTIME_BUILD:-/tmp/moert-build}
  "$root/scripts/build-runtime.sh" "$rt"
  local data=(--data "$dir/data/Pkinase.sto" --data "$dir/data/fn3.sto" --data "$dir/data/globins45.fa")
  local steps=${MOE_TRAIN_STEPS:-100} qsteps=${MOE_QWEN_STEPS:-4}
  local w=/tmp/moe-train-runs
  rm -rf "$w" && mkdir -p "$w"
  for t in "$chip" cpu; do
    cp -r "$dir/protein" "$w/protein-$t"
    "$rt/bin/moert-train" "$w/protein-$t/train_step-$t.so" "${data[@]}" --steps "$steps" \
      --eval-every 50 --out "$w/protein-$t" --progress none
  done
  for recipe in none bf16 "bf16-$ls"; do
    cp -r "$dir/qwen-$recipe" "$w/qwen-$recipe"
    "$rt/bin/moert-train" "$w/qwen-$recipe"/train_step-"$chip"*.so "${data[@]}" --steps "$qsteps" \
      --eval-every 0 --eval-batches 1 --checkpoint-every 0 --out "$w/qwen-$recipe" --progress none
  done
  echo
  echo "# Training on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date -u +%Y-%m-%d)"
  python3 - "$w" "$chip" "$steps" <<'PY'
import json, statistics, sys
w, chip, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
def load(d):
    return [json.loads(l) for l in open(f"{w}/{d}/metrics.jsonl")]
gpu, cpu = load(f"protein-{chip}"), load("protein-cpu")
gl = [m["loss"] for m in gpu if "loss" in m]; cl = [m["loss"] for m in cpu if "loss" in m]
first = max(abs(a - b) / abs(b) for a, b in zip(gl[:10], cl[:10]))
print(f"protein model, GPU vs CPU from the same start: first 10 losses agree to {first:.1e} relative;"
      f" step {steps}: GPU {gl[-1]:.4f}, CPU {cl[-1]:.4f}")
for d in (f"protein-{chip}", "protein-cpu", "qwen-none", "qwen-bf16", "qwen-bf16-4096"):
    ms = load(d)
    st = [m for m in ms if "loss" in m][1:] or [m for m in ms if "loss" in m]
    ev = [m for m in ms if "held_out_loss" in m]
    tps = statistics.median(m["tokens_per_s"] for m in st)
    tf = statistics.median(m["tflops"] for m in st)
    mem = max(m["memory_mib"] for m in st)
    held = f"held-out {ev[-1]['held_out_loss']:.4f} (unigram {ev[-1]['unigram_loss']:.4f})" if ev else ""
    print(f"moe-mlir {d:28s} {tps:12.0f} tokens/s {tf:8.3f} TFLOP/s {mem:10.0f} MiB peak"
          f"  loss {st[0]['loss']:.3f} -> {st[-1]['loss']:.3f} {held}")
PY
  # Where the Qwen-size step's time goes, kernel by kernel.
  echo "## profile: Qwen3-30B-A3B dims, 2 layers, bf16 (batch 1 x $ls)"
  PYTHONPATH="$root/python" MOERT_LIBRARY="$rt/lib/libmoert.so" \
    python3 "$root/bench/profile_train.py" "$dir/qwen-bf16-$ls/train_step-$chip-bf16.so" 25
  echo "## transformers, protein config (batch $pb x $ps)"
  python3 "$root/bench/train_peer.py" "$protein" $pb $ps 10
  echo "## transformers, Qwen3-30B-A3B dims, 2 layers (batch $qb x $qs)"
  python3 "$root/bench/train_peer.py" "$qwen" $qb $qs 4
  echo "## transformers, Qwen3-30B-A3B dims, 2 layers (batch 1 x $ls)"
  python3 "$root/bench/train_peer.py" "$qwen" 1 $ls 4
}

case "$mode" in
  prepare) prepare ;;
  run) run ;;
  all) prepare; run ;;
  *) echo "usage: scripts/gpu-train.sh [prepare|run]" >&2; exit 2 ;;
esac
