//===- ExpandGroupedMlp.cpp - moe.grouped_mlp -> its definition -----------===//

#include "moe/Dialect/MoE/Transforms/Passes.h"

#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEEXPANDGROUPEDMLP
#include "moe/Dialect/MoE/Transforms/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

namespace {
/// grouped_mlp(x, w1, w2, off) is, by definition,
///   grouped_matmul(act(swiglu(grouped_matmul(x, w1, off) : f32)), w2, off)
/// where act quantizes rowwise when w2 is block-scaled and otherwise rounds
/// to w2's element type (swiglu rounds its f32 result once, the same thing).
struct ExpandGroupedMlp : OpRewritePattern<GroupedMlpOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(GroupedMlpOp op,
                                PatternRewriter &rewriter) const override {
    Location loc = op.getLoc();
    auto resultType = op.getResult().getType();
    int64_t rows = resultType.getDimSize(0);
    auto w1Shape = isa<MXTensorType>(op.getW1().getType())
                       ? cast<MXTensorType>(op.getW1().getType()).getShape()
                       : cast<RankedTensorType>(op.getW1().getType()).getShape();
    int64_t twoF = w1Shape[2];
    Type f32 = rewriter.getF32Type();
    auto hType = RankedTensorType::get({rows, twoF}, f32);
    Value h = GroupedMatmulOp::create(rewriter, loc, hType, op.getInput(),
                                      op.getW1(), op.getOffsets(),
                                      /*transpose_rhs=*/false);
    Value act;
    if (auto w2 = dyn_cast<MXTensorType>(op.getW2().getType())) {
      Value a = SwigluOp::create(rewriter, loc,
                                 RankedTensorType::get({rows, twoF / 2}, f32),
                                 h, op.getLayout());
      auto qType = MXTensorType::get(rewriter.getContext(), {rows, twoF / 2},
                                     w2.getElementType(), /*axis=*/1,
                                     w2.getBlockSize());
      act = QuantizeOp::create(rewriter, loc, qType, a, op.getScaleMode());
    } else {
      Type elt = cast<RankedTensorType>(op.getW2().getType()).getElementType();
      act = SwigluOp::create(rewriter, loc,
                             RankedTensorType::get({rows, twoF / 2}, elt), h,
                             op.getLayout());
    }
    rewriter.replaceOpWithNewOp<GroupedMatmulOp>(
        op, resultType, act, op.getW2(), op.getOffsets(), false);
    return success();
  }
};

struct MoEExpandGroupedMlpPass
    : moe::impl::MoEExpandGroupedMlpBase<MoEExpandGroupedMlpPass> {
  void runOnOperation() override {
    RewritePatternSet patterns(&getContext());
    populateExpandGroupedMlpPatterns(patterns);
    if (failed(applyPatternsGreedily(getOperation(), std::move(patterns))))
      signalPassFailure();
  }
};
} // namespace

void mlir::moe::populateExpandGroupedMlpPatterns(RewritePatternSet &patterns) {
  patterns.add<ExpandGroupedMlp>(patterns.getContext());
}
