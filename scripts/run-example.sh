#!/usr/bin/env bash
# The main job on the CPU: build moe-mlir (setting the machine up first),
# compile an example MoE layer (examples/moe_layer.mlir, or the file given)
# through the whole CPU pipeline to LLVM, run it and print its result.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=${1:-$root/examples/moe_layer.mlir}
[ -f "$model" ] || { echo "run-example: no such model graph: $model" >&2; exit 1; }
"$root/scripts/build.sh"
llvm=/usr/lib/llvm-22
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "compile: moe-opt $(basename "$model") --moe-cpu-pipeline"
"$root/build/bin/moe-opt" "$model" --moe-cpu-pipeline -o "$out/model.llvm.mlir"
echo "run: mlir-runner -e main"
"$llvm/bin/mlir-runner" "$out/model.llvm.mlir" -e main -entry-point-result=void \
  -shared-libs="$llvm/lib/libmlir_runner_utils.so,$llvm/lib/libmlir_c_runner_utils.so" \
  >"$out/result.txt"
if [ "$model" != "$root/examples/moe_layer.mlir" ]; then
  cat "$out/result.txt"
  exit 0
fi
# Label the example's printed tensors.
"$root/.venv/bin/python" -c '
import sys
labels = iter(["tokens per expert (64 tokens x top-2):",
               "layer output [0:3, 0:6], f32 experts:",
               "layer output [0:3, 0:6], MXFP8 experts:",
               "relative error of the MXFP8 layer, ||y_mx - y|| / ||y||:"])
for line in sys.stdin:
    if line.startswith("Unranked Memref"):
        print(next(labels, ""))
        continue
    print("  " + line.rstrip())
' <"$out/result.txt"
