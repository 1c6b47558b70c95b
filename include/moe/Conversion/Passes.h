//===- Passes.h - moe-mlir conversion passes --------------------*- C++ -*-===//
#ifndef MOE_CONVERSION_PASSES_H
#define MOE_CONVERSION_PASSES_H

#include "mlir/Pass/Pass.h"
#include "moe/Conversion/MoEToGPU/GPUOptions.h"
#include "moe/Conversion/MoEToLinalg/MoEToLinalg.h"

namespace mlir::moe {

#define GEN_PASS_DECL
#define GEN_PASS_REGISTRATION
#include "moe/Conversion/Passes.h.inc"

} // namespace mlir::moe

#endif
