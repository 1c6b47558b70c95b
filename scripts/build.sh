#!/usr/bin/env bash
# Sets up (scripts/setup.sh), configures and builds moe-mlir into ./build.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
build="$root/build"
llvm=/usr/lib/llvm-22
if [ ! -f "$build/build.ninja" ]; then
  echo "build: configuring $build"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DMLIR_DIR=$llvm/lib/cmake/mlir -DLLVM_EXTERNAL_LIT=$llvm/bin/lit \
    -DCMAKE_C_COMPILER=$llvm/bin/clang -DCMAKE_CXX_COMPILER=$llvm/bin/clang++ \
    -DLLVM_ENABLE_LLD=ON -DCMAKE_C_COMPILER_LAUNCHER=ccache \
    -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
    -DPython3_EXECUTABLE="$root/.venv/bin/python" >/tmp/moe-mlir-cmake.log 2>&1 ||
    { tail -n 30 /tmp/moe-mlir-cmake.log >&2; exit 1; }
fi
echo "build: ninja -j${MOE_JOBS:-2}"
ninja -C "$build" -j"${MOE_JOBS:-2}" >/tmp/moe-mlir-ninja.log 2>&1 ||
  { grep -E "error|FAILED" -A3 /tmp/moe-mlir-ninja.log | head -n 60 >&2; exit 1; }
