#!/usr/bin/env bash
# Expert parallelism on 2 GPUs with NCCL: a MoE layer sharded over 2 ranks
# (one process per GPU, tokens exchanged by libmoert's NCCL backend) against
# the same layer on one GPU with every expert.
#
#   scripts/gpu-ep-check.sh prepare   # on a machine with MLIR (this one):
#                                     # compile the layers to gpu-artifacts/ep/
#   scripts/gpu-ep-check.sh run       # on a machine with 2 GPUs, CUDA, NCCL
#                                     # and MPI (no MLIR): build libmoert, run
#   scripts/gpu-ep-check.sh           # both
#   scripts/gpu-ep-check.sh faults    # (2 GPUs) a rank that stalls or dies
#                                     # inside an NCCL exchange ends the job
#
# The layers (router, dispatch, SwiGLU experts, combine; f32), each compiled
# for sm_90a as written and after -moe-expert-parallel=ep-size=2:
#   small   24 tokens a rank, hidden 32, 8 experts, top-2 (a quick sanity run)
#   qwen3   Qwen3-30B-A3B's MoE block: hidden 2048, 128 experts, top-8,
#           expert FFN 768 (norm_topk_prob); MOE_EP_TOKENS tokens a rank
#           (default 512)
#   qwen3_train  its train step (loss sum(layer * dy), -moe-autodiff; at
#           EP=2 sharded before and after): loss, token and expert-weight
#           gradients; MOE_EP_TRAIN_TOKENS tokens a rank (default 2048)
#   overlap the qwen3 block in MXFP8 (-moe-train-pipeline recipe=mxfp8,
#           Hopper kernels), MOE_EP_OVERLAP_TOKENS tokens a rank (16384),
#           at EP=2: one chunk, and for each of MOE_EP_CHUNKS ("2 4")
#           that many chunks with MOERT_COMM_OVERLAP=0 (every exchange
#           blocking) and overlapped; a table of layer time and the time the
#           program waits on exchanges (started + waited), each checked
#           against the 1-GPU layer bit for bit
#
# `run` builds libmoert (cmake -S runtime) and then, with NCCL_NVLS_ENABLE=0:
#   1. moert-comm-test device: every collective of libmoert on device
#      buffers, through NCCL (mpirun; a torchrun-style launch whose NCCL id
#      goes through the TCP store at MASTER_ADDR:MASTER_PORT) and through MPI
#      with host staging (MOERT_COMM_BACKEND=mpi);
#   2. moert-ep-check on each layer, launched both ways: every rank takes its
#      slice of the tokens and half of the experts (rank r: experts
#      [64r, 64r+64) of qwen3's 128) on GPU r, compares with the single-GPU
#      layer on the same tokens (bit for bit), and prints `rank r: ok` or
#      the mismatches, the time per layer call at EP=2 and on 1 GPU, and
#      each GPU's expert-weight memory (half at EP=2).
# The last lines summarize; the exit status is non-zero on any failure.
#
# Variables: MOE_GPU_CHIP (sm_90a), MOE_EP_TOKENS (512), MOE_EP_TRAIN_TOKENS
# (2048), MOE_EP_OVERLAP_TOKENS (16384), MOE_EP_CHUNKS ("2 4"), MOE_EP_LAYERS
# (small qwen3 qwen3_train overlap), MOE_SEED (1),
# MOE_RUNTIME_BUILD (/tmp/moert-build), MOERT_NCCL_LIBRARY (found if unset:
# the system's libnccl.so.2, else PyTorch's nvidia-nccl wheel),
# MOERT_COMM_TIMEOUT (120 here), MOE_EP_REPEAT (timed calls, 10).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
artifacts="$root/gpu-artifacts/ep"
chip=${MOE_GPU_CHIP:-sm_90a}
tokens=${MOE_EP_TOKENS:-512}
train_tokens=${MOE_EP_TRAIN_TOKENS:-2048}
overlap_tokens=${MOE_EP_OVERLAP_TOKENS:-16384}
chunks=${MOE_EP_CHUNKS:-"2 4"}
mode=${1:-all}
layers=${MOE_EP_LAYERS:-"small qwen3 qwen3_train overlap"}

