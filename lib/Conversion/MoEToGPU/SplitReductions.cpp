//===- SplitReductions.cpp - long reductions to one value across threads --===//
//
// The GPU mapping gives every parallel iteration one thread and runs
// reductions inside it. Two kinds of reduction map badly:
//   - a reduction with (almost) nothing parallel around it (a dot product, a
//     sum to a scalar, a norm's weight gradient) would be a few threads
//     summing millions of terms;
//   - many short reductions along rows in memory (the sums of squares of
//     an RMSNorm over 128 values per head) give each thread a row: adjacent
//     threads read 512 bytes apart, and the loads are not coalesced.
// This pass splits both in two (linalg::splitReduction): `ratio` parallel
// partial sums, then their sum. Partial sum p takes the terms p, p + ratio,
// p + 2 ratio, ...: adjacent partial sums of a row read adjacent elements.
// The result is the same sum in another order.
//
//===----------------------------------------------------------------------===//

#include "moe/Conversion/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Linalg/Transforms/Transforms.h"
#include "mlir/IR/PatternMatch.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEGPUSPLITREDUCTIONS
#include "moe/Conversion/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;

namespace {

struct MoEGPUSplitReductionsPass
    : moe::impl::MoEGPUSplitReductionsBase<MoEGPUSplitReductionsPass> {
  using MoEGPUSplitReductionsBase::MoEGPUSplitReductionsBase;

  /// The split ratio for `op`, or 0 to leave it: one reduction loop of at
  /// least `minTerms` iterations, at most `maxParallel` parallel iterations
  /// around it, all static; the largest divisor of the reduction up to
  /// min(1024, threads / parallel) that leaves every partial sum at least 16
  /// terms (a GPU thread has one load in flight per term: 2048 threads
  /// summing 4096 terms each read at a few hundred GB/s).
  ///
  /// Or, for many short rows (contiguousRows): 8 partial sums of at least 4
  /// terms each, so that 8 adjacent threads read 32 adjacent bytes.
  int64_t ratioFor(linalg::LinalgOp op) const {
    // Indexing maps that are not projected permutations (the grouped KV
    // head d floordiv 8 of an attention's scores) are not split correctly
    // by linalg::splitReduction.
    if (!op.hasPureTensorSemantics() || op.getNumReductionLoops() != 1 ||
        op.getNumDpsInits() != 1 || !op.hasOnlyProjectedPermutations())
      return 0;
    SmallVector<int64_t> ranges = op.getStaticLoopRanges();
    SmallVector<utils::IteratorType> its = op.getIteratorTypesArray();
    int64_t parallel = 1, reduction = 0;
    for (auto [range, it] : llvm::zip(ranges, its)) {
      if (ShapedType::isDynamic(range))
        return 0;
      if (it == utils::IteratorType::reduction)
        reduction = range;
      else
        parallel *= range;
    }
    if (parallel > maxParallel || reduction < minTerms) {
      if (reduction % 8 == 0 && reduction >= 32 &&
          parallel * reduction >= minRowTerms && contiguousRows(op))
        return 8;
      return 0;
    }
    int64_t most = std::min<int64_t>(
        {1024, std::max<int64_t>(threads / parallel, 2), reduction / 16});
    for (int64_t ratio = most; ratio > 1; --ratio)
      if (reduction % ratio == 0)
        return ratio;
    return 0;
  }

  /// Whether every input that the reduction reads along reads it along its
  /// innermost dimension (a row in memory), and at least one does.
  static bool contiguousRows(linalg::LinalgOp op) {
    SmallVector<unsigned> reductionDims;
    op.getReductionDims(reductionDims);
    unsigned r = reductionDims.front();
    bool any = false;
    for (OpOperand *input : op.getDpsInputOperands()) {
      AffineMap map = op.getMatchingIndexingMap(input);
      if (!map.isFunctionOfDim(r))
        continue;
      if (map.getNumResults() == 0 ||
          map.getResults().back() != getAffineDimExpr(r, op.getContext()))
        return false;
      for (AffineExpr e : map.getResults().drop_back())
        if (e.isFunctionOfDim(r))
          return false;
      any = true;
    }
    return any;
  }

  void runOnOperation() override {
    IRRewriter rewriter(&getContext());
    SmallVector<linalg::LinalgOp> candidates;
    getOperation().walk([&](linalg::LinalgOp op) {
      if (ratioFor(op))
        candidates.push_back(op);
    });
    for (linalg::LinalgOp op : candidates) {
      int64_t ratio = ratioFor(op);
      // The partial sums go last in the intermediate tensor: the final
      // reduction's loop is then innermost, inside the parallel ones (an
      // outer reduction loop around parallel ones would stay host code).
      unsigned last = cast<ShapedType>(op.getDpsInits()[0].getType()).getRank();
      rewriter.setInsertionPoint(op);
      // Ops whose combiner splitReduction does not recognize stay as they
      // are (it fails without changing anything).
      FailureOr<linalg::SplitReductionResult> split =
          linalg::splitReduction(rewriter, op, [&](linalg::LinalgOp) {
            linalg::SplitReductionOptions options;
            options.ratio = ratio;
            options.index = last;
            // Partial sum p of the terms p + ratio j (not of a block of
            // consecutive terms): along a row, adjacent threads read adjacent
            // elements; down columns, each partial sum reads every ratio-th
            // row.
            options.innerParallel = true;
            return options;
          });
      if (failed(split))
        continue;
      // The partial sums' loop comes after the reduction loop it was split
      // from; the GPU mapping runs a parallel loop inside a sequential one
      // in one thread. Every parallel loop first.
      auto generic = dyn_cast<linalg::GenericOp>(*split->splitLinalgOp);
      if (!generic)
        continue;
      SmallVector<unsigned> order;
      SmallVector<utils::IteratorType> its = generic.getIteratorTypesArray();
      for (auto [i, it] : llvm::enumerate(its))
        if (it == utils::IteratorType::parallel)
          order.push_back(i);
      for (auto [i, it] : llvm::enumerate(its))
        if (it != utils::IteratorType::parallel)
          order.push_back(i);
      rewriter.setInsertionPoint(generic);
      (void)linalg::interchangeGenericOp(rewriter, generic, order);
    }
  }
};

} // namespace
