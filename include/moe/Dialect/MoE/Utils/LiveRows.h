//===- LiveRows.h - which rows of an expert computation matter --*- C++ -*-===//
//
// A moe.dispatch sizes its rows for the worst case (every copy routed to
// one rank, every group padded) and marks the end of the real ones:
// offsets[E]. The expert computation that follows reads its rows only
// through the groups [offsets[e], offsets[e+1]) (grouped GEMMs, grouped
// MLPs, moe.experts) or through the dispatch's positions (moe.combine), and
// row-local ops in between (SwiGLU, quantize, dequantize) carry row r to row
// r. So the rows at or beyond offsets[E] of such values never reach a
// result: lowerings may leave them unspecified and compute only the rows
// before offsets[E] (the received rows of an expert-parallel layer, about
// half of its worst case at EP=2).
//
//===----------------------------------------------------------------------===//
#ifndef MOE_DIALECT_MOE_UTILS_LIVEROWS_H
#define MOE_DIALECT_MOE_UTILS_LIVEROWS_H

#include "moe/Dialect/MoE/IR/MoEOps.h"

#include "mlir/IR/Dominance.h"
#include "llvm/ADT/DenseMap.h"

namespace mlir::moe {

/// Argument attributes on a function whose calls read some row arguments only
/// inside expert groups (the generated GPU kernels): `moe.group_rows` on every
/// such argument (its dim 0 are rows), `moe.group_offsets` on the offsets
/// argument ([E + 1] group boundaries).
constexpr llvm::StringLiteral kGroupRowsAttr = "moe.group_rows";
constexpr llvm::StringLiteral kGroupOffsetsAttr = "moe.group_offsets";

/// The live-rows analysis of the ops under one root. Queries are answered on
/// the IR as it is when asked (results are cached: query before rewriting).
class LiveRows {
public:
  explicit LiveRows(Operation *root) : dominance(root) {}

  /// The moe.dispatch whose offsets[E] bounds the rows of `v` (dim 0) that
  /// reach any result: rows at or beyond it are never read, other than by
  /// ops whose results are themselves bounded. Null if unknown.
  DispatchOp boundOf(Value v);

  /// The dispatch bounding every result of `op` that has rows, provided
  /// `op` is one whose rows can be computed alone (row-local: SwiGLU and its
  /// gradient, quantize / dequantize with blocks off the rows, a dispatch's
  /// own rows) and the dispatch dominates it. Null otherwise.
  DispatchOp boundedOp(Operation *op);

  /// Whether the rows of `result` (a grouped op's, grouped by `offsets`)
  /// past the last group are never read: `offsets` are a dispatch's and
  /// that dispatch bounds `result`.
  bool pastLastGroupUnread(Value result, Value offsets) {
    DispatchOp d = dispatchOfOffsets(offsets);
    return d && boundOf(result) == d;
  }

private:
  DispatchOp compute(Value v);
  /// The dispatch whose offsets `offsets` is, or null.
  static DispatchOp dispatchOfOffsets(Value offsets);

  DominanceInfo dominance;
  llvm::DenseMap<Value, DispatchOp> cache;
  llvm::DenseSet<Value> visiting;
};

} // namespace mlir::moe

#endif
