//===- SplitReductions.cpp - long reductions to one value across threads --===//
//
// The GPU mapping gives every parallel iteration one thread and runs
// reductions inside it: a reduction with (almost) nothing parallel around it
// (a dot product, a sum to a scalar) would be one thread summing millions of
// terms. This pass splits such reductions in two (linalg::splitReduction):
// `ratio` parallel partial sums, then their sum. The result is the same sum
// in another order.
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
  int64_t ratioFor(linalg::LinalgOp op) const {
    if (!op.hasPureTensorSemantics() || op.getNumReductionLoops() != 1 ||
        op.getNumDpsInits() != 1)
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
    if (parallel > maxParallel || reduction < minTerms)
      return 0;
    int64_t most = std::min<int64_t>(
        {1024, std::max<int64_t>(threads / parallel, 2), reduction / 16});
    for (int64_t ratio = most; ratio > 1; --ratio)
      if (reduction % ratio == 0)
        return ratio;
    return 0;
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
      (void)linalg::splitReduction(rewriter, op, [&](linalg::LinalgOp) {
        linalg::SplitReductionOptions options;
        options.ratio = ratio;
        options.index = last;
        options.innerParallel = false;
        return options;
      });
    }
  }
};

} // namespace
