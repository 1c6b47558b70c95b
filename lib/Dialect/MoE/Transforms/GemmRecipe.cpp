//===- GemmRecipe.cpp - bringing GEMM operands to a recipe's precision ----===//

#include "moe/Dialect/MoE/Transforms/GemmRecipe.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"

using namespace mlir;
using namespace mlir::moe;

int64_t mlir::moe::expertRowPadding(llvm::StringRef recipe) {
  if (recipe == "fp8-blockwise")
    return kFP8BlockTile;
  if (recipe == "mxfp8")
    return kMXBlock;
  return 1;
}

Value mlir::moe::createRoundToBF16(OpBuilder &b, Location loc, Value v) {
  auto type = cast<RankedTensorType>(v.getType());
  auto bf16Type = RankedTensorType::get(type.getShape(), b.getBF16Type());
  Value init = tensor::EmptyOp::create(b, loc, tensor::getMixedSizes(b, loc, v),
                                       b.getBF16Type());
  AffineMap id = b.getMultiDimIdentityMap(type.getRank());
  SmallVector<utils::IteratorType> par(type.getRank(),
                                       utils::IteratorType::parallel);
  auto generic = linalg::GenericOp::create(
      b, loc, TypeRange{bf16Type}, ValueRange{v}, ValueRange{init},
      ArrayRef<AffineMap>{id, id}, par,
      [](OpBuilder &nb, Location nl, ValueRange args) {
        Value r = arith::TruncFOp::create(nb, nl, nb.getBF16Type(), args[0]);
        linalg::YieldOp::create(nb, nl, r);
      });
  return generic.getResult(0);
}

Value mlir::moe::getRoundToBF16Input(Value v) {
  auto generic = v.getDefiningOp<linalg::GenericOp>();
  if (!generic || generic.getNumDpsInputs() != 1 ||
      generic.getNumDpsInits() != 1 || !generic.hasPureTensorSemantics())
    return {};
  Value in = generic.getDpsInputs()[0];
  auto inType = dyn_cast<RankedTensorType>(in.getType());
  auto outType = dyn_cast<RankedTensorType>(v.getType());
  if (!inType || !outType || !inType.getElementType().isF32() ||
      !outType.getElementType().isBF16() ||
      inType.getShape() != outType.getShape())
    return {};
  if (!llvm::all_of(generic.getIndexingMapsArray(),
                    [](AffineMap m) { return m.isIdentity(); }) ||
      generic.getNumParallelLoops() != generic.getNumLoops())
    return {};
  Block &body = generic.getRegion().front();
  if (body.getOperations().size() != 2)
    return {};
  auto trunc = dyn_cast<arith::TruncFOp>(body.front());
  auto yield = dyn_cast<linalg::YieldOp>(body.getTerminator());
  // Round to nearest even (no explicit rounding mode), no fast-math flags.
  if (!trunc || trunc.getIn() != body.getArgument(0) ||
      trunc.getRoundingmodeAttr() ||
      trunc.getFastmath().value_or(arith::FastMathFlags::none) !=
          arith::FastMathFlags::none ||
      !yield || yield.getNumOperands() != 1 ||
      yield.getOperand(0) != trunc.getResult())
    return {};
  return in;
}

bool mlir::moe::onlyRoundedToBF16(Value v) {
  if (v.use_empty())
    return false;
  for (Operation *user : v.getUsers()) {
    if (isa<tensor::ExpandShapeOp, tensor::CollapseShapeOp>(user)) {
      if (!onlyRoundedToBF16(user->getResult(0)))
        return false;
      continue;
    }
    if (user->getNumResults() != 1 ||
        getRoundToBF16Input(user->getResult(0)) != v)
      return false;
  }
  return true;
}

bool mlir::moe::isMXElementType(Type gemmType) {
  return gemmType && isa<Float8E4M3FNType, Float8E5M2Type>(gemmType);
}

MXTensorType mlir::moe::getMXTypeFor(Value v, Type elementType, unsigned axis) {
  auto type = dyn_cast<RankedTensorType>(v.getType());
  if (!type || axis >= type.getRank())
    return {};
  int64_t size = type.getDimSize(axis);
  if (ShapedType::isDynamic(size) || size % kMXBlock != 0)
    return {};
  return MXTensorType::get(v.getContext(), type.getShape(), elementType, axis,
                           kMXBlock);
}

Value mlir::moe::createGemmOperand(OpBuilder &b, Location loc, Value v,
                                   Type gemmType, unsigned axis,
                                   ScaleMode mode) {
  if (!gemmType)
    return v;
  if (isMXElementType(gemmType)) {
    MXTensorType mx = getMXTypeFor(v, gemmType, axis);
    assert(mx && "the quantized dimension must be a static multiple of 32");
    return QuantizeOp::create(b, loc, mx, v, mode);
  }
  assert(gemmType.isBF16() && "gemm_type is bf16 or an MX element type");
  if (!cast<RankedTensorType>(v.getType()).getElementType().isF32())
    return v;
  return createRoundToBF16(b, loc, v);
}

bool mlir::moe::isGemmOperandOf(Value operand, Value source, Type gemmType,
                                unsigned axis, ScaleMode mode) {
  if (!gemmType)
    return operand == source;
  if (isMXElementType(gemmType)) {
    auto q = operand.getDefiningOp<QuantizeOp>();
    if (!q || q.getInput() != source || q.getScaleMode() != mode)
      return false;
    auto mx = dyn_cast<MXTensorType>(q.getType());
    return mx && mx.getElementType() == gemmType && mx.getAxis() == axis &&
           mx.getBlockSize() == kMXBlock;
  }
  if (!gemmType.isBF16())
    return false;
  auto sourceType = dyn_cast<RankedTensorType>(source.getType());
  if (!sourceType)
    return false;
  if (!sourceType.getElementType().isF32())
    return operand == source;
  return getRoundToBF16Input(operand) == source;
}
