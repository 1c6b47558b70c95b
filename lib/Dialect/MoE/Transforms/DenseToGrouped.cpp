//===- DenseToGrouped.cpp - dense matmuls as grouped GEMMs of one group ---===//
//
// -moe-dense-to-grouped: linalg.matmul -> moe.grouped_matmul with one group
// (moe.dense), so that dense GEMMs take the grouped GEMM kernels and the
// precision recipe (see Passes.td).
//
//===----------------------------------------------------------------------===//

#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Dialect/MoE/Transforms/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/Matchers.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEDENSETOGROUPED
#include "moe/Dialect/MoE/Transforms/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

namespace {

/// Whether `v` is a linalg.fill of 0.
bool isZeroFill(Value v) {
  auto fill = v.getDefiningOp<linalg::FillOp>();
  if (!fill)
    return false;
  return matchPattern(fill.getInputs()[0], m_AnyZeroFloat()) ||
         matchPattern(fill.getInputs()[0], m_Zero());
}

/// `v` [a, b] viewed as [1, a, b].
Value asOneGroup(OpBuilder &b, Location loc, Value v) {
  auto t = cast<RankedTensorType>(v.getType());
  auto type = RankedTensorType::get({1, t.getDimSize(0), t.getDimSize(1)},
                                    t.getElementType());
  return tensor::ExpandShapeOp::create(
      b, loc, type, v, SmallVector<ReassociationIndices>{{0, 1}, {2}});
}

void rewrite(linalg::MatmulOp mm) {
  OpBuilder b(mm);
  if (mm.getIndexingMaps() !=
      b.getAffineMapArrayAttr(
          linalg::MatmulOp::getDefaultIndexingMaps(mm.getContext())))
    return;
  Value a = mm.getInputs()[0], bv = mm.getInputs()[1];
  auto at = dyn_cast<RankedTensorType>(a.getType());
  auto bt = dyn_cast<RankedTensorType>(bv.getType());
  auto rt = dyn_cast<RankedTensorType>(mm.getResult(0).getType());
  if (!at || !bt || !rt || !at.hasStaticShape() || !bt.hasStaticShape() ||
      !isa<FloatType>(at.getElementType()) ||
      !isa<FloatType>(bt.getElementType()) || !rt.getElementType().isF32() ||
      !isZeroFill(mm.getOutputs()[0]) || at.getDimSize(0) < 1)
    return;
  Location loc = mm.getLoc();
  // B = transpose(W): the grouped GEMM reads W [N, K] transposed.
  Value w = bv;
  bool transposed = false;
  if (auto t = bv.getDefiningOp<linalg::TransposeOp>();
      t && t.getPermutation() == ArrayRef<int64_t>{1, 0}) {
    w = t.getInput();
    transposed = true;
  }
  int32_t rows = int32_t(at.getDimSize(0));
  if (int64_t(rows) != at.getDimSize(0))
    return;
  Value offsets = arith::ConstantOp::create(
      b, loc,
      DenseElementsAttr::get(RankedTensorType::get({2}, b.getI32Type()),
                             ArrayRef<int32_t>{0, rows}));
  auto gemm = GroupedMatmulOp::create(b, loc, rt, a, asOneGroup(b, loc, w),
                                      offsets, transposed);
  gemm->setAttr("moe.dense", b.getUnitAttr());
  mm.getResult(0).replaceAllUsesWith(gemm.getResult());
  mm.erase();
}

struct DenseToGroupedPass
    : moe::impl::MoEDenseToGroupedBase<DenseToGroupedPass> {
  void runOnOperation() override {
    SmallVector<linalg::MatmulOp> matmuls;
    getOperation().walk([&](linalg::MatmulOp mm) { matmuls.push_back(mm); });
    for (linalg::MatmulOp mm : matmuls)
      rewrite(mm);
  }
};

} // namespace