# A MoE layer as MLIR: name T H E F K [loss]. With `loss`, the function is
# the loss sum(layer(x) * dy) of a fixed gradient dy (for -moe-autodiff).
layer_mlir() {
  PYTHONPATH="$root/python" python3 - "$@" <<'PY'
import sys
from moe_mlir.layers import as_loss
name, T, H, E, F, K = sys.argv[1], *map(int, sys.argv[2:7])
loss = len(sys.argv) > 7 and sys.argv[7] == "loss"
rows = T * K
text = f"""// {name}: {T} tokens, hidden {H}, {E} experts of FFN {F}, top-{K}
func.func @{name}(%x: tensor<{T}x{H}xf32>, %logits: tensor<{T}x{E}xf32>,
    %w1: tensor<{E}x{H}x{2*F}xf32>, %w2: tensor<{E}x{F}x{H}xf32>) -> tensor<{T}x{H}xf32> {{
  %idx, %w = moe.router %logits top_k({K}) softmax norm_topk_prob
      : tensor<{T}x{E}xf32> -> tensor<{T}x{K}xi32>, tensor<{T}x{K}xf32>
  %s, %o, %c, %p = moe.dispatch %x, %idx experts({E})
      : tensor<{T}x{H}xf32>, tensor<{T}x{K}xi32> -> tensor<{rows}x{H}xf32>, tensor<{E+1}xi32>, tensor<{E}xi32>, tensor<{T}x{K}xi32>
  %h = moe.grouped_matmul %s, %w1, %o : tensor<{rows}x{H}xf32>, tensor<{E}x{H}x{2*F}xf32>, tensor<{E+1}xi32> -> tensor<{rows}x{2*F}xf32>
  %a = moe.swiglu %h : tensor<{rows}x{2*F}xf32> -> tensor<{rows}x{F}xf32>
  %y = moe.grouped_matmul %a, %w2, %o : tensor<{rows}x{F}xf32>, tensor<{E}x{F}x{H}xf32>, tensor<{E+1}xi32> -> tensor<{rows}x{H}xf32>
  %out = moe.combine %y, %w, %p : tensor<{rows}x{H}xf32>, tensor<{T}x{K}xf32>, tensor<{T}x{K}xi32> -> tensor<{T}x{H}xf32>
  return %out : tensor<{T}x{H}xf32>
}}"""
print(as_loss(text, name, T, H) if loss else text)
PY
}

