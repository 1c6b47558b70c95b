//===- Passes.h - moe dialect passes ----------------------------*- C++ -*-===//
#ifndef MOE_DIALECT_MOE_TRANSFORMS_PASSES_H
#define MOE_DIALECT_MOE_TRANSFORMS_PASSES_H

#include "mlir/Pass/Pass.h"
#include "moe/Dialect/MoE/IR/MoEOps.h"

namespace mlir::moe {

#define GEN_PASS_DECL
#define GEN_PASS_REGISTRATION
#include "moe/Dialect/MoE/Transforms/Passes.h.inc"

/// moe.grouped_mlp -> its defining sequence of moe ops.
void populateExpandGroupedMlpPatterns(RewritePatternSet &patterns);
/// moe.quantize of rows moved by moe.dispatch / moe.all_to_all -> the move
/// of the quantized rows (-moe-hoist-quantize).
void populateHoistQuantizePatterns(RewritePatternSet &patterns);

} // namespace mlir::moe

#endif
