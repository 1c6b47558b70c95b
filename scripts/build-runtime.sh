#!/usr/bin/env bash
# Builds libmoert and its tools alone (cmake -S runtime: CUDA headers, no
# MLIR), as the GPU scripts need it on the GPU machine.
#   scripts/build-runtime.sh [BUILD_DIR]   (default $MOE_RUNTIME_BUILD or
#                                           /tmp/moert-build)
#   scripts/build-runtime.sh --vendor-json (on the build machine: copies
#                                           nlohmann/json into gpu-artifacts/)
# libmoert reads and writes JSON with nlohmann/json (header-only). A GPU
# machine may lack it: the prepare steps copy /usr/include/nlohmann into
# gpu-artifacts/include, which travels with the artifacts, and the build
# falls back to it (or to $MOERT_JSON_INCLUDE_DIR) when CMake finds no
# nlohmann_json package.
# Quiet on success (the logs are /tmp/moert-cmake.log and
# /tmp/moert-build.log); on failure prints their ends and exits 1.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
vendored="$root/gpu-artifacts/include"
if [ "${1:-}" = "--vendor-json" ]; then
  if [ -f /usr/include/nlohmann/json.hpp ]; then
    mkdir -p "$vendored"
    rm -rf "$vendored/nlohmann"
    cp -r /usr/include/nlohmann "$vendored/"
  fi
  exit 0
fi
rt=${1:-${MOE_RUNTIME_BUILD:-/tmp/moert-build}}
json=${MOERT_JSON_INCLUDE_DIR:-}
[ -n "$json" ] || [ ! -f "$vendored/nlohmann/json.hpp" ] || json=$vendored
cmake -S "$root/runtime" -B "$rt" -DCMAKE_BUILD_TYPE=Release \
  ${json:+-DMOERT_JSON_INCLUDE_DIR="$json"} >/tmp/moert-cmake.log 2>&1 ||
  { tail -20 /tmp/moert-cmake.log; exit 1; }
cmake --build "$rt" -j"$(nproc)" >/tmp/moert-build.log 2>&1 ||
  { tail -30 /tmp/moert-build.log; exit 1; }
