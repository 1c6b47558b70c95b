#!/usr/bin/env bash
# GPU integration tests: every function of test/Integration/GPU/*.mlir runs on
# the GPU and on the CPU on the same fresh random inputs, and the results are
# compared (moert-check: integer and 8-bit results bit-identical, floats within
# each function's declared tolerance; device buffers poisoned before use).
#
#   scripts/gpu-check.sh prepare   # on a machine with MLIR: compile the tests
#                                  # (cpu and sm_90a) into gpu-artifacts/
#   scripts/gpu-check.sh run       # on a GPU machine (CUDA, no MLIR needed):
#                                  # build libmoert, run, print a table
#   scripts/gpu-check.sh           # both, on a machine that has everything
#   scripts/gpu-check.sh prepare fp8block attention
#                                  # only those test files (names without
#                                  # .mlir), and no torch parts; `run` then
#                                  # checks what was prepared
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
artifacts="$root/gpu-artifacts"
chip=${MOE_GPU_CHIP:-sm_90a}
mode=${1:-all}
[ $# -gt 0 ] && shift
only=("$@")
sources=()
if [ ${#only[@]} -gt 0 ]; then
  for name in "${only[@]}"; do
    [ -f "$root/test/Integration/GPU/$name.mlir" ] ||
      { echo "gpu-check.sh: no test file test/Integration/GPU/$name.mlir" >&2; exit 2; }
    sources+=("$root/test/Integration/GPU/$name.mlir")
  done
else
  sources=("$root"/test/Integration/GPU/*.mlir)
fi

prepare() {
  "$root/scripts/build.sh"
  "$root/scripts/build-runtime.sh" --vendor-json # nlohmann/json, for the GPU machine
  mkdir -p "$artifacts"
  [ ${#only[@]} -eq 0 ] || { compile_tests; return; }
  # moe_mlir.torch.patch's layers for test/Integration/GPU/torch_patch_gpu.py.
  echo "compile: the torch patch's layers (cpu; $chip, recipes none and bf16)"
  PYTHONPATH="$root/build/python_packages" "$root/.venv/bin/python" - "$artifacts/torch-patch-check" \
    "$chip" <<'PY'
import sys
import moe_mlir.torch as mt
out, chip = sys.argv[1], sys.argv[2]
for dtype, recipe, target in (("f32", "none", "cpu"), ("f32", "none", chip),
                              ("bf16", "bf16", chip)):
    mt.precompile(out, 128, 128, 8, 2, 200, dtype=dtype, recipe=recipe, target=target)
PY
  compile_tests
}

compile_tests() {
  for src in "${sources[@]}"; do
    name=$(basename "$src" .mlir)
    # A file's `// GPU-CHECK-FLAGS: ...` line: moe-compile flags for its GPU build.
    flags=$(sed -n 's|^// GPU-CHECK-FLAGS: *||p' "$src")
    # `// GPU-CHECK-PASSES: ...`: moe-opt passes run first (for both targets).
    passes=$(sed -n 's|^// GPU-CHECK-PASSES: *||p' "$src")
    input="$src"
    if [ -n "$passes" ]; then
      input="$artifacts/$name.input.mlir"
      # shellcheck disable=SC2086 # the passes are words
      "$root/build/bin/moe-opt" "$src" $passes -o "$input"
    fi
    echo "compile: $name (cpu, $chip${flags:+ $flags}${passes:+; after $passes})"
    "$root/build/bin/moe-compile" "$input" --target=cpu -o "$artifacts/$name.cpu.so"
    # shellcheck disable=SC2086 # the flags are words
    "$root/build/bin/moe-compile" "$input" --target="$chip" $flags -o "$artifacts/$name.$chip.so"
    # `// GPU-CHECK-VARIANT: NAME FLAGS...`: one more GPU build with those
    # flags, checked against the same CPU build (as NAME+VARIANT).
    while read -r variant vflags; do
      [ -n "$variant" ] || continue
      echo "compile: $name, variant $variant ($chip $flags $vflags)"
      cp -f "$artifacts/$name.cpu.so" "$artifacts/$name+$variant.cpu.so"
      # shellcheck disable=SC2086 # the flags are words
      "$root/build/bin/moe-compile" "$input" --target="$chip" $flags $vflags \
        -o "$artifacts/$name+$variant.$chip.so"
    done < <(sed -n 's|^// GPU-CHECK-VARIANT: *||p' "$src")
  done
}

run() {
  local rt=${MOE_RUNTIME_BUILD:-/tmp/moert-build}
  "$root/scripts/build-runtime.sh" "$rt"
  "$rt/bin/moert-gpu-info"
  # A fixed seed (MOE_SEED to change it), printed: a failure reproduces.
  local seed=${MOE_SEED:-20261202}
  echo "seed: $seed"
  local status=0
  for gpu in "$artifacts"/*."$chip".so; do
    name=$(basename "$gpu" ".$chip.so")
    echo "== $name"
    MOERT_POISON=1 "$rt/bin/moert-check" "$artifacts/$name.cpu.so" "$gpu" \
      --seed "$seed" || status=1
  done
  # CUDA torch tensors through the Python package (results without a copy).
  if [ -f "$artifacts/kernels.$chip.so" ]; then
    echo "== torch results"
    PYTHONPATH="$root/python" MOERT_LIBRARY="$rt/lib/libmoert.so" \
      python3 "$root/test/Integration/GPU/torch_results.py" "$artifacts/kernels.$chip.so" ||
      status=1
  fi
  # moe_mlir.torch.patch on the GPU against the CPU.
  if [ -d "$artifacts/torch-patch-check" ]; then
    echo "== torch patch"
    PYTHONPATH="$root/python" MOERT_LIBRARY="$rt/lib/libmoert.so" \
      python3 "$root/test/Integration/GPU/torch_patch_gpu.py" "$artifacts/torch-patch-check" || status=1
  fi
  return $status
}

case "$mode" in
  prepare) prepare ;;
  run) run ;;
  all) prepare; run ;;
  *) echo "usage: scripts/gpu-check.sh [prepare|run|all] [TEST...]" >&2; exit 2 ;;
esac
