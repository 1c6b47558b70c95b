//===- Activations.cpp - scalar SwiGLU arithmetic as arith ops ------------===//

#include "moe/Dialect/MoE/Utils/Activations.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"

using namespace mlir;

static Value f32Constant(OpBuilder &b, Location loc, float v) {
  return arith::ConstantFloatOp::create(b, loc, b.getF32Type(), APFloat(v));
}

Value mlir::moe::buildSigmoid(OpBuilder &b, Location loc, Value x) {
  Value ex = math::ExpOp::create(b, loc, arith::NegFOp::create(b, loc, x));
  Value den = arith::AddFOp::create(b, loc, f32Constant(b, loc, 1.0f), ex);
  return arith::DivFOp::create(b, loc, f32Constant(b, loc, 1.0f), den);
}

Value mlir::moe::buildSwiglu(OpBuilder &b, Location loc, Value gate, Value up) {
  Value ex = math::ExpOp::create(b, loc, arith::NegFOp::create(b, loc, gate));
  Value silu = arith::DivFOp::create(
      b, loc, gate,
      arith::AddFOp::create(b, loc, f32Constant(b, loc, 1.0f), ex));
  return arith::MulFOp::create(b, loc, silu, up);
}

std::pair<Value, Value> mlir::moe::buildSwigluGrad(OpBuilder &b, Location loc,
                                                   Value gate, Value up,
                                                   Value d) {
  Value s = buildSigmoid(b, loc, gate);
  auto mul = [&](Value x, Value y) {
    return arith::MulFOp::create(b, loc, x, y).getResult();
  };
  Value oneMinus = arith::SubFOp::create(b, loc, f32Constant(b, loc, 1.0f), s);
  Value inner = arith::AddFOp::create(b, loc, f32Constant(b, loc, 1.0f),
                                      mul(gate, oneMinus));
  return {mul(mul(mul(d, up), s), inner), mul(mul(d, gate), s)};
}
