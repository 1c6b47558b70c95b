//===- ExpandGroupedMlp.cpp - moe.grouped_mlp -> its definition -----------===//

#include "moe/Dialect/MoE/Transforms/GemmRecipe.h"
#include "moe/Dialect/MoE/Transforms/Passes.h"
#include "moe/Dialect/MoE/Utils/TensorLiveness.h"

#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEEXPANDGROUPEDMLP
#include "moe/Dialect/MoE/Transforms/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

namespace {
/// Gives the ops made right before `op` (those after `prev`, or from the
/// start of the block) `op`'s discardable attributes: a model's moe.layer
/// stays on the parts of a fused op.
void inheritAttrs(Operation *op, Operation *prev) {
  DictionaryAttr attrs = op->getDiscardableAttrDictionary();
  if (attrs.empty())
    return;
  Block::iterator it =
      prev ? std::next(prev->getIterator()) : op->getBlock()->begin();
  for (; &*it != op; ++it)
    for (NamedAttribute a : attrs)
      it->setAttr(a.getName(), a.getValue());
}

/// grouped_mlp(x, w1, w2, off) is, by definition,
///   grouped_matmul(act(swiglu(grouped_matmul(x, w1, off) : f32)), w2, off)
/// where act quantizes rowwise when w2 is block-scaled and otherwise rounds
/// to w2's element type (swiglu rounds its f32 result once, the same thing).
struct ExpandGroupedMlp : OpRewritePattern<GroupedMlpOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(GroupedMlpOp op,
                                PatternRewriter &rewriter) const override {
    Location loc = op.getLoc();
    Operation *prev = op->getPrevNode();
    auto resultType = op.getResult().getType();
    int64_t rows = resultType.getDimSize(0);
    auto w1Shape =
        isa<MXTensorType>(op.getW1().getType())
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
      auto qType =
          MXTensorType::get(rewriter.getContext(), {rows, twoF / 2},
                            w2.getElementType(), /*axis=*/1, w2.getBlockSize());
      act = QuantizeOp::create(rewriter, loc, qType, a, op.getScaleMode());
    } else {
      Type elt = cast<RankedTensorType>(op.getW2().getType()).getElementType();
      act = SwigluOp::create(rewriter, loc,
                             RankedTensorType::get({rows, twoF / 2}, elt), h,
                             op.getLayout());
    }
    Value y = GroupedMatmulOp::create(rewriter, loc, resultType, act,
                                      op.getW2(), op.getOffsets(), false);
    inheritAttrs(op, prev);
    rewriter.replaceOp(op, y);
    return success();
  }
};

/// grouped_mlp_backward(x, w1, w2, off, dy) is, by definition (see its
/// description), the backward sequence that recomputes h and the activation
/// from x; Q brings every GEMM operand to the op's `gemm_type` along the
/// GEMM's contraction dimension.
struct ExpandGroupedMlpBackward : OpRewritePattern<GroupedMlpBackwardOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(GroupedMlpBackwardOp op,
                                PatternRewriter &rewriter) const override {
    Location loc = op.getLoc();
    Operation *prev = op->getPrevNode();
    Type gemmType = op.getGemmType().value_or(Type());
    ScaleMode mode = op.getScaleMode();
    SwigluLayout layout = op.getLayout();
    auto q = [&](Value v, unsigned axis) {
      return createGemmOperand(rewriter, loc, v, gemmType, axis, mode);
    };
    Value x = op.getX(), w1 = op.getW1(), w2 = op.getW2(), dy = op.getDy();
    Value off = op.getOffsets();
    int64_t rows = op.getX().getType().getDimSize(0);
    int64_t twoF = op.getW1().getType().getDimSize(2);
    Type f32 = rewriter.getF32Type();
    auto hType = RankedTensorType::get({rows, twoF}, f32);
    auto daType = RankedTensorType::get({rows, twoF / 2}, f32);
    // The activation as the forward's expansion computes it (rounded once,
    // when bf16 GEMMs read it), so that a step's forward and this
    // recomputation are one op after CSE.
    Type aElt = isMXElementType(gemmType) ? f32
                : gemmType && gemmType.isBF16()
                    ? gemmType
                    : op.getW2().getType().getElementType();
    Value h = GroupedMatmulOp::create(rewriter, loc, hType, q(x, 1), q(w1, 1),
                                      off, /*transpose_rhs=*/false);
    Value a = SwigluOp::create(rewriter, loc,
                               RankedTensorType::get({rows, twoF / 2}, aElt), h,
                               layout);
    // In the order that frees memory soonest (buffers live from their first
    // use to their last). w2's gradient releases the columnwise operands of
    // the activation and dy and allocates its result: first when the
    // activation and dy are the larger (many tokens), last otherwise. dx
    // releases dh's rowwise operand and w1's before w1's gradient (the size
    // of w1) is allocated.
    auto dw2Type = cast<RankedTensorType>(op.getDw2().getType());
    int64_t aBytes = tensorBytes(a), dyBytes = tensorBytes(dy),
            dw2Bytes = tensorBytes(op.getDw2());
    bool dw2First =
        aBytes && dyBytes && dw2Bytes && aBytes + dyBytes > dw2Bytes;
    auto weightGradient2 = [&] {
      return GroupedMatmulWgradOp::create(rewriter, loc, dw2Type, q(a, 0),
                                          q(dy, 0), off);
    };
    Value dw2 = dw2First ? weightGradient2() : Value();
    Value da = GroupedMatmulOp::create(rewriter, loc, daType, q(dy, 1),
                                       q(w2, 2), off, /*transpose_rhs=*/true);
    Value dh = SwigluGradOp::create(rewriter, loc, hType, h, da, layout);
    Value dx = GroupedMatmulOp::create(rewriter, loc, op.getDx().getType(),
                                       q(dh, 1), q(w1, 2), off,
                                       /*transpose_rhs=*/true);
    Value dw1 = GroupedMatmulWgradOp::create(
        rewriter, loc, op.getDw1().getType(), q(x, 0), q(dh, 0), off);
    if (!dw2First)
      dw2 = weightGradient2();
    inheritAttrs(op, prev);
    rewriter.replaceOp(op, {dx, dw1, dw2});
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
  patterns.add<ExpandGroupedMlp, ExpandGroupedMlpBackward>(
      patterns.getContext());
}
