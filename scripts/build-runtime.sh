#!/usr/bin/env bash
# Builds libmoert and its tools alone (cmake -S runtime: CUDA headers, no
# MLIR), as the GPU scripts need it on the GPU machine.
#   scripts/build-runtime.sh [BUILD_DIR]   (default $MOE_RUNTIME_BUILD or
#                                           /tmp/moert-build)
# Quiet on success (the logs are /tmp/moert-cmake.log and
# /tmp/moert-build.log); on failure prints their ends and exits 1.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rt=${1:-${MOE_RUNTIME_BUILD:-/tmp/moert-build}}
cmake -S "$root/runtime" -B "$rt" -DCMAKE_BUILD_TYPE=Release >/tmp/moert-cmake.log 2>&1 ||
  { tail -20 /tmp/moert-cmake.log; exit 1; }
cmake --build "$rt" -j"$(nproc)" >/tmp/moert-build.log 2>&1 ||
  { tail -30 /tmp/moert-build.log; exit 1; }
