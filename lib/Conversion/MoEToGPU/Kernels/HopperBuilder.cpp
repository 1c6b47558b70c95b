//===- HopperBuilder.cpp - the Hopper layer of the builder ----------------===//
//===----------------------------------------------------------------------===//

#include "HopperBuilder.h"

using namespace mlir;
using namespace mlir::moe;

namespace mlir::moe::kernels {

/// Whether `v` is a bf16 tensor; otherwise says what it is.
static bool bf16Operand(Value v, StringRef name, WhyNot why) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  if (t && t.getElementType().isBF16())
    return true;
  noKernel(why,
           "the {0} is {1}: the wgmma kernels take bf16 or MX operands (a "
           "precision recipe, bf16 or mxfp8)",
           name, t ? t.getElementType() : v.getType());
  return false;
}

/// Whether `v` can feed a Hopper bf16 kernel: bf16 already, MX with its
/// blocks along `axis` (the contraction), or blockwise FP8 with
/// power-of-two scales, which dequantize exactly.
bool bf16OrMXAlong(Value v, unsigned axis, StringRef name, WhyNot why) {
  if (auto fp8 = dyn_cast<FP8BlockTensorType>(v.getType())) {
    if (fp8.getPow2())
      return true;
    noKernel(why,
             "the {0} is blockwise FP8 with f32 scales, which have no exact "
             "bf16 form (block-scales=pow2 has one); the FP8 wgmma kernels "
             "take 1 x 128 / 128 x 128 tiles (and 128 x 1 weight-gradient "
             "operands over groups padded to 128 rows) with K and N "
             "multiples of 128",
             name);
    return false;
  }
  if (auto mx = dyn_cast<MXTensorType>(v.getType())) {
    if (mx.getAxis() == axis)
      return true;
    noKernel(why,
             "the {0} is MX with blocks along dim {1}, not along the "
             "contraction (dim {2})",
             name, mx.getAxis(), axis);
    return false;
  }
  return bf16Operand(v, name, why);
}

/// `v` as bf16: block-scaled operands dequantized (the new op is added to
/// `created`), bf16 ones as they are.
Value toBF16(OpBuilder &b, Location loc, Value v,
             SmallVectorImpl<Operation *> &created) {
  RankedTensorType data = blockScaledParts(v.getType()).first;
  if (!data)
    return v;
  auto dq = DequantizeOp::create(b, loc, data.clone(b.getBF16Type()), v);
  created.push_back(dq);
  return dq;
}

Value padWithZeros(OpBuilder &b, Location loc, Value v, ArrayRef<int64_t> shape,
                   SmallVectorImpl<Operation *> &created) {
  auto t = cast<RankedTensorType>(v.getType());
  if (t.getShape() == shape)
    return v;
  SmallVector<OpFoldResult> low, high;
  for (auto [from, to] : llvm::zip(t.getShape(), shape)) {
    low.push_back(b.getIndexAttr(0));
    high.push_back(b.getIndexAttr(to - from));
  }
  auto zero =
      arith::ConstantOp::create(b, loc, b.getZeroAttr(t.getElementType()));
  auto pad =
      tensor::PadOp::create(b, loc, t.clone(shape), v, low, high, Value(zero));
  created.append({zero, pad});
  return pad;
}

Value leadingPart(OpBuilder &b, Location loc, Value v,
                  ArrayRef<int64_t> shape) {
  auto t = cast<RankedTensorType>(v.getType());
  if (t.getShape() == shape)
    return v;
  SmallVector<int64_t> zeros(shape.size(), 0), ones(shape.size(), 1);
  return tensor::ExtractSliceOp::create(b, loc, t.clone(shape), v, ValueRange{},
                                        ValueRange{}, ValueRange{}, zeros,
                                        shape, ones);
}

/// The operand types of a grouped GEMM a Hopper bf16 kernel can take: static
/// bf16 lhs (rank 2) and rhs (rank `rhsRank`), an f32 result of rank
/// `resultRank`, integer offsets; outside moe.experts regions.
std::optional<Bf16GemmTypes> bf16GemmTypes(Operation *op, Value lhsValue,
                                           Value rhsValue, Value offsetsValue,
                                           int64_t rhsRank, int64_t resultRank,
                                           WhyNot why) {
  if (op->getParentOfType<ExpertsOp>())
    return noKernel(why, "inside a moe.experts region (not grouped)");
  if (!bf16Operand(lhsValue, "lhs", why) || !bf16Operand(rhsValue, "rhs", why))
    return std::nullopt;
  auto lhs = cast<RankedTensorType>(lhsValue.getType());
  auto rhs = cast<RankedTensorType>(rhsValue.getType());
  auto offsets = dyn_cast<RankedTensorType>(offsetsValue.getType());
  auto result = dyn_cast<RankedTensorType>(op->getResult(0).getType());
  if (!offsets || !result || lhs.getRank() != 2 || rhs.getRank() != rhsRank ||
      result.getRank() != resultRank || offsets.getRank() != 1 ||
      !offsets.getElementType().isInteger())
    return noKernel(why, "operand ranks or types the kernels do not take");
  if (!result.getElementType().isF32())
    return noKernel(why, "the result is {0}, not f32", result.getElementType());
  if (!lhs.hasStaticShape() || !rhs.hasStaticShape() ||
      !result.hasStaticShape() || !offsets.hasStaticShape())
    return noKernel(why, "a dynamic shape (the kernels are generated for "
                         "static shapes)");
  return Bf16GemmTypes{lhs, rhs, offsets, result};
}

/// The declaration of libmoert's function `name` taking `args` i64 values
/// and returning a tensor map's address.
static func::FuncOp getOrCreateMapDecl(ModuleOp module, SymbolTable &symbols,
                                       StringRef name, unsigned args) {
  if (auto f = symbols.lookup<func::FuncOp>(name))
    return f;
  MLIRContext *ctx = module.getContext();
  auto i64 = IntegerType::get(ctx, 64);
  auto f = func::FuncOp::create(
      UnknownLoc::get(ctx), name,
      FunctionType::get(ctx, SmallVector<Type>(args, i64), {i64}));
  f.setPrivate();
  // Touches no device memory: no host synchronization around its calls
  // (-moe-gpu-elide-host-syncs).
  f->setAttr("moe.host_only", UnitAttr::get(ctx));
  symbols.insert(f);
  return f;
}

func::FuncOp getOrCreateTensorMapDecl(ModuleOp module, SymbolTable &symbols) {
  return getOrCreateMapDecl(module, symbols, "moertTensorMap2D", 7);
}

func::FuncOp getOrCreateTensorMap3DDecl(ModuleOp module, SymbolTable &symbols) {
  return getOrCreateMapDecl(module, symbols, "moertTensorMap3D", 9);
}

} // namespace mlir::moe::kernels
