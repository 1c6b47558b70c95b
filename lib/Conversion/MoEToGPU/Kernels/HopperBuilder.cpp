//===- HopperBuilder.cpp - the Hopper layer of the builder ----------------===//
//===----------------------------------------------------------------------===//

#include "HopperBuilder.h"

using namespace mlir;
using namespace mlir::moe;

namespace mlir::moe::kernels {

/// blocks along `axis` (the contraction), which dequantizes exactly.
bool bf16OrMXAlong(Value v, unsigned axis) {
  if (auto mx = dyn_cast<MXTensorType>(v.getType()))
    return mx.getAxis() == axis;
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t && t.getElementType().isBF16();
}

/// `v` as bf16: MX operands dequantized (the new op is added to `created`),
/// bf16 ones as they are.
Value toBF16(OpBuilder &b, Location loc, Value v,
             SmallVectorImpl<Operation *> &created) {
  auto mx = dyn_cast<MXTensorType>(v.getType());
  if (!mx)
    return v;
  auto dq = DequantizeOp::create(
      b, loc, RankedTensorType::get(mx.getShape(), b.getBF16Type()), v);
  created.push_back(dq);
  return dq;
}

/// Brings a grouped GEMM to the form the bf16 wgmma kernel takes (bf16

/// The operand types of a grouped GEMM a Hopper bf16 kernel can take: static
/// bf16 lhs (rank 2) and rhs (rank `rhsRank`), an f32 result of rank
/// `resultRank`, integer offsets; outside moe.experts regions.
std::optional<Bf16GemmTypes> bf16GemmTypes(Operation *op, Value lhsValue,
                                           Value rhsValue, Value offsetsValue,
                                           int64_t rhsRank,
                                           int64_t resultRank) {
  if (op->getParentOfType<ExpertsOp>())
    return std::nullopt;
  auto lhs = dyn_cast<RankedTensorType>(lhsValue.getType());
  auto rhs = dyn_cast<RankedTensorType>(rhsValue.getType());
  auto offsets = dyn_cast<RankedTensorType>(offsetsValue.getType());
  auto result = dyn_cast<RankedTensorType>(op->getResult(0).getType());
  if (!lhs || !rhs || !offsets || !result || lhs.getRank() != 2 ||
      rhs.getRank() != rhsRank || result.getRank() != resultRank ||
      offsets.getRank() != 1 || !lhs.getElementType().isBF16() ||
      !rhs.getElementType().isBF16() || !result.getElementType().isF32() ||
      !lhs.hasStaticShape() || !rhs.hasStaticShape() ||
      !result.hasStaticShape() || !offsets.hasStaticShape() ||
      !offsets.getElementType().isInteger())
    return std::nullopt;
  return Bf16GemmTypes{lhs, rhs, offsets, result};
}

/// The declaration of libmoert's moertTensorMap2D (moert/Gpu.h).
func::FuncOp getOrCreateTensorMapDecl(ModuleOp module, SymbolTable &symbols) {
  constexpr StringLiteral name = "moertTensorMap2D";
  if (auto f = symbols.lookup<func::FuncOp>(name))
    return f;
  MLIRContext *ctx = module.getContext();
  auto i64 = IntegerType::get(ctx, 64);
  auto f = func::FuncOp::create(
      UnknownLoc::get(ctx), name,
      FunctionType::get(ctx, SmallVector<Type>(7, i64), {i64}));
  f.setPrivate();
  // Touches no device memory: no host synchronization around its calls
  // (-moe-gpu-elide-host-syncs).
  f->setAttr("moe.host_only", UnitAttr::get(ctx));
  symbols.insert(f);
  return f;
}

} // namespace mlir::moe::kernels
