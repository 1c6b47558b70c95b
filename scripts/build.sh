#!/usr/bin/env bash
# Sets up (scripts/setup.sh), configures and builds moe-mlir into ./build.
#
#   scripts/build.sh              # ./build: Release, everything
#   scripts/build.sh --sanitized  # ./build-fuzz: AddressSanitizer,
#                                 # UndefinedBehaviorSanitizer and libFuzzer
#                                 # coverage; the tools, libmoert and its test
#                                 # programs, the fuzzers (not the Python
#                                 # extension: python3 is not sanitized)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build"
extra=()
targets=()
case "${1:-}" in
  "") ;;
  --sanitized)
    build="$root/build-fuzz"
    extra=(-DLLVM_USE_SANITIZER="Address;Undefined" -DLLVM_USE_SANITIZE_COVERAGE=ON)
    targets=(moe-opt moe-compile moe-model moe-train moert moert-train moert-train-test
             moert-check moert-allocator-test moert-gpu-info moert-seq-info moert-comm-test
             moert-ep-check moert-store-test moert-not-nccl moe-ir-fuzzer moe-reader-fuzzer) ;;
  *) echo "usage: scripts/build.sh [--sanitized]" >&2; exit 2 ;;
esac
"$root/scripts/setup.sh"
llvm=/usr/lib/llvm-22
name=$(basename "$build")
if [ ! -f "$build/build.ninja" ]; then
  echo "build: configuring $build"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DMLIR_DIR=$llvm/lib/cmake/mlir -DLLVM_EXTERNAL_LIT=$llvm/bin/lit \
    -DCMAKE_C_COMPILER=$llvm/bin/clang -DCMAKE_CXX_COMPILER=$llvm/bin/clang++ \
    -DLLVM_ENABLE_LLD=ON -DCMAKE_C_COMPILER_LAUNCHER=ccache \
    -DCMAKE_CXX_COMPILER_LAUNCHER=ccache "${extra[@]}" \
    -DPython3_EXECUTABLE="$root/.venv/bin/python" >"/tmp/moe-mlir-cmake-$name.log" 2>&1 ||
    { tail -n 30 "/tmp/moe-mlir-cmake-$name.log" >&2; exit 1; }
fi
echo "build: ninja -j${MOE_JOBS:-2}${targets:+ (${#targets[@]} targets)} in $name"
ninja -C "$build" -j"${MOE_JOBS:-2}" "${targets[@]}" >"/tmp/moe-mlir-ninja-$name.log" 2>&1 ||
  { grep -E "error|FAILED" -A3 "/tmp/moe-mlir-ninja-$name.log" | head -n 60 >&2; exit 1; }
