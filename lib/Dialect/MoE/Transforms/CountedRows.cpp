//===- CountedRows.cpp - the rows a cross-entropy counts ------------------===//

#include "moe/Dialect/MoE/Transforms/CountedRows.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"

using namespace mlir;

Value moe::buildCountedRows(OpBuilder &b, Location loc, Value labels,
                            int64_t vocab) {
  MLIRContext *ctx = b.getContext();
  Type it = cast<ShapedType>(labels.getType()).getElementType();
  Value zero = arith::ConstantOp::create(b, loc, b.getF32FloatAttr(0));
  Value init =
      linalg::FillOp::create(
          b, loc, zero,
          tensor::EmptyOp::create(b, loc, ArrayRef<int64_t>{}, b.getF32Type())
              .getResult())
          .getResult(0);
  AffineExpr d0 = getAffineDimExpr(0, ctx);
  return linalg::GenericOp::create(
             b, loc, TypeRange{init.getType()}, labels, init,
             {AffineMap::get(1, 0, {d0}, ctx), AffineMap::get(1, 0, {}, ctx)},
             {utils::IteratorType::reduction},
             [&](OpBuilder &nb, Location l, ValueRange a) {
               Value lo =
                   arith::ConstantOp::create(nb, l, nb.getIntegerAttr(it, 0));
               Value hi = arith::ConstantOp::create(
                   nb, l, nb.getIntegerAttr(it, vocab));
               Value counted = arith::AndIOp::create(
                   nb, l,
                   arith::CmpIOp::create(nb, l, arith::CmpIPredicate::sge, a[0],
                                         lo),
                   arith::CmpIOp::create(nb, l, arith::CmpIPredicate::slt, a[0],
                                         hi));
               Value one =
                   arith::ConstantOp::create(nb, l, nb.getF32FloatAttr(1));
               Value none =
                   arith::ConstantOp::create(nb, l, nb.getF32FloatAttr(0));
               linalg::YieldOp::create(
                   nb, l,
                   ValueRange{arith::AddFOp::create(
                       nb, l, a[1],
                       arith::SelectOp::create(nb, l, counted, one, none))});
             })
      .getResult(0);
}