prepare() {
  "$root/scripts/build-runtime.sh" --vendor-json # nlohmann/json, for the GPU machine
  if [ -f "$root/build/build.ninja" ]; then
    flock /tmp/moe-build.lock ninja -C "$root/build" -j"${MOE_JOBS:-2}" >/tmp/moe-ep-ninja.log 2>&1 ||
      { grep -E "error|FAILED" -A3 /tmp/moe-ep-ninja.log | head -40; exit 1; }
  else
    "$root/scripts/build.sh"
  fi
  mkdir -p "$artifacts"
  layer_mlir small 24 32 8 32 2 >"$artifacts/small.mlir"
  layer_mlir qwen3 "$tokens" 2048 128 768 8 >"$artifacts/qwen3.mlir"
  layer_mlir qwen3_train "$train_tokens" 2048 128 768 8 loss >"$artifacts/qwen3_train.mlir"
  for name in $layers; do
    if [ "$name" = overlap ]; then
      layer_mlir qwen3_overlap "$overlap_tokens" 2048 128 768 8 >"$artifacts/overlap.mlir"
      local variant passes
      local c variants=(single ep2)
      for c in $chunks; do variants+=("ep2c$c"); done
      for variant in "${variants[@]}"; do
        case $variant in
          single) passes="ep-size=1 recipe=mxfp8" ;;
          ep2) passes="ep-size=2 recipe=mxfp8" ;;
          *) passes="ep-size=2 ep-chunks=${variant#ep2c} recipe=mxfp8" ;;
        esac
        "$root/build/bin/moe-opt" "$artifacts/overlap.mlir" --moe-train-pipeline="$passes" \
          -o "$artifacts/overlap.$variant.mlir"
        echo "compile: overlap $variant (moe-train-pipeline $passes; $chip)"
        "$root/build/bin/moe-compile" "$artifacts/overlap.$variant.mlir" --target="$chip" \
          -o "$artifacts/overlap.$variant.$chip.so"
      done
      continue
    fi
    src="$artifacts/$name.mlir"
    local single_passes=() ep_passes=(--moe-expert-parallel=ep-size=2)
    if [ "$name" = qwen3_train ]; then
      # The train step: forward and backward (the backward's exchanges are
      # the reverse all_to_alls -moe-autodiff derives).
      single_passes=(--moe-autodiff)
      ep_passes=(--moe-expert-parallel=ep-size=2 --moe-autodiff --moe-expert-parallel=ep-size=2)
    fi
    "$root/build/bin/moe-opt" "$src" "${single_passes[@]}" -o "$artifacts/$name.single.mlir"
    "$root/build/bin/moe-opt" "$src" "${ep_passes[@]}" -o "$artifacts/$name.ep2.mlir"
    echo "compile: $name (1 GPU, EP=2; $chip)"
    "$root/build/bin/moe-compile" "$artifacts/$name.single.mlir" --target="$chip" \
      -o "$artifacts/$name.single.$chip.so"
    "$root/build/bin/moe-compile" "$artifacts/$name.ep2.mlir" --target="$chip" \
      -o "$artifacts/$name.ep2.$chip.so"
  done
  ls -l "$artifacts"/*.so
}

# libnccl: the system's, else the one in PyTorch's nvidia-nccl wheel.
find_nccl() {
  [ -n "${MOERT_NCCL_LIBRARY:-}" ] && return 0
  # (grep without -q: an early exit would fail the pipe under pipefail)
  if ldconfig -p 2>/dev/null | grep 'libnccl\.so\.2 ' >/dev/null; then
    return 0
  fi
  local lib
  lib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null || true)
  if [ -n "$lib" ] && [ -f "$lib" ]; then
    export MOERT_NCCL_LIBRARY="$lib"
    return 0
  fi
  for lib in /usr/lib/x86_64-linux-gnu/libnccl.so.2 /usr/local/cuda/lib64/libnccl.so.2 \
             /usr/local/cuda/lib/libnccl.so.2; do
    [ -f "$lib" ] && { export MOERT_NCCL_LIBRARY="$lib"; return 0; }
  done
  echo "gpu-ep-check: no libnccl.so.2 found; set MOERT_NCCL_LIBRARY" >&2
  return 1
}

results=()
record() { # label status
  results+=("$(printf '%-58s %s' "$1" "$([ "$2" = 0 ] && echo ok || echo "FAILED (exit $2)")")")
  [ "$2" = 0 ] || status=1
}

# Two ranks through mpirun (NCCL's id travels through MPI).
launch_mpi() {
  local vars=(-x NCCL_NVLS_ENABLE -x MOERT_COMM_TIMEOUT)
  for v in MOERT_NCCL_LIBRARY MOERT_COMM_BACKEND NCCL_DEBUG MOERT_TEST_FAULT_AT \
           MOERT_TEST_STALL_SECONDS MOERT_TEST_STALL_RANK MOERT_TEST_FAIL_RANK; do
    [ -n "${!v:-}" ] && vars+=(-x "$v")
  done
  timeout -k 10 900 mpirun --allow-run-as-root --oversubscribe --bind-to none \
    -np 2 "${vars[@]}" "$@"
}

# Two ranks started like torchrun does (RANK, WORLD_SIZE, LOCAL_RANK,
# MASTER_ADDR, MASTER_PORT): NCCL's id travels through libmoert's TCP store.
launch_env() {
  local port=$((29500 + RANDOM % 2000)) pids=() rc=0 r
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      timeout -k 10 900 "$@" >"/tmp/gpu-ep-check.rank$r.log" 2>&1 &
    pids+=($!)
  done
  for r in 0 1; do wait "${pids[$r]}" || rc=$?; done
  cat /tmp/gpu-ep-check.rank0.log /tmp/gpu-ep-check.rank1.log
  return $rc
}

build_runtime() {
  local rt=$1
  echo "== build libmoert ($rt)"
  "$root/scripts/build-runtime.sh" "$rt"
  grep -E "libmoert: (MPI|no MPI)" /tmp/moert-cmake.log || true
}

# A stalled or dead rank at an NCCL exchange: the others stop after
# MOERT_COMM_TIMEOUT (5 s here) with a message naming the rank and the
# collective, or when NCCL reports the peer gone; the job ends, non-zero.
faults() {
  local rt=${MOE_RUNTIME_BUILD:-/tmp/moert-build}
  build_runtime "$rt"
  export NCCL_NVLS_ENABLE=0 MOERT_COMM_TIMEOUT=5
  find_nccl
  status=0
  # (collective #2: #1 of the MPI communicator is NCCL's bootstrap)
  export MOERT_TEST_FAULT_AT=2 MOERT_TEST_STALL_SECONDS=15
  local case launcher rc start took
  for case in stall fail; do
    for launcher in launch_mpi launch_env; do
      [ $launcher = launch_mpi ] && ! command -v mpirun >/dev/null && continue
      echo "== rank 1 ${case}s at all_to_all #2 ($launcher)"
      start=$(date +%s)
      rc=0
      if [ $case = stall ]; then
        MOERT_TEST_STALL_RANK=1 $launcher "$rt/bin/moert-comm-test" device \
          >/tmp/gpu-ep-faults.log 2>&1 || rc=$?
      else
        MOERT_TEST_FAIL_RANK=1 $launcher "$rt/bin/moert-comm-test" device \
          >/tmp/gpu-ep-faults.log 2>&1 || rc=$?
      fi
      took=$(($(date +%s) - start))
      grep -E "^moert: rank" /tmp/gpu-ep-faults.log | head -6
      # Ended, non-zero, long before the 900 s guard, with a message.
      if [ $rc -ne 0 ] && [ $took -lt 120 ] &&
         grep -E "timed out after 5 s|NCCL failed|MOERT_TEST_FAIL_RANK" /tmp/gpu-ep-faults.log >/dev/null; then
        record "rank 1 ${case}s ($launcher): job ended in ${took} s, exit $rc" 0
      else
        tail -20 /tmp/gpu-ep-faults.log
        record "rank 1 ${case}s ($launcher): exit $rc after ${took} s" 1
      fi
    done
  done
  echo "== summary"
  printf '%s\n' "${results[@]}"
  return $status
}

# The overlap measurement: the MXFP8 qwen3 block at EP=2 with one chunk,
# with chunks whose exchanges block, and with the chunks overlapped.
overlap_table() {
  local rt=$1 seed=$2 repeat=$3 have_mpi=$4
  local single="$artifacts/overlap.single.$chip.so" rows=() variant rc log
  local launcher=launch_env
  [ "$have_mpi" = 1 ] && launcher=launch_mpi
  local c variants=("ep2:1")
  for c in $chunks; do variants+=("ep2c$c:0" "ep2c$c:1"); done
  for variant in "${variants[@]}"; do
    local so="$artifacts/overlap.${variant%%:*}.$chip.so" flag=${variant##*:}
    if [ ! -f "$single" ] || [ ! -f "$so" ]; then
      echo "gpu-ep-check: $single or $so missing: run 'scripts/gpu-ep-check.sh prepare' first" >&2
      exit 1
    fi
    echo "== overlap: ${variant%%:*}, MOERT_COMM_OVERLAP=$flag ($launcher)"
    log=/tmp/gpu-ep-overlap.log
    rc=0
    MOERT_COMM_OVERLAP=$flag $launcher "$rt/bin/moert-ep-check" "$single" "$so" \
      --seed "$seed" --repeat "$repeat" >"$log" 2>&1 || rc=$?
    grep -E "time per|collectives per|check on" "$log" || tail -20 "$log"
    record "overlap ${variant%%:*} MOERT_COMM_OVERLAP=$flag (bit-identical to 1 GPU)" $rc
    local single_ms ep_ms wait_ms
    single_ms=$(sed -n 's/.*slowest rank: \([0-9.]*\) ms on 1 GPU.*/\1/p' "$log" | head -1)
    ep_ms=$(sed -n 's/.*every expert, \([0-9.]*\) ms at EP=2.*/\1/p' "$log" | head -1)
    wait_ms=$(sed -n 's/^rank [0-9]*: .*collectives per expert-parallel call: .* all_to_all, \([0-9.]*\) ms in all.*/\1/p' "$log" |
              sort -g | tail -1)
    local gbs tput
    gbs=$(sed -n 's/^rank [0-9]*: .*collectives per expert-parallel call: .*(\([0-9.]*\) GB\/s over.*/\1/p' "$log" |
          sort -g | head -1)
    # Tokens a second: one GPU's tokens, or both GPUs' at EP=2.
    tput=$(awk -v t="$overlap_tokens" -v s="${single_ms:-0}" -v e="${ep_ms:-0}" 'BEGIN {
      if (s > 0 && e > 0) printf "%10.0f %12.0f %8.2fx", t / s * 1000, 2 * t / e * 1000, 2 * s / e
      else printf "%10s %12s %9s", "?", "?", "?" }')
    rows+=("$(printf '%-8s %-7s %9s %9s %s %9s %8s' "${variant%%:*}" "$flag" "${single_ms:-?}" "${ep_ms:-?}" "$tput" "${wait_ms:-?}" "${gbs:-?}")")
  done
  echo "== overlap table: qwen3 MXFP8 block, $overlap_tokens tokens a GPU, EP=2 (tokens/s: one GPU's, both GPUs' at EP=2; wait: the slowest rank's time in exchanges; GB/s: to the other rank over that time)"
  printf '%-8s %-7s %9s %9s %10s %12s %9s %9s %8s\n' program overlap "1GPU ms" "EP=2 ms" "1GPU tok/s" "EP=2 tok/s" "EP/1GPU" "wait ms" "GB/s"
  printf '%s\n' "${rows[@]}"
}

