//===- HoistQuantize.cpp - quantize rows before they are moved ------------===//
//
// moe.quantize (blocks along the row) of rows produced by moe.dispatch or
// moe.all_to_all -> the same op moving the quantized rows. Exact: row-local
// blocks commute with any copy of whole rows, and zero rows encode as an
// all-zero block (elements 0, scale 2^-127, all bytes 0). The same for an
// elementwise narrowing of the rows (arith.truncf in a linalg.generic, the
// bf16 recipe's GEMM operands): it commutes with any copy, and 0 narrows to
// 0.
//
//===----------------------------------------------------------------------===//

#include "moe/Dialect/MoE/Transforms/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
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
  auto type = dyn_cast<MXTensorType>(op.getResult().getType());
  return type && type.getRank() == 2 && type.getAxis() == 1 &&
         op.getInput().hasOneUse();
}

/// `mover` (moe.dispatch or moe.all_to_all: rows in as operand 0, moved
/// rows out as result 0) made again moving `rows` (of the type `movedType`
/// once moved); its other operands, results and attributes stay as they
/// are. Returns the moved rows; `mover` is erased.
Value moveOther(PatternRewriter &rewriter, Operation *mover, Value rows,
                Type movedType) {
  OperationState state(mover->getLoc(), mover->getName());
  state.addOperands(rows);
  state.addOperands(mover->getOperands().drop_front());
  state.addTypes(movedType);
  state.addTypes(TypeRange(mover->getResultTypes()).drop_front());
  state.addAttributes(mover->getAttrDictionary().getValue());
  Operation *moved = rewriter.create(state);
  for (auto [from, to] : llvm::zip(mover->getResults().drop_front(),
                                   moved->getResults().drop_front()))
    rewriter.replaceAllUsesWith(from, to);
  return moved->getResult(0);
}

/// The row mover producing `v` as its moved rows, if any.
Operation *moverOf(Value v) {
  Operation *mover = v.getDefiningOp();
  if (!isa_and_nonnull<DispatchOp, AllToAllOp>(mover) ||
      v != mover->getResult(0))
    return nullptr;
  return mover;
}

/// quantize(move(rows, ...)) -> move(quantize(rows), ...).
struct QuantizeBeforeMove : OpRewritePattern<QuantizeOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(QuantizeOp op,
                                PatternRewriter &rewriter) const override {
    Operation *mover = moverOf(op.getInput());
    if (!mover || !isMovableRowwise(op))
      return failure();
    rewriter.setInsertionPoint(mover);
    Value rows = mover->getOperand(0);
    Value quantized = QuantizeOp::create(
        rewriter, op.getLoc(),
        quantizedLike(rows, cast<MXTensorType>(op.getType())), rows,
        op.getScaleModeAttr());
    rewriter.replaceOp(op, moveOther(rewriter, mover, quantized, op.getType()));
    rewriter.eraseOp(mover);
    return success();
  }
};

/// The float type a linalg.generic narrows its one input to, elementwise
/// (identity maps, all parallel, the body `arith.truncf` of the input
/// alone), or null.
FloatType narrowingOf(linalg::GenericOp op) {
  if (op.getNumDpsInputs() != 1 || op.getNumDpsInits() != 1 ||
      op->getNumResults() != 1 ||
      !llvm::all_of(op.getIndexingMapsArray(),
                    [](AffineMap m) { return m.isIdentity(); }) ||
      !llvm::all_of(op.getIteratorTypesArray(), [](utils::IteratorType t) {
        return t == utils::IteratorType::parallel;
      }))
    return {};
  Block &body = op.getRegion().front();
  if (body.getOperations().size() != 2)
    return {};
  auto trunc = dyn_cast<arith::TruncFOp>(body.front());
  auto yield = dyn_cast<linalg::YieldOp>(body.back());
  if (!trunc || !yield || trunc.getIn() != body.getArgument(0) ||
      yield.getNumOperands() != 1 || yield.getOperand(0) != trunc.getResult())
    return {};
  return dyn_cast<FloatType>(trunc.getType());
}

/// narrow(move(rows, ...)) -> move(narrow(rows), ...): the mover then moves
/// the narrow rows (half the bytes from f32 to bf16).
struct NarrowBeforeMove : OpRewritePattern<linalg::GenericOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(linalg::GenericOp op,
                                PatternRewriter &rewriter) const override {
    FloatType to = narrowingOf(op);
    Value moved = op.getDpsInputOperand(0)->get();
    Operation *mover = moverOf(moved);
    auto rowsType =
        mover ? dyn_cast<RankedTensorType>(mover->getOperand(0).getType())
              : RankedTensorType();
    if (!to || !mover || !moved.hasOneUse() || !rowsType ||
        rowsType.getRank() != 2)
      return failure();
    rewriter.setInsertionPoint(mover);
    Location loc = op.getLoc();
    Value rows = mover->getOperand(0);
    auto narrowRows = rowsType.clone(to);
    Value init = tensor::EmptyOp::create(
        rewriter, loc, tensor::getMixedSizes(rewriter, loc, rows), to);
    auto narrowed = linalg::GenericOp::create(
        rewriter, loc, TypeRange{narrowRows}, ValueRange{rows},
        ValueRange{init}, op.getIndexingMapsArray(), op.getIteratorTypesArray(),
        [&](OpBuilder &b, Location l, ValueRange args) {
          linalg::YieldOp::create(
              b, l, arith::TruncFOp::create(b, l, to, args[0]).getResult());
        });
    rewriter.replaceOp(op, moveOther(rewriter, mover, narrowed.getResult(0),
                                     op.getResult(0).getType()));
    rewriter.eraseOp(mover);
    return success();
  }
};

/// A grouped_mlp_backward with gemm_type(bf16) rounds its f32 rows to bf16
/// first: it reads the bf16 rows instead when the program narrows them
/// anyway (the forward's GEMM operand). The same results by its definition,
/// and the f32 rows may then have that narrowing as their only reader.
struct BackwardReadsNarrowRows : OpRewritePattern<GroupedMlpBackwardOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(GroupedMlpBackwardOp op,
                                PatternRewriter &rewriter) const override {
    std::optional<Type> gemm = op.getGemmType();
    Value x = op.getX();
    auto xType = dyn_cast<RankedTensorType>(x.getType());
    if (!gemm || !gemm->isBF16() || !xType || !xType.getElementType().isF32())
      return failure();
    for (Operation *user : x.getUsers()) {
      auto narrow = dyn_cast<linalg::GenericOp>(user);
      if (!narrow || narrow.getDpsInputOperand(0)->get() != x)
        continue;
      FloatType to = narrowingOf(narrow);
      if (!to || !to.isBF16() || !narrow->getBlock() ||
          narrow->getBlock() != op->getBlock() || !narrow->isBeforeInBlock(op))
        continue;
      rewriter.modifyOpInPlace(
          op, [&] { op.getXMutable().assign(narrow.getResult(0)); });
      return success();
    }
    return failure();
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
  patterns.add<QuantizeBeforeMove, NarrowBeforeMove, BackwardReadsNarrowRows>(
      patterns.getContext());
}
