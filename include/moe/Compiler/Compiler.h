//===- Compiler.h - moe programs to shared objects --------------*- C++ -*-===//
//
// What moe-compile does, as a library (the tool, the C API and the Python
// package call it): run the CPU or GPU pipeline on a module, translate to
// LLVM IR, compile for the host and link one shared object holding the host
// code and the kernels. Every public function gets a C entry point
// `_mlir_ciface_<name>` taking memref descriptors; the object also exports
// `moe_manifest`, a text description of those functions:
//
//   target <cpu|sm_XX>
//   function <name>
//   arg <dtype> <rank> <dims...> [range <lo> <hi>] [shard <experts> <local>]
//       [param <name> init <normal|ones> [hf_transposed]] [input <role>]
//   result <dtype> <rank> <dims...> [gradient_of <arg>]
//   meta <key> <value>
//   tolerance <atol> <rtol> [<norm>]
//
// and `_mlir_packed_<name>(void **args)`, the same call with the results
// buffer (if any) and the descriptor pointers in one array.
//
//===----------------------------------------------------------------------===//
#ifndef MOE_COMPILER_COMPILER_H
#define MOE_COMPILER_COMPILER_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Pass/PassManager.h"

#include <functional>

#include <string>

namespace mlir::moe {

struct CompileOptions {
  /// `cpu`, or a GPU chip such as `sm_90a` or `sm_100a` (GPUChip).
  std::string target = "cpu";
  /// GPU kernels as `auto` (a fatbin with cubin and PTX when ptxas is found,
  /// else PTX), `isa` (PTX), `bin` or `fatbin`.
  std::string kernelFormat = "auto";
  /// GPU targets: further options of the GPU pipeline, as
  /// `-moe-gpu-pipeline` takes them (`pair-round-trips=always
  /// mx-activations=peak`; see GPUPipelineOptions). The chip and the format
  /// come from `target` and `kernelFormat`.
  std::string gpuOptions;
  /// Assemble every kernel module with ptxas (forces `isa`); fails if ptxas
  /// rejects one.
  bool verifyPTX = false;
  /// If set, the kernels' PTX is written here (forces `isa`).
  std::string emitPTX;
  /// If set, the optimized LLVM IR is written here.
  std::string emitLLVM;
  /// Remark each function's peak of live buffers (-moe-buffer-report).
  bool bufferReport = false;
  /// The C compiler driver used to link.
  std::string linker = "cc";
  /// Called on the pass manager before it runs (a tool applies its
  /// `--mlir-print-ir-*` and `--mlir-timing` options here).
  std::function<LogicalResult(PassManager &)> configurePassManager;
};

/// Registers everything a module compiled by compileToSharedObject may hold:
/// the upstream dialects and extensions, the LLVM IR translations and moe.
void registerCompilerDialects(DialectRegistry &registry);

/// Compiles `module` (modified in place) to the shared object `output`,
/// written atomically: on failure an existing `output` is left untouched.
/// Errors are reported as diagnostics on the module's context; `log`
/// receives informational lines (ptxas verification).
LogicalResult compileToSharedObject(ModuleOp module, StringRef output,
                                    const CompileOptions &options,
                                    llvm::raw_ostream &log);

} // namespace mlir::moe

#endif
