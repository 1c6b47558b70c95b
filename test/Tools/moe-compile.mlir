// moe-compile's errors, and that a failed compile leaves an existing artifact.
// RUN: not moe-compile %s --target=sm_99 -o %t.so 2>&1 | FileCheck %s --check-prefix=CHIP
// CHIP: error: moe-compile: unknown target 'sm_99'
// RUN: not moe-compile %t.missing.mlir -o %t.so 2>&1 | FileCheck %s --check-prefix=MISSING
// MISSING: moe-compile: cannot open input file
// RUN: echo "previous artifact" > %t.keep.so
// RUN: not moe-compile %s --target=cpu -o %t.keep.so 2>&1 | FileCheck %s --check-prefix=MX
// MX: error: public function @takes_mx takes or returns '!moe.mx<4x32xf8E4M3FN, axis = 1>'
// RUN: FileCheck %s --check-prefix=KEPT < %t.keep.so
// KEPT: previous artifact
// RUN: not moe-compile %s --target=sm_90a --kernel-format=elf -o %t.so 2>&1 | FileCheck %s --check-prefix=FORMAT
// FORMAT: unknown kernel format 'elf'
// RUN: not moe-compile %s --target=sm_90a --pair-round-trips=never -o %t.so 2>&1 | FileCheck %s --check-prefix=PAIRS
// PAIRS: moe-compile: --pair-round-trips must be 'peak' or 'always', got 'never'
// RUN: not moe-opt %s --moe-gpu-dedicated-kernels="pair-round-trips=never" -o /dev/null 2>&1 | FileCheck %s --check-prefix=PASSPAIRS
// PASSPAIRS: error: -moe-gpu-dedicated-kernels: pair-round-trips must be 'peak' or 'always', got 'never'
// RUN: not moe-compile %s --target=sm_90a --mx-activations=bf16 -o %t.so 2>&1 | FileCheck %s --check-prefix=MXACT
// MXACT: moe-compile: --mx-activations must be 'peak' or 'always', got 'bf16'
// --help lists moe-compile's own options, not LLVM's hundreds:
// RUN: moe-compile --help | FileCheck %s --check-prefix=HELP
// HELP-NOT: aarch64
// HELP-NOT: amdgpu
// HELP: moe-compile options:
// HELP-DAG: --target=
// HELP-DAG: --verify-ptx
// HELP-DAG: --mxfp8-fp8-mma
// HELP-DAG: --buffer-report
// HELP-DAG: --pair-round-trips=
// HELP-DAG: --mx-activations=

func.func @takes_mx(%q: !moe.mx<4x32xf8E4M3FN, axis = 1>) -> tensor<4x32xf32> {
  %y = moe.dequantize %q : !moe.mx<4x32xf8E4M3FN, axis = 1> -> tensor<4x32xf32>
  return %y : tensor<4x32xf32>
}
