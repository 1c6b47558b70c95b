//===- Pipelines.h - named moe-mlir pipelines -------------------*- C++ -*-===//
#ifndef MOE_PIPELINES_PIPELINES_H
#define MOE_PIPELINES_PIPELINES_H

#include "mlir/Pass/PassManager.h"

namespace mlir::moe {

/// `moe` + tensor-level upstream IR -> the LLVM dialect, for the host CPU:
/// convert-moe-to-linalg, bufferization, loops, LLVM.
void buildCPUPipeline(OpPassManager &pm);

/// Registers the named pipelines (`-moe-cpu-pipeline`).
void registerMoEPipelines();

} // namespace mlir::moe

#endif
