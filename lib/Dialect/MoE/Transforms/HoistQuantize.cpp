//===- HoistQuantize.cpp - quantize rows before they are moved ------------===//
//
// moe.quantize (blocks along the row) of rows produced by moe.dispatch or
// moe.all_to_all -> the same op moving the quantized rows. Exact: row-local
// blocks commute with any copy of whole rows, and zero rows encode as an
// all-zero block (elements 0, scale 2^-127, all bytes 0).
//
//===----------------------------------------------------------------------===//

#include "moe/Dialect/MoE/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEHOISTQUANTIZE
#include "moe/Dialect/MoE/Transforms/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

namespace {

/// The MX type of `rows` (a [N, H] float tensor) quantized like `like`.
MXTensorType quantizedLike(Value rows, MXTensorType like) {
  auto t = cast<RankedTensorType>(rows.getType());
  return MXTensorType::get(like.getContext(), t.getShape(),
                           like.getElementType(), like.getAxis(),
                           like.getBlockSize());
}

/// Whether `op` quantizes whole rows of a rank-2 tensor that only it reads.
bool isMovableRowwise(QuantizeOp op) {
  MXTensorType type = op.getResult().getType();
  return type.getRank() == 2 && type.getAxis() == 1 &&
         op.getInput().hasOneUse();
}

struct QuantizeBeforeDispatch : OpRewritePattern<QuantizeOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(QuantizeOp op,
                                PatternRewriter &rewriter) const override {
    auto dispatch = op.getInput().getDefiningOp<DispatchOp>();
    if (!dispatch || op.getInput() != dispatch.getSorted() ||
        !isMovableRowwise(op))
      return failure();
    rewriter.setInsertionPoint(dispatch);
    Value tokens = dispatch.getTokens();
    Value quantized = QuantizeOp::create(
        rewriter, op.getLoc(), quantizedLike(tokens, op.getType()), tokens,
        op.getScaleModeAttr());
    auto moved = DispatchOp::create(
        rewriter, dispatch.getLoc(),
        TypeRange{op.getType(), dispatch.getOffsets().getType(),
                  dispatch.getCounts().getType(),
                  dispatch.getPositions().getType()},
        ValueRange{quantized, dispatch.getIndices()},
        dispatch->getAttrDictionary().getValue());
    rewriter.replaceOp(op, moved.getSorted());
    rewriter.replaceAllUsesWith(dispatch.getOffsets(), moved.getOffsets());
    rewriter.replaceAllUsesWith(dispatch.getCounts(), moved.getCounts());
    rewriter.replaceAllUsesWith(dispatch.getPositions(), moved.getPositions());
    rewriter.eraseOp(dispatch);
    return success();
  }
};

struct QuantizeBeforeAllToAll : OpRewritePattern<QuantizeOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(QuantizeOp op,
                                PatternRewriter &rewriter) const override {
    auto exchange = op.getInput().getDefiningOp<AllToAllOp>();
    if (!exchange || op.getInput() != exchange.getResult() ||
        !isMovableRowwise(op))
      return failure();
    rewriter.setInsertionPoint(exchange);
    Value input = exchange.getInput();
    Value quantized = QuantizeOp::create(
        rewriter, op.getLoc(), quantizedLike(input, op.getType()), input,
        op.getScaleModeAttr());
    auto moved = AllToAllOp::create(
        rewriter, exchange.getLoc(),
        TypeRange{op.getType(), exchange.getRecvCounts().getType()},
        ValueRange{quantized, exchange.getSendCounts()},
        exchange->getAttrDictionary().getValue());
    rewriter.replaceOp(op, moved.getResult());
    rewriter.replaceAllUsesWith(exchange.getRecvCounts(),
                                moved.getRecvCounts());
    rewriter.eraseOp(exchange);
    return success();
  }
};

struct MoEHoistQuantizePass
    : moe::impl::MoEHoistQuantizeBase<MoEHoistQuantizePass> {
  void runOnOperation() override {
    RewritePatternSet patterns(&getContext());
    populateHoistQuantizePatterns(patterns);
    if (failed(applyPatternsGreedily(getOperation(), std::move(patterns))))
      return signalPassFailure();
  }
};
} // namespace

void mlir::moe::populateHoistQuantizePatterns(RewritePatternSet &patterns) {
  patterns.add<QuantizeBeforeDispatch, QuantizeBeforeAllToAll>(
      patterns.getContext());
}
