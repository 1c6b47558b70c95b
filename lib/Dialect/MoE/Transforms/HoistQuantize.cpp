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

/// quantize(move(rows, ...)) -> move(quantize(rows), ...), where the mover
/// (moe.dispatch or moe.all_to_all) takes its rows as operand 0 and gives
/// the moved rows as result 0; its other operands, results and attributes
/// stay as they are.
struct QuantizeBeforeMove : OpRewritePattern<QuantizeOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(QuantizeOp op,
                                PatternRewriter &rewriter) const override {
    Operation *mover = op.getInput().getDefiningOp();
    if (!isa_and_nonnull<DispatchOp, AllToAllOp>(mover) ||
        op.getInput() != mover->getResult(0) || !isMovableRowwise(op))
      return failure();
    rewriter.setInsertionPoint(mover);
    Value rows = mover->getOperand(0);
    Value quantized = QuantizeOp::create(rewriter, op.getLoc(),
                                         quantizedLike(rows, op.getType()),
                                         rows, op.getScaleModeAttr());
    OperationState state(mover->getLoc(), mover->getName());
    state.addOperands(quantized);
    state.addOperands(mover->getOperands().drop_front());
    state.addTypes(op.getType());
    state.addTypes(TypeRange(mover->getResultTypes()).drop_front());
    state.addAttributes(mover->getAttrDictionary().getValue());
    Operation *moved = rewriter.create(state);
    rewriter.replaceOp(op, moved->getResult(0));
    for (auto [from, to] : llvm::zip(mover->getResults().drop_front(),
                                     moved->getResults().drop_front()))
      rewriter.replaceAllUsesWith(from, to);
    rewriter.eraseOp(mover);
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
  patterns.add<QuantizeBeforeMove>(patterns.getContext());
}
