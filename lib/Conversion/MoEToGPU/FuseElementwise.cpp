//===- FuseElementwise.cpp - one kernel for an elementwise chain ----------===//
//
// On GPUs every linalg op becomes a kernel and a pass through memory. An
// elementwise producer whose result has one use is fused into its consumer
// (linalg's elementwise fusion): quantizing a GEMM operand to MX and
// dequantizing it to bf16 becomes one f32 -> bf16 pass, the 8-bit tensor
// between them never written. Only reads that take every produced element
// once are fused (a broadcasting read would recompute the producer per
// reader), only ops of static shapes (the live rows of an expert
// computation, sized on the device, stay as they are), and reshapes are left
// alone (folding them into generics would create tensors sized on the
// host).
//
//===----------------------------------------------------------------------===//

#include "moe/Conversion/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Linalg/Transforms/Transforms.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEGPUFUSEELEMENTWISE
#include "moe/Conversion/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;

namespace {

bool staticShapes(Operation *op) {
  auto isStatic = [](Type t) {
    auto shaped = dyn_cast<ShapedType>(t);
    return !shaped || shaped.hasStaticShape();
  };
  return llvm::all_of(op->getOperandTypes(), isStatic) &&
         llvm::all_of(op->getResultTypes(), isStatic);
}

/// Fuses into a generic the single-use, static-shape generic producing one of
/// its inputs (linalg::fuseElementwiseOps, which also checks the maps).
/// Only this: the other patterns of linalg's elementwise fusion would also
/// replace unread `outs` with new tensors, dropping the storage the live-row
/// lowering computes into.
struct FuseProducer : OpRewritePattern<linalg::GenericOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(linalg::GenericOp consumer,
                                PatternRewriter &rewriter) const override {
    if (!staticShapes(consumer))
      return failure();
    for (OpOperand *operand : consumer.getDpsInputOperands()) {
      auto producer = operand->get().getDefiningOp<linalg::GenericOp>();
      // In the same region: fused into a loop's body, a producer outside
      // the loop would be recomputed on every iteration.
      if (!producer || !producer->hasOneUse() || !staticShapes(producer) ||
          producer->getParentRegion() != consumer->getParentRegion() ||
          !linalg::areElementwiseOpsFusable(operand))
        continue;
      // Each produced element read by exactly one consumer iteration: a
      // broadcasting read (a row's source index read by every element of
      // the row) would recompute the producer's body that many times.
      auto result = cast<OpResult>(operand->get());
      if (!consumer.getMatchingIndexingMap(operand).isPermutation() ||
          !producer.getIndexingMapMatchingResult(result).isPermutation())
        continue;
      FailureOr<linalg::ElementwiseOpFusionResult> fused =
          linalg::fuseElementwiseOps(rewriter, operand);
      if (failed(fused))
        continue;
      for (auto [original, replacement] : fused->replacements)
        rewriter.replaceAllUsesExcept(original, replacement, fused->fusedOp);
      rewriter.eraseOp(consumer);
      return success();
    }
    return failure();
  }
};

struct MoEGPUFuseElementwisePass
    : moe::impl::MoEGPUFuseElementwiseBase<MoEGPUFuseElementwisePass> {
  using MoEGPUFuseElementwiseBase::MoEGPUFuseElementwiseBase;

  void runOnOperation() override {
    MLIRContext *ctx = &getContext();
    RewritePatternSet patterns(ctx);
    patterns.add<FuseProducer>(ctx);
    // Fusion leaves expand_shape(collapse_shape(x)) pairs between what it
    // fuses; these fold away.
    tensor::ExpandShapeOp::getCanonicalizationPatterns(patterns, ctx);
    tensor::CollapseShapeOp::getCanonicalizationPatterns(patterns, ctx);
    if (failed(applyPatternsGreedily(getOperation(), std::move(patterns))))
      return signalPassFailure();
  }
};

} // namespace
