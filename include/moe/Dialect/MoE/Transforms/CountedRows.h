//===- CountedRows.h - the rows a cross-entropy counts ----------*- C++ -*-===//
//
// moe.cross_entropy averages over the rows whose label is in [0, V). Passes
// that split or scale the loss (-moe-expert-parallel over ranks,
// -moe-chunk-loss over chunks of tokens) weigh each part by its count.
//
//===----------------------------------------------------------------------===//
#ifndef MOE_DIALECT_MOE_TRANSFORMS_COUNTEDROWS_H
#define MOE_DIALECT_MOE_TRANSFORMS_COUNTEDROWS_H

#include "mlir/IR/Builders.h"

namespace mlir::moe {

/// The number of `labels` ([N], integer) in [0, vocab), as a 0-d f32 tensor
/// (a linalg reduction, in label order).
Value buildCountedRows(OpBuilder &b, Location loc, Value labels, int64_t vocab);

} // namespace mlir::moe

#endif
