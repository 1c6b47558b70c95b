//===- FuseRowGathers.cpp - pair kernels reading gathered rows ------------===//
//
// -moe-gpu-fuse-row-gathers: a pair of MX round trips (MXRoundTripPair.cpp)
// or a blockwise FP8 pair quantize (FP8BlockRoundTrip.cpp) of a dispatch's
// gathered rows becomes the pair kernel reading the rows through the
// gather's source indices, from the tokens (or from the scaled copies of a
// combine's gradient, which the kernel computes itself): the gathered rows
// are never written.
//
//===----------------------------------------------------------------------===//

#include "Kernels/KernelBuilder.h"
#include "Kernels/Kernels.h"
#include "moe/Conversion/MoEToLinalg/MoEToLinalg.h"
#include "moe/Conversion/Passes.h"
#include "moe/Dialect/MoE/Utils/LiveRows.h"

#include "mlir/Dialect/Bufferization/IR/Bufferization.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEGPUFUSEROWGATHERS
#include "moe/Conversion/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::kernels;

namespace {

/// The tokens a dispatch's row gather (see kGatheredRowsAttr) extracts
/// from, or null.
Value gatheredTokens(linalg::GenericOp gather) {
  Value tokens;
  gather.getBody()->walk([&](tensor::ExtractOp extract) {
    Value t = extract.getTensor();
    if (!gather->isAncestor(t.getParentRegion()->getParentOp()))
      tokens = t;
  });
  return tokens;
}

/// Rows [T * K, H] computed as scale[t, k] * rows[t, :] (a [T, K, H]
/// product, collapsed).
struct ScaledCopies {
  Value rows, scale;
  int64_t perRow;
  bool scaleFirst;
};

/// `producer` (the generic under `tokens`' reshapes) as scaled copies:
/// generic(scale [T, K] at (t, k), rows [T, H] at (t, h)) -> [T, K, H] whose
/// body is one f32 mulf of the two, collapsed [[0, 1], [2]] into tokens.
std::optional<ScaledCopies> matchScaledCopies(Value producer, Value tokens) {
  auto generic = producer.getDefiningOp<linalg::GenericOp>();
  auto collapse = tokens.getDefiningOp<tensor::CollapseShapeOp>();
  if (!generic || !collapse || collapse.getSrc() != producer ||
      generic.getNumDpsInputs() != 2 || generic.getNumResults() != 1 ||
      collapse.getReassociationIndices() !=
          SmallVector<ReassociationIndices>{{0, 1}, {2}})
    return std::nullopt;
  MLIRContext *ctx = generic.getContext();
  AffineExpr t, k, h;
  bindDims(ctx, t, k, h);
  SmallVector<AffineMap> maps = generic.getIndexingMapsArray();
  if (maps[0] != AffineMap::get(3, 0, {t, k}, ctx) ||
      maps[1] != AffineMap::get(3, 0, {t, h}, ctx) || !maps[2].isIdentity() ||
      generic.getNumParallelLoops() != 3)
    return std::nullopt;
  Block *body = generic.getBody();
  if (body->getOperations().size() != 2)
    return std::nullopt;
  auto mul = dyn_cast<arith::MulFOp>(body->front());
  auto yield = dyn_cast<linalg::YieldOp>(body->back());
  if (!mul || !yield || yield.getValues() != ValueRange{mul.getResult()} ||
      !mul.getType().isF32() || mul.getFastmath() != arith::FastMathFlags::none)
    return std::nullopt;
  Value a = body->getArgument(0), r = body->getArgument(1);
  bool scaleFirst = mul.getLhs() == a && mul.getRhs() == r;
  if (!scaleFirst && !(mul.getLhs() == r && mul.getRhs() == a))
    return std::nullopt;
  Value scale = generic.getDpsInputOperand(0)->get();
  Value rows = generic.getDpsInputOperand(1)->get();
  auto scaleType = cast<RankedTensorType>(scale.getType());
  auto rowsType = cast<RankedTensorType>(rows.getType());
  if (!scaleType.hasStaticShape() || !rowsType.hasStaticShape() ||
      !scaleType.getElementType().isF32() || !rowsType.getElementType().isF32())
    return std::nullopt;
  return ScaledCopies{rows, scale, scaleType.getDimSize(1), scaleFirst};
}

/// Whether `n` is the last entry of `offsets` clamped to [0, rows], as
/// the lowering bounds live rows (boundRows): minsi(maxsi(index_cast(
/// offsets[last]), 0), rows).
bool isOffsetsEnd(Value n, Value offsets, int64_t rows) {
  auto min = n.getDefiningOp<arith::MinSIOp>();
  auto max = min ? min.getLhs().getDefiningOp<arith::MaxSIOp>() : nullptr;
  auto cast = max ? max.getLhs().getDefiningOp<arith::IndexCastOp>() : nullptr;
  auto extract =
      cast ? cast.getIn().getDefiningOp<tensor::ExtractOp>() : nullptr;
  auto type = dyn_cast<RankedTensorType>(offsets.getType());
  if (!extract || extract.getTensor() != offsets || !type ||
      type.getRank() != 1 || !type.hasStaticShape() ||
      extract.getIndices().size() != 1)
    return false;
  return getConstantIntValue(min.getRhs()) == rows &&
         getConstantIntValue(max.getRhs()) == 0 &&
         getConstantIntValue(extract.getIndices()[0]) == type.getDimSize(0) - 1;
}

/// A dispatch's rows gathered only up to the groups' end (a dispatch whose
/// later rows nothing reads, LiveRows.h): `rows` as insert_slice(gather,
/// alloc_tensor)[0, 0][n, C] with n the end of `offsets`; the insert, or
/// null.
tensor::InsertSliceOp boundedGather(Value rows, Value offsets) {
  auto insert = rows.getDefiningOp<tensor::InsertSliceOp>();
  auto type = dyn_cast<RankedTensorType>(rows.getType());
  if (!insert || !type || type.getRank() != 2 || !type.hasStaticShape() ||
      !insert.getDest().getDefiningOp<bufferization::AllocTensorOp>() ||
      !insert.hasUnitStride() ||
      !llvm::all_of(insert.getMixedOffsets(), isZeroInteger) ||
      insert.getMixedSizes().size() != 2 ||
      getConstantIntValue(insert.getMixedSizes()[1]) != type.getDimSize(1))
    return {};
  auto n = dyn_cast<Value>(insert.getMixedSizes()[0]);
  auto gather = insert.getSource().getDefiningOp<linalg::GenericOp>();
  if (!n || !gather || !gather->hasOneUse() ||
      !isOffsetsEnd(n, offsets, type.getDimSize(0)))
    return {};
  return insert;
}

/// A pair round trip (or blockwise FP8 pair quantize) of gathered rows ->
/// the pair kernel reading the rows through the gather's source indices
/// (see -moe-gpu-fuse-row-gathers).
void fuseRowGather(func::CallOp call, ModuleOp module, SymbolTable &symbols) {
  auto callee = symbols.lookup<func::FuncOp>(call.getCallee());
  std::optional<MXRoundTripPair> g =
      callee ? roundTripPairOf(callee) : std::nullopt;
  // A blockwise FP8 pair: (rows[, offsets]).
  bool fp8 = isFP8BlockPair(callee);
  if (g ? call.getNumOperands() != 1 ||
              call.getNumResults() != unsigned(g->withK) + unsigned(g->withN)
        : !fp8 || call.getNumOperands() < 1)
    return;
  // The gathered rows, read only by such calls (one, or the two halves of
  // a split pair), as their first operand. A blockwise FP8 pair computing
  // the rows before the groups' end reads a gather bounded there too.
  Value gathered = call.getOperand(0);
  auto gather = gathered.getDefiningOp<linalg::GenericOp>();
  tensor::InsertSliceOp bounded;
  if (!gather && fp8 && call.getNumOperands() == 2)
    if ((bounded = boundedGather(gathered, call.getOperand(1))))
      gather = bounded.getSource().getDefiningOp<linalg::GenericOp>();
  auto pairCall = [&](OpOperand &use) {
    auto c = dyn_cast<func::CallOp>(use.getOwner());
    auto f = c ? symbols.lookup<func::FuncOp>(c.getCallee()) : func::FuncOp();
    return f && use.getOperandNumber() == 0 &&
           ((c.getNumOperands() == 1 && roundTripPairOf(f)) ||
            isFP8BlockPair(f));
  };
  if (!gather || !gather->hasAttr(kGatheredRowsAttr) ||
      !llvm::all_of(gathered.getUses(), pairCall) ||
      gather.getNumDpsInputs() != 1)
    return;
  Value source = gather.getDpsInputOperand(0)->get();
  Value tokens = gatheredTokens(gather);
  // Tokens an elementwise kernel computes for this gather alone are left to
  // the gather, which computes the elements it reads (FuseIntoExtract in
  // -moe-gpu-fuse-elementwise): read by the pair kernel, they would be
  // written in full first. The one such producer the kernel computes
  // itself: scaled copies of rows (a combine's gradient, w[t, k] * g[t]).
  Value producer = tokens;
  while (producer &&
         isa_and_nonnull<tensor::CollapseShapeOp, tensor::ExpandShapeOp>(
             producer.getDefiningOp()))
    producer = producer.getDefiningOp()->getOperand(0);
  std::optional<ScaledCopies> scaled;
  if (producer && producer.getDefiningOp<linalg::GenericOp>() &&
      producer.hasOneUse()) {
    scaled = matchScaledCopies(producer, tokens);
    if (!scaled)
      return;
  }
  auto sourceType = dyn_cast<RankedTensorType>(source.getType());
  auto tokensType =
      tokens ? dyn_cast<RankedTensorType>(tokens.getType()) : nullptr;
  auto rowsType = cast<RankedTensorType>(gathered.getType());
  // (Bounded, the source has the live rows' entries: dynamic.)
  if (!sourceType || !tokensType ||
      (!bounded && !sourceType.hasStaticShape()) ||
      !tokensType.hasStaticShape() || sourceType.getRank() != 1 ||
      !sourceType.getElementType().isIndex() || tokensType.getRank() != 2 ||
      rowsType.getRank() != 2 ||
      (!bounded && sourceType.getDimSize(0) != rowsType.getDimSize(0)) ||
      tokensType.getDimSize(1) != rowsType.getDimSize(1) ||
      tokensType.getElementType() != rowsType.getElementType() ||
      tokensType.getDimSize(0) < 1 ||
      tokensType.getDimSize(0) >= (int64_t(1) << 31))
    return;
  Location loc = call.getLoc();
  OpBuilder b(call);
  if (bounded) {
    // The source indices as a [rows] tensor (entries past the groups' end
    // unspecified; the kernel reads those before it only).
    Value all = tensor::EmptyOp::create(b, loc, {rowsType.getDimSize(0)},
                                        b.getIndexType());
    source = tensor::InsertSliceOp::create(
        b, loc, source, all, ArrayRef<OpFoldResult>{b.getIndexAttr(0)},
        ArrayRef<OpFoldResult>{bounded.getMixedSizes()[0]},
        ArrayRef<OpFoldResult>{b.getIndexAttr(1)});
  }
  int64_t sourceRows = tokensType.getDimSize(0);
  GatheredRows rows{sourceRows};
  if (scaled) {
    // The product's operand order is part of the kernel (rounding of a
    // product does not depend on it, but the IR it was matched from does).
    rows.scaled = true;
    rows.perRow = scaled->perRow;
    rows.scaleFirst = scaled->scaleFirst;
  }
  func::CallOp fused;
  if (fp8) {
    fused = fp8BlockPairGather(b, call, module, symbols,
                               scaled ? scaled->rows : tokens, source,
                               scaled ? scaled->scale : Value(), rows);
    if (!fused)
      return;
  } else {
    SmallVector<Value> args = {tokens, source};
    if (scaled)
      args = {scaled->rows, source, scaled->scale};
    func::FuncOp kernel = getOrCreateRoundTripPairGather(
        module, symbols, *g, g->name() + rows.suffix(),
        llvm::to_vector(ValueRange(args).getTypes()),
        llvm::map_to_vector(call.getResultTypes(),
                            [](Type t) { return cast<RankedTensorType>(t); }),
        loc, rows);
    fused = func::CallOp::create(b, loc, kernel, args);
  }
  call.replaceAllUsesWith(fused.getResults());
  call.erase();
  if (bounded && bounded->use_empty())
    bounded.erase();
  // The product and its reshapes, now unread, go with the next
  // canonicalization (a tensor.dim of the tokens may still read them).
  if (gather->use_empty())
    gather.erase();
  if (SymbolTable::symbolKnownUseEmpty(callee, module))
    symbols.erase(callee);
}

struct MoEGPUFuseRowGathersPass
    : moe::impl::MoEGPUFuseRowGathersBase<MoEGPUFuseRowGathersPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    SymbolTable symbols(module);
    SmallVector<func::CallOp> calls;
    module.walk([&](func::CallOp call) { calls.push_back(call); });
    for (func::CallOp call : calls)
      fuseRowGather(call, module, symbols);
  }
};

} // namespace
