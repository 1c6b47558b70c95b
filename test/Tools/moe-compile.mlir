// moe-compile's errors, and that a failed compile leaves an existing artifact.
// RUN: not moe-compile %s --target=sm_99 -o %t.so 2>&1 | FileCheck %s --check-prefix=CHIP
// CHIP: error: moe-compile: unknown target 'sm_99': use cpu or a GPU chip (sm_70, {{.*}} sm_90a, {{.*}} sm_100a,
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
// PAIRS: for the --pair-round-trips option: Cannot find option named 'never'!
// PAIRS: error: moe-compile: bad GPU options 'pair-round-trips=never'
// RUN: not moe-opt %s --moe-gpu-dedicated-kernels="pair-round-trips=never" -o /dev/null 2>&1 | FileCheck %s --check-prefix=PASSPAIRS
// PASSPAIRS: for the --pair-round-trips option: Cannot find option named 'never'!
// RUN: not moe-compile %s --target=sm_90a --mx-activations=bf16 -o %t.so 2>&1 | FileCheck %s --check-prefix=MXACT
// MXACT: for the --mx-activations option: Cannot find option named 'bf16'!
// RUN: not moe-opt %s --moe-gpu-dedicated-kernels="chip=sm_91" -o /dev/null 2>&1 | FileCheck %s --check-prefix=PASSCHIP
// PASSCHIP: for the --chip option: Cannot find option named 'sm_91'!
// A flag that is neither moe-compile's nor the GPU pipeline's, GPU flags for
// the CPU, and the chip set twice:
// RUN: not moe-compile %s --target=sm_90a --pair-trips=always -o %t.so 2>&1 | FileCheck %s --check-prefix=UNKNOWN
// UNKNOWN: error: moe-compile: bad GPU options 'pair-trips=always': {{.*}}no such option pair-trips
// RUN: not moe-compile %s --target=cpu --mx-activations=always -o %t.so 2>&1 | FileCheck %s --check-prefix=CPUGPU
// CPUGPU: error: moe-compile: GPU options ('mx-activations=always') given for target cpu
// RUN: not moe-compile %s --target=sm_90a --chip=sm_100a -o %t.so 2>&1 | FileCheck %s --check-prefix=TWICE
// TWICE: error: moe-compile: GPU option 'chip=sm_100a': the chip and format come from the target and the kernel format
// RUN: not moe-compile %s --target=sm_90a stray -o %t.so 2>&1 | FileCheck %s --check-prefix=STRAY
// STRAY: moe-compile: Too many positional arguments
// The pass manager's flags (as mlir-opt's):
// RUN: moe-compile %S/../Integration/CPU/router.mlir --target=cpu -o %t.router.so --mlir-timing 2>&1 | FileCheck %s --check-prefix=TIMING
// TIMING: Execution time report
// TIMING: ConvertMoEToLinalg
// RUN: moe-compile %S/../Integration/CPU/router.mlir --target=cpu -o %t.router.so --mlir-print-ir-after=convert-moe-to-linalg 2>&1 | FileCheck %s --check-prefix=PRINTIR
// PRINTIR: IR Dump After ConvertMoEToLinalg
// --help lists moe-compile's own options, not LLVM's hundreds:
// RUN: moe-compile --help | FileCheck %s --check-prefix=HELP
// HELP-NOT: aarch64
// HELP-NOT: amdgpu
// HELP: moe-compile options:
// HELP-DAG: --target=
// HELP-DAG: --verify-ptx
// HELP-DAG: --buffer-report
// HELP: GPU targets: the GPU pipeline's options
// HELP-DAG: --mxfp8-fp8-mma
// HELP-DAG: --fp8block-exact
// HELP-DAG: --pair-round-trips=<value>
// HELP-DAG: --mx-activations=<value>
// HELP-DAG: --block-size=<value>
// HELP-DAG: --mlir-print-ir-after-all
// HELP-DAG: --mlir-timing

func.func @takes_mx(%q: !moe.mx<4x32xf8E4M3FN, axis = 1>) -> tensor<4x32xf32> {
  %y = moe.dequantize %q : !moe.mx<4x32xf8E4M3FN, axis = 1> -> tensor<4x32xf32>
  return %y : tensor<4x32xf32>
}
