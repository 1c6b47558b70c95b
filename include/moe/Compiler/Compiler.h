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

#include <string>

namespace mlir::moe {

struct CompileOptions {
  /// `cpu`, or a GPU chip such as `sm_90a` or `sm_100a`.
  std::string target = "cpu";
  /// GPU kernels as `auto` (a fatbin with cubin and PTX when ptxas is found,
  /// else PTX), `isa` (PTX), `bin` or `fatbin`.
  std::string kernelFormat = "auto";
  /// Assemble every kernel module with ptxas (forces `isa`); fails if ptxas
  /// rejects one.
  bool verifyPTX = false;
  /// If set, the kernels' PTX is written here (forces `isa`).
  std::string emitPTX;
  /// If set, the optimized LLVM IR is written here.
  std::string emitLLVM;
  /// Hopper: MXFP8 grouped GEMMs on FP8 wgmma (not exact; today slower than
  /// the exact default).
  bool mxfp8FP8MMA = false;
  /// Remark each function's peak of live buffers (-moe-buffer-report).
  bool bufferReport = false;
  /// Hopper: when the two MX round trips of one tensor share a kernel:
  /// "peak" (within the peak of live tensors) or "always".
  std::string pairRoundTrips = "peak";
  /// Hopper: where the expert GEMMs read their fused epilogues' activations
  /// as 8-bit MX elements and scales: "peak" (where that lowers the peak of
  /// live tensors) or "always".
  std::string mxActivations = "peak";
  /// The C compiler driver used to link.
  std::string linker = "cc";
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
