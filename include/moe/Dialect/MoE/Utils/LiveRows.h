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
// half of its worst case at EP=2). Likewise an exchange sends only the first
// sum(counts) rows of its input (the rows going back to their ranks).
//
//===----------------------------------------------------------------------===//
#ifndef MOE_DIALECT_MOE_UTILS_LIVEROWS_H
#define MOE_DIALECT_MOE_UTILS_LIVEROWS_H

#include "moe/Dialect/MoE/IR/MoEOps.h"

#include "mlir/IR/Dominance.h"
#include "mlir/Support/LLVM.h"
#include "llvm/ADT/DenseMap.h"

namespace mlir::moe {

/// Argument attributes on a function whose calls read some row arguments only
/// inside expert groups (the generated GPU kernels): `moe.group_rows` on every
/// such argument (its dim 0 are rows), `moe.group_offsets` on the offsets
/// argument ([E + 1] group boundaries).
constexpr llvm::StringLiteral kGroupRowsAttr = "moe.group_rows";
constexpr llvm::StringLiteral kGroupOffsetsAttr = "moe.group_offsets";
/// Argument attributes on the communication runtime's exchanges (buffers,
/// after -convert-moe-to-runtime): `moe.rows_counted_by = k` on a rows
/// argument of which only the first sum(counts) rows are read, the counts
/// being argument k; `moe.rows_unread` on a rows argument whose contents are
/// not read at all (the wait of a started exchange checks its address).
/// A call with `moe.rows_in_slots_padded_to = m` (on the call: one
/// declaration serves every layout) reads those rows by slot instead: the
/// rows of the groups `moe.slot_offsets %counts pad_to(m)` describes.
constexpr llvm::StringLiteral kRowsCountedByAttr = "moe.rows_counted_by";
constexpr llvm::StringLiteral kRowsInSlotsPaddedToAttr =
    "moe.rows_in_slots_padded_to";
constexpr llvm::StringLiteral kRowsUnreadAttr = "moe.rows_unread";

/// Where the rows that matter end: the last entry of a groups' `offsets`
/// tensor (a dispatch's offsets[E]), or the sum of the `counts` tensor (the
/// rows an exchange sends, and the groups of moe.slot_offsets without
/// padding). Empty when unknown.
struct RowBound {
  Value offsets;
  Value counts;
  explicit operator bool() const { return offsets || counts; }
  bool operator==(const RowBound &o) const {
    return offsets == o.offsets && counts == o.counts;
  }
  bool operator!=(const RowBound &o) const { return !(*this == o); }
};

/// The live-rows analysis of the ops under one root. Queries are answered on
/// the IR as it is when asked (results are cached: query before rewriting).
class LiveRows {
public:
  explicit LiveRows(Operation *root) : dominance(root) {}

  /// The bound of the rows of `v` (dim 0) that reach any result: rows at or
  /// beyond it are never read, other than by ops whose results are
  /// themselves bounded. Empty if unknown.
  RowBound boundOf(Value v);

  /// The bound of every result of `op` that has rows, provided `op` is one
  /// whose rows can be computed alone (row-local: SwiGLU and its gradient,
  /// quantize / dequantize with blocks off the rows, a dispatch's own rows,
  /// a combine's tokens) and the bound's value dominates it. Empty
  /// otherwise.
  RowBound boundedOp(Operation *op);

  /// Whether the rows of `result` (a grouped op's, grouped by `offsets`)
  /// past the last group are never read.
  bool pastLastGroupUnread(Value result, Value offsets) {
    RowBound b = groupsEnd(offsets);
    return b && boundOf(result) == b;
  }

  /// The end of the groups `offsets` describes, as a bound: the offsets
  /// themselves, or the counts of moe.slot_offsets without padding (their
  /// sum is the last offset: the bound of the exchange sending those rows
  /// back).
  static RowBound groupsEnd(Value offsets);
  /// The padding of every group `offsets` describes (1 when unknown).
  static int64_t groupPadding(Value offsets);

private:
  RowBound compute(Value v);
  /// For a use of `v` by bufferization.to_buffer: the bound the runtime
  /// calls receiving that buffer put on its rows (exchanges read the first
  /// sum(counts) rows; empty if they read none), failure unless every use
  /// is such a call.
  static FailureOr<RowBound> boundOfExchangeBuffer(Operation *toBuffer);

  DominanceInfo dominance;
  llvm::DenseMap<Value, RowBound> cache;
  llvm::DenseSet<Value> visiting;
};

} // namespace mlir::moe

#endif