run() {
  local rt=${MOE_RUNTIME_BUILD:-/tmp/moert-build} seed=${MOE_SEED:-1}
  local repeat=${MOE_EP_REPEAT:-10}
  build_runtime "$rt"
  export NCCL_NVLS_ENABLE=0 MOERT_COMM_TIMEOUT=${MOERT_COMM_TIMEOUT:-120}
  find_nccl
  echo "NCCL: ${MOERT_NCCL_LIBRARY:-libnccl.so.2 from the system}"
  "$rt/bin/moert-gpu-info"
  local gpus
  gpus=$("$rt/bin/moert-gpu-info" | awk '/^gpus:/ {print $2}')
  if [ "${gpus:-0}" -lt 2 ]; then
    echo "gpu-ep-check: needs 2 GPUs, found ${gpus:-0}" >&2
    exit 1
  fi
  local have_mpi=0
  if command -v mpirun >/dev/null &&
     nm -D "$rt/lib/libmoert.so" 2>/dev/null | grep MPI_Init_thread >/dev/null; then
    have_mpi=1
  else
    echo "(no mpirun, or libmoert built without MPI: only the torchrun-style launches run)"
  fi
  status=0
  local rc
  echo "== collectives on device buffers: moert-comm-test device"
  if [ $have_mpi = 1 ]; then
    rc=0; launch_mpi "$rt/bin/moert-comm-test" device || rc=$?
    record "collectives, NCCL (mpirun)" $rc
    rc=0; MOERT_COMM_BACKEND=mpi launch_mpi "$rt/bin/moert-comm-test" device || rc=$?
    record "collectives, MPI through host memory (mpirun)" $rc
  fi
  rc=0; launch_env "$rt/bin/moert-comm-test" device || rc=$?
  record "collectives, NCCL (torchrun-style, TCP store)" $rc
  for name in $layers; do
    if [ "$name" = overlap ]; then
      overlap_table "$rt" "$seed" "$repeat" "$have_mpi"
      continue
    fi
    local single="$artifacts/$name.single.$chip.so" ep="$artifacts/$name.ep2.$chip.so"
    if [ ! -f "$single" ] || [ ! -f "$ep" ]; then
      echo "gpu-ep-check: $single or $ep missing: run 'scripts/gpu-ep-check.sh prepare' first" >&2
      exit 1
    fi
    local args=("$single" "$ep" --seed "$seed" --repeat "$repeat")
    if [ $have_mpi = 1 ]; then
      echo "== $name: EP=2 vs 1 GPU (mpirun -np 2; NCCL, its id through MPI)"
      rc=0; launch_mpi "$rt/bin/moert-ep-check" "${args[@]}" || rc=$?
      record "$name EP=2 vs 1 GPU (mpirun)" $rc
    fi
    echo "== $name: EP=2 vs 1 GPU (torchrun-style; NCCL, its id through the TCP store)"
    rc=0; launch_env "$rt/bin/moert-ep-check" "${args[@]}" || rc=$?
    record "$name EP=2 vs 1 GPU (torchrun-style)" $rc
  done
  # NCCL's own all-to-all in the same run (PyTorch's, when it is there), at
  # the byte counts of the qwen3 layer's exchanges and beyond.
  if python3 -c "import torch.distributed" 2>/dev/null; then
    echo "== NCCL all_to_all_single through torch.distributed, 2 GPUs"
    rc=0; python3 -m torch.distributed.run --nproc_per_node=2 --master_port=$((31500 + RANDOM % 1000)) \
      "$root/bench/nccl_all_to_all.py" 2>&1 | grep -v "^W\|OMP_NUM_THREADS\|^\*" || rc=$?
    record "NCCL all_to_all_single (torch)" $rc
  fi
  echo "== summary"
  printf '%s\n' "${results[@]}"
  return $status
}

case "$mode" in
  prepare) prepare ;;
  run) run ;;
  faults) faults ;;
  all) prepare; run ;;
  *) echo "usage: scripts/gpu-ep-check.sh [prepare|run|faults]" >&2; exit 2 ;;
esac
