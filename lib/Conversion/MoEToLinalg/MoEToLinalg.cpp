//===- MoEToLinalg.cpp - moe to linalg/tensor/scf/arith/math --------------===//
//
// The reference semantics of every moe op, as upstream tensor-level IR. The
// code favours being obviously right over being fast: GPU lowerings bring
// their own kernels; this is what they are checked against.
//
//===----------------------------------------------------------------------===//

#include "Emitter.h"

#include "moe/Conversion/MoEToLinalg/MoEToLinalg.h"
#include "moe/Conversion/Passes.h"
#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Dialect/MoE/Transforms/Passes.h"
#include "moe/Dialect/MoE/Utils/Activations.h"
#include "moe/Dialect/MoE/Utils/LiveRows.h"
#include "moe/Dialect/MoE/Utils/MXNumerics.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Func/Transforms/FuncConversions.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/SCF/Transforms/Patterns.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

namespace mlir::moe {
#define GEN_PASS_DEF_CONVERTMOETOLINALG
#include "moe/Conversion/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::detail;

//===----------------------------------------------------------------------===//
// Building blocks
//===----------------------------------------------------------------------===//

namespace mlir::moe::detail {

/// Quantizes `x` (shape of `type`) to (data, scales) with the MX rules.
std::pair<Value, Value> quantizeMX(Emitter &e, Value x, MXTensorType type,
                                   ScaleMode mode) {
  MLIRContext *ctx = e.b.getContext();
  BlockView view(type);
  MXFormat fmt = MXFormat::get(type.getElementType());
  Value xe = view.expand(e, x);
  SmallVector<IteratorType> par(view.expandedRank(), IteratorType::parallel);
  SmallVector<IteratorType> red;
  Type f32 = e.b.getF32Type(), i8 = e.b.getI8Type();

  // 1. amax per block (NaN-propagating). The block's 32 elements are the
  // innermost (reduction) loop, whichever axis is scaled: the loops around
  // it run over neighbouring blocks, whose elements are neighbours in
  // memory (on a GPU: consecutive threads, coalesced loads; with the
  // reduction in the middle, an axis other than the last gave each thread
  // a whole row of blocks).
  int64_t rank = view.expandedRank();
  SmallVector<AffineExpr> inExprs, scaleExprs;
  for (int64_t j = 0, d = 0; j < rank; ++j)
    inExprs.push_back(j == view.blockDim ? e.b.getAffineDimExpr(rank - 1)
                                         : e.b.getAffineDimExpr(d++));
  for (int64_t d = 0; d + 1 < rank; ++d)
    scaleExprs.push_back(e.b.getAffineDimExpr(d));
  AffineMap blocksIn = AffineMap::get(rank, 0, inExprs, ctx);
  AffineMap blocksOut = AffineMap::get(rank, 0, scaleExprs, ctx);
  red = par;
  red.back() = IteratorType::reduction;
  Value amaxInit = e.zeros(view.scaleSizes(e, x), f32);
  Value amax = e.generic(
      xe, amaxInit, {blocksIn, blocksOut}, red,
      [&](OpBuilder &nb, Location nl, ValueRange a) {
        Emitter n{nb, nl};
        Value mag = math::AbsFOp::create(nb, nl, n.toF32(a[0]));
        return SmallVector<Value>{arith::MaximumFOp::create(nb, nl, a[1], mag)};
      })[0];
  // 2. the scale byte per block.
  Value scales =
      e.map(amax, type.getScaleType(), [&](Emitter &n, ValueRange a) {
        Value byte = buildScaleByte(n.b, n.loc, a[0], fmt, mode);
        return arith::BitcastOp::create(n.b, n.loc, type.getScaleType(), byte)
            .getResult();
      });
  // 3. the elements.
  Value dataInit = e.empty(view.expandedSizes(e, x), type.getElementType());
  Value data = e.generic(
      {xe, scales}, dataInit,
      {view.identity(ctx), view.toScales(ctx), view.identity(ctx)}, par,
      [&](OpBuilder &nb, Location nl, ValueRange a) {
        Emitter n{nb, nl};
        Value byte = arith::BitcastOp::create(nb, nl, i8, a[1]);
        Value v = arith::MulFOp::create(nb, nl, n.toF32(a[0]),
                                        buildInverseScale(nb, nl, byte));
        Value code = buildEncode(nb, nl, v, fmt);
        return SmallVector<Value>{
            arith::BitcastOp::create(nb, nl, type.getElementType(), code)};
      })[0];
  return {view.collapse(e, data, type.getElementType()), scales};
}

/// (data, scales) of `type` -> a float tensor of element type `elt`.
Value dequantizeMX(Emitter &e, Value data, Value scales, MXTensorType type,
                   Type elt) {
  MLIRContext *ctx = e.b.getContext();
  BlockView view(type);
  MXFormat fmt = MXFormat::get(type.getElementType());
  Type i8 = e.b.getI8Type();
  Value de = view.expand(e, data);
  Value init = e.empty(view.expandedSizes(e, data), elt);
  SmallVector<IteratorType> par(view.expandedRank(), IteratorType::parallel);
  Value out = e.generic(
      {de, scales}, init,
      {view.identity(ctx), view.toScales(ctx), view.identity(ctx)}, par,
      [&](OpBuilder &nb, Location nl, ValueRange a) {
        Emitter n{nb, nl};
        Value q = buildDecode(nb, nl,
                              arith::BitcastOp::create(nb, nl, i8, a[0]), fmt);
        Value s =
            buildScaleValue(nb, nl, arith::BitcastOp::create(nb, nl, i8, a[1]));
        return SmallVector<Value>{
            n.fromF32(arith::MulFOp::create(nb, nl, q, s), elt)};
      })[0];
  return view.collapse(e, out, elt);
}

namespace {
/// A tensor of a blockwise FP8 type's shape seen as tiles: padded to whole
/// tiles, then every dimension d split into [d / block, block]. Computations
/// run over (tile indices..., offsets in the tile...), the offsets innermost.
struct TileView {
  FP8BlockTensorType type;
  SmallVector<OpFoldResult> sizes, tiles, padded;

  TileView(Emitter &e, FP8BlockTensorType type, Value like) : type(type) {
    sizes = e.sizes(like);
    for (auto [size, block] : llvm::zip(sizes, type.getBlock())) {
      if (std::optional<int64_t> s = getConstantIntValue(size)) {
        int64_t n = (*s + block - 1) / block;
        tiles.push_back(e.b.getIndexAttr(n));
        padded.push_back(e.b.getIndexAttr(n * block));
        continue;
      }
      Value n = arith::CeilDivUIOp::create(e.b, e.loc, cast<Value>(size),
                                           e.idx(block));
      tiles.push_back(n);
      padded.push_back(
          arith::MulIOp::create(e.b, e.loc, n, e.idx(block)).getResult());
    }
  }
  int64_t rank() const { return type.getRank(); }
  SmallVector<ReassociationIndices> reassociation() const {
    SmallVector<ReassociationIndices> r;
    for (int64_t i = 0; i < rank(); ++i)
      r.push_back({2 * i, 2 * i + 1});
    return r;
  }
  SmallVector<OpFoldResult> expandedSizes(Emitter &e) const {
    SmallVector<OpFoldResult> s;
    for (auto [n, block] : llvm::zip(tiles, type.getBlock())) {
      s.push_back(n);
      s.push_back(e.b.getIndexAttr(block));
    }
    return s;
  }
  /// `t` (the type's shape) padded with `pad` to whole tiles and expanded.
  Value expand(Emitter &e, Value t, Value pad) const {
    auto tt = cast<RankedTensorType>(t.getType());
    SmallVector<OpFoldResult> low(rank(), e.b.getIndexAttr(0)), high;
    bool padding = false;
    for (auto [size, full] : llvm::zip(sizes, padded)) {
      std::optional<int64_t> s = getConstantIntValue(size),
                             f = getConstantIntValue(full);
      if (s && f) {
        high.push_back(e.b.getIndexAttr(*f - *s));
        padding |= *f != *s;
        continue;
      }
      high.push_back(arith::SubIOp::create(
                         e.b, e.loc,
                         getValueOrCreateConstantIndexOp(e.b, e.loc, full),
                         getValueOrCreateConstantIndexOp(e.b, e.loc, size))
                         .getResult());
      padding = true;
    }
    if (padding) {
      SmallVector<int64_t> shape;
      for (OpFoldResult f : padded)
        shape.push_back(getConstantIntValue(f).value_or(ShapedType::kDynamic));
      t = tensor::PadOp::create(
          e.b, e.loc, RankedTensorType::get(shape, tt.getElementType()), t, low,
          high, pad);
    }
    SmallVector<OpFoldResult> outSizes = expandedSizes(e);
    SmallVector<int64_t> shape;
    for (OpFoldResult s : outSizes)
      shape.push_back(getConstantIntValue(s).value_or(ShapedType::kDynamic));
    return tensor::ExpandShapeOp::create(
        e.b, e.loc, RankedTensorType::get(shape, tt.getElementType()), t,
        reassociation(), outSizes);
  }
  /// The inverse of `expand`: back to the type's shape, padding dropped.
  Value collapse(Emitter &e, Value t) const {
    auto tt = cast<RankedTensorType>(t.getType());
    SmallVector<int64_t> shape;
    for (OpFoldResult f : padded)
      shape.push_back(getConstantIntValue(f).value_or(ShapedType::kDynamic));
    Value whole = tensor::CollapseShapeOp::create(
        e.b, e.loc, RankedTensorType::get(shape, tt.getElementType()), t,
        reassociation());
    if (sizes == padded)
      return whole;
    SmallVector<OpFoldResult> zero(rank(), e.b.getIndexAttr(0)),
        one(rank(), e.b.getIndexAttr(1));
    return tensor::ExtractSliceOp::create(e.b, e.loc, whole, zero, sizes, one);
  }
  /// Loops (tiles..., offsets...) -> the expanded tensor.
  AffineMap elements(MLIRContext *ctx) const {
    SmallVector<AffineExpr> exprs;
    for (int64_t i = 0; i < rank(); ++i) {
      exprs.push_back(getAffineDimExpr(i, ctx));
      exprs.push_back(getAffineDimExpr(rank() + i, ctx));
    }
    return AffineMap::get(2 * rank(), 0, exprs, ctx);
  }
  /// Loops (tiles..., offsets...) -> the scales (one per tile).
  AffineMap scales(MLIRContext *ctx) const {
    SmallVector<AffineExpr> exprs;
    for (int64_t i = 0; i < rank(); ++i)
      exprs.push_back(getAffineDimExpr(i, ctx));
    return AffineMap::get(2 * rank(), 0, exprs, ctx);
  }
};
} // namespace

std::pair<Value, Value> quantizeFP8Block(Emitter &e, Value x,
                                         FP8BlockTensorType type) {
  MLIRContext *ctx = e.b.getContext();
  MXFormat fmt = MXFormat::get(type.getElementType());
  TileView view(e, type, x);
  Type f32 = e.b.getF32Type();
  int64_t rank = view.rank();
  // Padding is zero: it leaves every amax as it is.
  Value xe = view.expand(e, x, e.zeroOf(getElementTypeOrSelf(x.getType())));
  AffineMap elements = view.elements(ctx), scales = view.scales(ctx);
  SmallVector<IteratorType> its(2 * rank, IteratorType::parallel);
  SmallVector<IteratorType> red = its;
  for (int64_t i = rank; i < 2 * rank; ++i)
    red[i] = IteratorType::reduction;

  // 1. amax per tile (NaN-propagating), the tile's elements innermost.
  Value amax = e.generic(
      xe, e.zeros(view.tiles, f32), {elements, scales}, red,
      [&](OpBuilder &nb, Location nl, ValueRange a) {
        Emitter n{nb, nl};
        Value mag = math::AbsFOp::create(nb, nl, n.toF32(a[0]));
        return SmallVector<Value>{arith::MaximumFOp::create(nb, nl, a[1], mag)};
      })[0];
  // 2. the factor per tile, and the stored scale 1 / factor.
  Value factor = e.map(amax, f32, [&](Emitter &n, ValueRange a) {
    return buildFP8BlockScale(n.b, n.loc, a[0], fmt, type.getPow2());
  });
  Value stored = e.map(factor, f32, [&](Emitter &n, ValueRange a) {
    return arith::DivFOp::create(n.b, n.loc, n.f32(1.0), a[0]).getResult();
  });
  // 3. the elements.
  Value data = e.generic(
      {xe, factor}, e.empty(view.expandedSizes(e), type.getElementType()),
      {elements, scales, elements}, its,
      [&](OpBuilder &nb, Location nl, ValueRange a) {
        Emitter n{nb, nl};
        Value v = arith::MulFOp::create(nb, nl, n.toF32(a[0]), a[1]);
        Value code = buildEncode(nb, nl, v, fmt);
        return SmallVector<Value>{
            arith::BitcastOp::create(nb, nl, type.getElementType(), code)};
      })[0];
  return {view.collapse(e, data), stored};
}

Value dequantizeFP8Block(Emitter &e, Value data, Value scales,
                         FP8BlockTensorType type, Type elt) {
  MLIRContext *ctx = e.b.getContext();
  MXFormat fmt = MXFormat::get(type.getElementType());
  TileView view(e, type, data);
  int64_t rank = view.rank();
  Type i8 = e.b.getI8Type();
  Value de = view.expand(e, data, e.zeroOf(type.getElementType()));
  AffineMap elements = view.elements(ctx), tilesMap = view.scales(ctx);
  SmallVector<IteratorType> its(2 * rank, IteratorType::parallel);
  Value out =
      e.generic({de, scales}, e.empty(view.expandedSizes(e), elt),
                {elements, tilesMap, elements}, its,
                [&](OpBuilder &nb, Location nl, ValueRange a) {
                  Emitter n{nb, nl};
                  Value q = buildDecode(
                      nb, nl, arith::BitcastOp::create(nb, nl, i8, a[0]), fmt);
                  return SmallVector<Value>{
                      n.fromF32(arith::MulFOp::create(nb, nl, q, a[1]), elt)};
                })[0];
  return view.collapse(e, out);
}

bool boundRows(Emitter &e, Operation *op, const LiveRowBounds *live,
               ConversionPatternRewriter &rewriter, int64_t rows) {
  if (!live || ShapedType::isDynamic(rows))
    return false;
  auto it = live->find(op);
  if (it == live->end())
    return false;
  RowBound bound = it->second;
  Value n;
  if (bound.offsets) {
    // The last offset.
    Value offsets = rewriter.getRemappedValue(bound.offsets);
    auto type = dyn_cast_or_null<RankedTensorType>(offsets ? offsets.getType()
                                                           : Type());
    if (!type || type.getRank() != 1 || type.isDynamicDim(0))
      return false;
    n = e.extractIndex(offsets, e.idx(type.getDimSize(0) - 1));
  } else {
    // The sum of the counts (a reduction to a 0-d tensor, read back).
    Value counts = rewriter.getRemappedValue(bound.counts);
    auto type =
        dyn_cast_or_null<RankedTensorType>(counts ? counts.getType() : Type());
    if (!type || type.getRank() != 1)
      return false;
    MLIRContext *ctx = rewriter.getContext();
    Type elt = type.getElementType();
    Value init = e.zeros({}, elt);
    Value sum = e.generic(counts, init,
                          {AffineMap::getMultiDimIdentityMap(1, ctx),
                           AffineMap::get(1, 0, ArrayRef<AffineExpr>{}, ctx)},
                          {IteratorType::reduction},
                          [&](OpBuilder &nb, Location nl, ValueRange a) {
                            return SmallVector<Value>{
                                arith::AddIOp::create(nb, nl, a[1], a[0])};
                          })[0];
    n = e.extractIndex(sum, {});
  }
  e.bindLiveRows(n, rows);
  return true;
}

LiveRowBounds findLiveRowBounds(Operation *root) {
  LiveRows analysis(root);
  LiveRowBounds bounds;
  root->walk([&](Operation *op) {
    if (isa<DispatchOp, QuantizeOp, DequantizeOp, SwigluOp, SwigluGradOp,
            CombineOp>(op))
      if (RowBound d = analysis.boundedOp(op))
        bounds[op] = d;
  });
  return bounds;
}

/// A GEMM operand as a float tensor: MX operands are dequantized to f32.
Value gemmOperand(Emitter &e, Type original, ValueRange converted) {
  if (auto mx = dyn_cast<MXTensorType>(original))
    return dequantizeMX(e, converted[0], converted[1], mx, e.b.getF32Type());
  if (auto fp8 = dyn_cast<FP8BlockTensorType>(original))
    return dequantizeFP8Block(e, converted[0], converted[1], fp8,
                              e.b.getF32Type());
  return converted[0];
}

} // namespace mlir::moe::detail

namespace {

//===----------------------------------------------------------------------===//
// Patterns
//===----------------------------------------------------------------------===//

/// A lowering that computes only the rows that matter of the ops `live`
/// bounds (see LiveRows.h).
template <typename Op> struct RowwiseLowering : OpConversionPattern<Op> {
  RowwiseLowering(const TypeConverter &converter, MLIRContext *ctx,
                  const LiveRowBounds *live)
      : OpConversionPattern<Op>(converter, ctx), live(live) {}
  const LiveRowBounds *live;
};

/// `t` with its rows dynamic.
MXTensorType withDynamicRows(MXTensorType t) {
  SmallVector<int64_t> shape(t.getShape());
  shape[0] = ShapedType::kDynamic;
  return MXTensorType::get(t.getContext(), shape, t.getElementType(),
                           t.getAxis(), t.getBlockSize());
}

struct QuantizeLowering : RowwiseLowering<QuantizeOp> {
  using RowwiseLowering::RowwiseLowering;
  LogicalResult
  matchAndRewrite(QuantizeOp op, OneToNOpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Emitter e{rewriter, op.getLoc()};
    Value x = adaptor.getInput()[0];
    if (auto fp8 = dyn_cast<FP8BlockTensorType>(op.getResult().getType())) {
      // Every row, live or not: padding the live rows to whole tiles would
      // size a buffer by the live count, which the GPU path would read on
      // the host (the round-trip kernel computes live rows on the GPU).
      auto [data, scales] = quantizeFP8Block(e, x, fp8);
      // The types the input's sizes gave, as the op's type says (a static
      // size where the input's is dynamic).
      rewriter.replaceOpWithMultiple(op,
                                     {{e.castTo(data, fp8.getDataType()),
                                       e.castTo(scales, fp8.getScalesType())}});
      return success();
    }
    auto type = cast<MXTensorType>(op.getResult().getType());
    if (boundRows(e, op, live, rewriter, type.getShape()[0])) {
      x = e.leadingRows(x, e.liveCount);
      auto [data, scales] =
          quantizeMX(e, x, withDynamicRows(type), op.getScaleMode());
      rewriter.replaceOpWithMultiple(
          op, {{e.fullRows(data, type.getDataType()),
                e.fullRows(scales, type.getScalesType())}});
      return success();
    }
    auto [data, scales] = quantizeMX(e, x, type, op.getScaleMode());
    rewriter.replaceOpWithMultiple(op, {{data, scales}});
    return success();
  }
};

struct DequantizeLowering : RowwiseLowering<DequantizeOp> {
  using RowwiseLowering::RowwiseLowering;
  LogicalResult
  matchAndRewrite(DequantizeOp op, OneToNOpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Emitter e{rewriter, op.getLoc()};
    ValueRange in = adaptor.getInput();
    Type elt = op.getType().getElementType();
    if (auto fp8 = dyn_cast<FP8BlockTensorType>(op.getInput().getType())) {
      // Every row, as the quantize.
      rewriter.replaceOp(op,
                         e.castTo(dequantizeFP8Block(e, in[0], in[1], fp8, elt),
                                  op.getType()));
      return success();
    }
    auto type = cast<MXTensorType>(op.getInput().getType());
    if (boundRows(e, op, live, rewriter, type.getShape()[0])) {
      Value out = dequantizeMX(e, e.leadingRows(in[0], e.liveCount),
                               e.leadingRows(in[1], e.liveCount),
                               withDynamicRows(type), elt);
      rewriter.replaceOp(op, e.fullRows(out, op.getType()));
      return success();
    }
    rewriter.replaceOp(op, dequantizeMX(e, in[0], in[1], type, elt));
    return success();
  }
};

struct MXPackLowering : OpConversionPattern<MXPackOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(MXPackOp op, OneToNOpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    rewriter.replaceOpWithMultiple(
        op, {{adaptor.getData()[0], adaptor.getScales()[0]}});
    return success();
  }
};

struct MXUnpackLowering : OpConversionPattern<MXUnpackOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(MXUnpackOp op, OneToNOpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    rewriter.replaceOp(op, adaptor.getInput());
    return success();
  }
};

/// One matmul per expert on its rows, inserted into a zero result.
struct GroupedMatmulLowering : OpConversionPattern<GroupedMatmulOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(GroupedMatmulOp op, OneToNOpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Emitter e{rewriter, op.getLoc()};
    Value a = gemmOperand(e, op.getLhs().getType(), adaptor.getLhs());
    Value w = gemmOperand(e, op.getRhs().getType(), adaptor.getRhs());
    Value offsets = adaptor.getOffsets()[0];
    bool transpose = op.getTransposeRhs();
    auto resultType = op.getType();
    int64_t numExperts =
        cast<RankedTensorType>(offsets.getType()).getDimSize(0) - 1;
    Type f32 = rewriter.getF32Type();
    SmallVector<OpFoldResult> outSizes = {e.sizes(a)[0],
                                          e.sizes(w)[transpose ? 1 : 2]};
    Value rows = e.dim(a, 0);
    Value out = e.forLoop(
        e.idx(0), e.idx(numExperts), e.zeros(outSizes, f32),
        [&](Emitter &n, Value ex, ValueRange iter) {
          auto [lo, size] = n.groupBounds(offsets, ex, rows);
          Value as = n.rowSlice(a, lo, size);
          Value ws = n.expertSlice(w, ex);
          Value c = n.zeros({size, outSizes[1]}, f32);
          Value mm = n.matmul(as, ws, c, transpose);
          return SmallVector<Value>{n.insertAt(
              mm, iter[0], {lo, n.b.getIndexAttr(0)}, {size, outSizes[1]})};
        })[0];
    rewriter.replaceOp(op, e.castElements(out, resultType.getElementType()));
    return success();
  }
};

/// result[e] = lhs[g]^T @ rhs[g] per expert group g.
struct GroupedMatmulWgradLowering : OpConversionPattern<GroupedMatmulWgradOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(GroupedMatmulWgradOp op, OneToNOpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Emitter e{rewriter, op.getLoc()};
    MLIRContext *ctx = rewriter.getContext();
    Value a = gemmOperand(e, op.getLhs().getType(), adaptor.getLhs());
    Value g = gemmOperand(e, op.getRhs().getType(), adaptor.getRhs());
    Value offsets = adaptor.getOffsets()[0];
    auto resultType = op.getType();
    int64_t numExperts = resultType.getDimSize(0);
    Type f32 = rewriter.getF32Type();
    OpFoldResult kSize = e.sizes(a)[1], nSize = e.sizes(g)[1];
    Value rows = e.dim(a, 0);
    AffineExpr k, n, r;
    bindDims(ctx, k, n, r);
    SmallVector<AffineMap> maps = {AffineMap::get(3, 0, {r, k}, ctx),
                                   AffineMap::get(3, 0, {r, n}, ctx),
                                   AffineMap::get(3, 0, {k, n}, ctx)};
    Value out = e.forLoop(
        e.idx(0), e.idx(numExperts),
        e.zeros({e.b.getIndexAttr(numExperts), kSize, nSize}, f32),
        [&](Emitter &em, Value ex, ValueRange iter) {
          auto [lo, size] = em.groupBounds(offsets, ex, rows);
          Value as = em.rowSlice(a, lo, size);
          Value gs = em.rowSlice(g, lo, size);
          Value c = em.zeros({kSize, nSize}, f32);
          Value mm =
              em.generic({as, gs}, c, maps,
                         {IteratorType::parallel, IteratorType::parallel,
                          IteratorType::reduction},
                         [&](OpBuilder &nb, Location nl, ValueRange args) {
                           Emitter q{nb, nl};
                           Value p = arith::MulFOp::create(
                               nb, nl, q.toF32(args[0]), q.toF32(args[1]));
                           return SmallVector<Value>{
                               arith::AddFOp::create(nb, nl, args[2], p)};
                         })[0];
          return SmallVector<Value>{em.insertAt(
              mm, iter[0], {ex, em.b.getIndexAttr(0), em.b.getIndexAttr(0)},
              {em.b.getIndexAttr(1), kSize, nSize})};
        })[0];
    rewriter.replaceOp(op, e.castElements(out, resultType.getElementType()));
    return success();
  }
};

/// The gate and up halves of the last dimension of `t` as strided slices.
std::pair<SmallVector<OpFoldResult>, SmallVector<OpFoldResult>>
gluSliceOffsets(Emitter &e, int64_t rank, int64_t half, SwigluLayout layout,
                bool up) {
  SmallVector<OpFoldResult> offs(rank, e.b.getIndexAttr(0)),
      strides(rank, e.b.getIndexAttr(1));
  if (layout == SwigluLayout::split) {
    offs.back() = e.b.getIndexAttr(up ? half : 0);
  } else {
    offs.back() = e.b.getIndexAttr(up ? 1 : 0);
    strides.back() = e.b.getIndexAttr(2);
  }
  return {offs, strides};
}

/// Half-size sizes of a [..., 2F] tensor.
SmallVector<OpFoldResult> halfSizes(Emitter &e, Value full, int64_t half) {
  SmallVector<OpFoldResult> s = e.sizes(full);
  s.back() = e.b.getIndexAttr(half);
  return s;
}

Value gluHalf(Emitter &e, Value full, SwigluLayout layout, bool up) {
  auto type = cast<RankedTensorType>(full.getType());
  int64_t half = type.getShape().back() / 2;
  auto [offs, strides] = gluSliceOffsets(e, type.getRank(), half, layout, up);
  SmallVector<int64_t> shape(type.getShape());
  shape.back() = half;
  return tensor::ExtractSliceOp::create(
      e.b, e.loc, RankedTensorType::get(shape, type.getElementType()), full,
      offs, halfSizes(e, full, half), strides);
}

struct SwigluLowering : RowwiseLowering<SwigluOp> {
  using RowwiseLowering::RowwiseLowering;
  LogicalResult
  matchAndRewrite(SwigluOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Emitter e{rewriter, op.getLoc()};
    Value in = adaptor.getInput();
    if (op.getType().getRank() > 1 &&
        boundRows(e, op, live, rewriter, op.getType().getDimSize(0)))
      in = e.leadingRows(in, e.liveCount);
    Value gate = gluHalf(e, in, op.getLayout(), false);
    Value up = gluHalf(e, in, op.getLayout(), true);
    Type elt = op.getType().getElementType();
    rewriter.replaceOp(op, e.fullRows(e.map({gate, up}, elt,
                                            [&](Emitter &n, ValueRange a) {
                                              return n.fromF32(
                                                  buildSwiglu(n.b, n.loc,
                                                              n.toF32(a[0]),
                                                              n.toF32(a[1])),
                                                  elt);
                                            }),
                                      op.getType()));
    return success();
  }
};

struct SwigluGradLowering : RowwiseLowering<SwigluGradOp> {
  using RowwiseLowering::RowwiseLowering;
  LogicalResult
  matchAndRewrite(SwigluGradOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Emitter e{rewriter, op.getLoc()};
    MLIRContext *ctx = rewriter.getContext();
    Value in = adaptor.getInput(), dy = adaptor.getGrad();
    if (op.getType().getRank() > 1 &&
        boundRows(e, op, live, rewriter, op.getType().getDimSize(0))) {
      in = e.leadingRows(in, e.liveCount);
      dy = e.leadingRows(dy, e.liveCount);
    }
    SwigluLayout layout = op.getLayout();
    Value gate = gluHalf(e, in, layout, false);
    Value up = gluHalf(e, in, layout, true);
    Type elt = op.getType().getElementType();
    auto type = op.getType();
    int64_t rank = type.getRank(), half = type.getShape().back() / 2;
    SmallVector<OpFoldResult> hs = halfSizes(e, in, half);
    SmallVector<AffineMap> maps(5,
                                AffineMap::getMultiDimIdentityMap(rank, ctx));
    SmallVector<IteratorType> par(rank, IteratorType::parallel);
    ValueRange grads = e.generic(
        {gate, up, dy}, {e.empty(hs, elt), e.empty(hs, elt)}, maps, par,
        [&](OpBuilder &nb, Location nl, ValueRange a) {
          Emitter n{nb, nl};
          auto [dg, du] = buildSwigluGrad(nb, nl, n.toF32(a[0]), n.toF32(a[1]),
                                          n.toF32(a[2]));
          return SmallVector<Value>{n.fromF32(dg, elt), n.fromF32(du, elt)};
        });
    Value out = e.empty(e.sizes(in), elt);
    for (int which = 0; which < 2; ++which) {
      auto [offs, strides] = gluSliceOffsets(e, rank, half, layout, which == 1);
      out = tensor::InsertSliceOp::create(rewriter, op.getLoc(), grads[which],
                                          out, offs, hs, strides);
    }
    rewriter.replaceOp(op, e.fullRows(out, op.getType()));
    return success();
  }
};

} // namespace

namespace mlir::moe::detail {
/// Maps and iterator kinds for row-wise work on a [T, n] tensor.
struct RowMaps {
  AffineMap mapTE, mapT;
  SmallVector<IteratorType> rowReduce = {IteratorType::parallel,
                                         IteratorType::reduction};
  explicit RowMaps(MLIRContext *ctx) {
    AffineExpr t, x;
    bindDims(ctx, t, x);
    mapTE = AffineMap::get(2, 0, {t, x}, ctx);
    mapT = AffineMap::get(2, 0, {t}, ctx);
  }
};

std::pair<Value, Value> rowMaxAndSumExp(Emitter &e, Value v) {
  RowMaps rm(e.b.getContext());
  auto mapTE = rm.mapTE, mapT = rm.mapT;
  auto rowReduce = rm.rowReduce;
  Type f32 = e.b.getF32Type();
  float inf = std::numeric_limits<float>::infinity();
  OpFoldResult rows = e.sizes(v)[0];
  Value maxInit = e.fill(e.empty({rows}, f32), e.f32(-inf));
  Value rowMax = e.generic(v, maxInit, {mapTE, mapT}, rowReduce,
                           [&](OpBuilder &nb, Location nl, ValueRange a) {
                             return SmallVector<Value>{
                                 arith::MaximumFOp::create(nb, nl, a[1], a[0])};
                           })[0];
  Value sum = e.generic(
      {v, rowMax}, e.zeros({rows}, f32), {mapTE, mapT, mapT}, rowReduce,
      [&](OpBuilder &nb, Location nl, ValueRange a) {
        Value d = arith::SubFOp::create(nb, nl, a[0], a[1]);
        Value ex = math::ExpOp::create(nb, nl, d);
        return SmallVector<Value>{arith::AddFOp::create(nb, nl, a[2], ex)};
      })[0];
  return {rowMax, sum};
}

/// Row-wise softmax of a [T, n] f32 tensor (max-subtracted).
Value rowSoftmax(Emitter &e, Value v) {
  auto [rowMax, sum] = rowMaxAndSumExp(e, v);
  return rowSoftmaxFrom(e, v, rowMax, sum);
}

Value rowSoftmaxFrom(Emitter &e, Value v, Value rowMax, Value sum) {
  RowMaps rm(e.b.getContext());
  auto mapTE = rm.mapTE, mapT = rm.mapT;
  Value init = e.empty(e.sizes(v), e.b.getF32Type());
  return e.generic({v, rowMax, sum}, init, {mapTE, mapT, mapT, mapTE},
                   {IteratorType::parallel, IteratorType::parallel},
                   [&](OpBuilder &nb, Location nl, ValueRange a) {
                     Value d = arith::SubFOp::create(nb, nl, a[0], a[1]);
                     Value ex = math::ExpOp::create(nb, nl, d);
                     return SmallVector<Value>{
                         arith::DivFOp::create(nb, nl, ex, a[2])};
                   })[0];
}

/// Divides every row of a [T, k] f32 tensor by its sum (in slot order).
Value rowNormalize(Emitter &e, Value v) {
  RowMaps rm(e.b.getContext());
  auto mapTE = rm.mapTE, mapT = rm.mapT;
  auto rowReduce = rm.rowReduce;
  Type f32 = e.b.getF32Type();
  OpFoldResult rows = e.sizes(v)[0];
  Value sum = e.generic(v, e.zeros({rows}, f32), {mapTE, mapT}, rowReduce,
                        [&](OpBuilder &nb, Location nl, ValueRange a) {
                          return SmallVector<Value>{
                              arith::AddFOp::create(nb, nl, a[1], a[0])};
                        })[0];
  return e.generic({v, sum}, e.empty(e.sizes(v), f32), {mapTE, mapT, mapTE},
                   {IteratorType::parallel, IteratorType::parallel},
                   [&](OpBuilder &nb, Location nl, ValueRange a) {
                     return SmallVector<Value>{
                         arith::DivFOp::create(nb, nl, a[0], a[1])};
                   })[0];
}
} // namespace mlir::moe::detail

Value mlir::moe::detail::routerScores(Emitter &e, ScoreFunction score,
                                      bool softmaxAfterTopk, Value logits) {
  if (score == ScoreFunction::sigmoid)
    return e.map(logits, e.b.getF32Type(),
                 [](Emitter &n, ValueRange a) { return n.sigmoid(a[0]); });
  if (softmaxAfterTopk)
    return logits;
  return rowSoftmax(e, logits);
}

Value mlir::moe::detail::routerRanking(Emitter &e, Value scores, Value bias) {
  if (!bias)
    return scores;
  MLIRContext *ctx = e.b.getContext();
  AffineExpr t = getAffineDimExpr(0, ctx), x = getAffineDimExpr(1, ctx);
  return e.generic(
      {scores, bias}, e.empty(e.sizes(scores), e.b.getF32Type()),
      {AffineMap::get(2, 0, {t, x}, ctx), AffineMap::get(2, 0, {x}, ctx),
       AffineMap::get(2, 0, {t, x}, ctx)},
      {IteratorType::parallel, IteratorType::parallel},
      [&](OpBuilder &nb, Location nl, ValueRange a) {
        return SmallVector<Value>{arith::AddFOp::create(nb, nl, a[0], a[1])};
      })[0];
}

Value mlir::moe::detail::gatherPicked(Emitter &e, Value scores, Value indices) {
  auto id = AffineMap::getMultiDimIdentityMap(2, e.b.getContext());
  return e.generic(indices, e.empty(e.sizes(indices), e.b.getF32Type()),
                   {id, id}, {IteratorType::parallel, IteratorType::parallel},
                   [&](OpBuilder &nb, Location nl, ValueRange a) {
                     Emitter n{nb, nl};
                     Value t = linalg::IndexOp::create(nb, nl, 0);
                     return SmallVector<Value>{
                         n.extract(scores, {t, n.toIndex(a[0])})};
                   })[0];
}

Value mlir::moe::detail::routerWeights(Emitter &e, RouterOp op, Value picked) {
  if (op.getSoftmaxAfterTopk())
    return rowSoftmax(e, picked);
  if (op.getNormTopkProb())
    return rowNormalize(e, picked);
  return picked;
}

namespace {

/// Scores, top-k selection by loops (lower index wins ties, NaN never wins
/// against a number), then the weights.
struct RouterLowering : OpConversionPattern<RouterOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(RouterOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Emitter e{rewriter, op.getLoc()};
    Type f32 = rewriter.getF32Type();
    Value logits = e.castElements(adaptor.getLogits(), f32);
    auto lt = cast<RankedTensorType>(logits.getType());
    int64_t numExperts = lt.getDimSize(1);
    int64_t k = op.getTopK();
    Value tokensDim = e.dim(logits, 0);
    float inf = std::numeric_limits<float>::infinity();
    Value scores =
        routerScores(e, op.getScore(), op.getSoftmaxAfterTopk(), logits);
    // Ranked by score (+ the selection bias); weighted by score.
    Value ranking = routerRanking(e, scores, adaptor.getBias());

    // Top-k by repeated arg-max over the experts not yet taken.
    Type idxElt = op.getIndices().getType().getElementType();
    SmallVector<OpFoldResult> tk = {e.sizes(logits)[0], e.b.getIndexAttr(k)};
    Value taken = e.fill(e.empty(e.sizes(logits), e.b.getI1Type()),
                         arith::ConstantIntOp::create(e.b, e.loc, 0, 1));
    ValueRange sel = e.forLoop(
        e.idx(0), tokensDim, {e.zeros(tk, idxElt), e.zeros(tk, f32), taken},
        [&](Emitter &n, Value tok, ValueRange it) {
          return llvm::to_vector(n.forLoop(
              n.idx(0), n.idx(k), it, [&](Emitter &m, Value j, ValueRange it2) {
                ValueRange best = m.forLoop(
                    m.idx(0), m.idx(numExperts), {m.idx(-1), m.f32(-inf)},
                    [&](Emitter &q, Value ex, ValueRange cur) {
                      // `v` beats the best so far if it is greater, or if
                      // it is a number and the best so far is NaN (so a NaN
                      // never wins against a number, -inf included). Equal
                      // scores keep the lower index.
                      Value v = q.extract(ranking, {tok, ex});
                      Value isNum = arith::CmpFOp::create(
                          q.b, q.loc, arith::CmpFPredicate::ORD, v, v);
                      Value curNaN = arith::CmpFOp::create(
                          q.b, q.loc, arith::CmpFPredicate::UNO, cur[1],
                          cur[1]);
                      Value free = arith::XOrIOp::create(
                          q.b, q.loc, q.extract(it2[2], {tok, ex}),
                          arith::ConstantIntOp::create(q.b, q.loc, 1, 1));
                      Value none =
                          q.cmpI(arith::CmpIPredicate::slt, cur[0], q.idx(0));
                      Value greater = arith::CmpFOp::create(
                          q.b, q.loc, arith::CmpFPredicate::OGT, v, cur[1]);
                      Value replacesNaN =
                          arith::AndIOp::create(q.b, q.loc, isNum, curNaN);
                      Value better = arith::AndIOp::create(
                          q.b, q.loc, free,
                          arith::OrIOp::create(
                              q.b, q.loc, none,
                              arith::OrIOp::create(q.b, q.loc, greater,
                                                   replacesNaN)));
                      return SmallVector<Value>{q.sel(better, ex, cur[0]),
                                                q.sel(better, v, cur[1])};
                    });
                Value bestE = best[0];
                Value val = m.extract(scores, {tok, bestE});
                return SmallVector<Value>{
                    m.insertIndex(bestE, it2[0], {tok, j}),
                    m.insert(val, it2[1], {tok, j}),
                    m.insert(arith::ConstantIntOp::create(m.b, m.loc, 1, 1),
                             it2[2], {tok, bestE})};
              }));
        });
    rewriter.replaceOp(op, {sel[0], routerWeights(e, op, sel[1])});
    return success();
  }
};

/// Counts, (capacity,) padded offsets, then one pass over the token copies
/// in token order that places each in its expert's group.
struct DispatchLowering : OpConversionPattern<DispatchOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(DispatchOp op, OneToNOpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Emitter e{rewriter, op.getLoc()};
    // The rows: one tensor, or an MX tensor's data and scales (moved alike).
    SmallVector<Value> tokens = llvm::to_vector(adaptor.getTokens());
    Value indices = adaptor.getIndices()[0];
    int64_t numExperts = op.getNumExperts(), padTo = op.getPadTo();
    int64_t capacity = op.getCapacity();
    int64_t k = op.getIndices().getType().getDimSize(1);
    auto countsType = op.getCounts().getType();
    auto offsetsType = op.getOffsets().getType();
    auto posType = op.getPositions().getType();
    SmallVector<RankedTensorType> sortedTypes =
        loweredTypes(op.getSorted().getType());
    Value numTok = e.dim(indices, 0);
    Value eMax = e.idx(numExperts);
    using P = arith::CmpIPredicate;

    /// The expert of copy (t, j), whether it is in range, and a safe index.
    auto expertOf = [&](Emitter &n, Value t, Value j) {
      Value ex = n.extractIndex(indices, {t, j});
      Value ok = arith::AndIOp::create(n.b, n.loc, n.cmpI(P::sge, ex, n.idx(0)),
                                       n.cmpI(P::slt, ex, eMax));
      return std::make_pair(n.sel(ok, ex, n.idx(0)), ok);
    };

    // 1. raw counts.
    Value counts = e.forLoop(
        e.idx(0), numTok,
        e.zeros({e.b.getIndexAttr(numExperts)}, countsType.getElementType()),
        [&](Emitter &n, Value t, ValueRange it) {
          return llvm::to_vector(n.forLoop(
              n.idx(0), n.idx(k), it, [&](Emitter &m, Value j, ValueRange c) {
                auto [ex, ok] = expertOf(m, t, j);
                Value old = m.extractIndex(c[0], ex);
                Value inc = m.sel(ok, m.addI(old, m.idx(1)), old);
                return SmallVector<Value>{m.insertIndex(inc, c[0], ex)};
              }));
        })[0];
    // 2. kept counts and padded group offsets.
    ValueRange ko = e.forLoop(
        e.idx(0), eMax,
        {e.zeros({e.b.getIndexAttr(numExperts)}, countsType.getElementType()),
         e.zeros({e.b.getIndexAttr(numExperts + 1)},
                 offsetsType.getElementType())},
        [&](Emitter &n, Value ex, ValueRange it) {
          Value kept = n.extractIndex(counts, ex);
          if (capacity >= 0)
            kept = n.minI(kept, n.idx(capacity));
          Value padded = n.roundUp(kept, padTo);
          Value start = n.extractIndex(it[1], ex);
          return SmallVector<Value>{n.insertIndex(kept, it[0], ex),
                                    n.insertIndex(n.addI(start, padded), it[1],
                                                  n.addI(ex, n.idx(1)))};
        });
    Value kept = ko[0], offsets = ko[1];
    // 3. place every copy.
    Value posInit = e.fill(
        e.empty(e.sizes(indices), posType.getElementType()),
        arith::ConstantOp::create(
            e.b, e.loc, e.b.getIntegerAttr(posType.getElementType(), -1)));
    Value cursorInit =
        e.zeros({e.b.getIndexAttr(numExperts)}, countsType.getElementType());
    // Loop-carried: pos, cursor, then the sorted parts.
    SmallVector<Value> inits = {posInit, cursorInit};
    for (auto [part, type] : llvm::zip(tokens, sortedTypes))
      inits.push_back(
          e.zeros({e.b.getIndexAttr(type.getDimSize(0)), e.sizes(part)[1]},
                  type.getElementType()));
    ValueRange placed = e.forLoop(
        e.idx(0), numTok, inits, [&](Emitter &n, Value t, ValueRange it) {
          return llvm::to_vector(n.forLoop(
              n.idx(0), n.idx(k), it, [&](Emitter &m, Value j, ValueRange s) {
                auto [ex, ok] = expertOf(m, t, j);
                Value cur = m.extractIndex(s[1], ex);
                Value keep = arith::AndIOp::create(
                    m.b, m.loc, ok,
                    m.cmpI(P::slt, cur, m.extractIndex(kept, ex)));
                Value row = m.addI(m.extractIndex(offsets, ex), cur);
                Value pos =
                    m.insertIndex(m.sel(keep, row, m.idx(-1)), s[0], {t, j});
                Value cursor = m.insertIndex(
                    m.sel(keep, m.addI(cur, m.idx(1)), cur), s[1], ex);
                ValueRange sorted = s.drop_front(2);
                auto ifOp = scf::IfOp::create(
                    m.b, m.loc, keep,
                    [&](OpBuilder &ib, Location il) {
                      Emitter q{ib, il};
                      // The same (dynamic) size for the slice and the
                      // insert: rowSlice types its result tensor<?xH>, so a
                      // static 1 here would not verify.
                      Value one = q.idx(1);
                      SmallVector<Value> upd;
                      for (auto [part, dest] : llvm::zip(tokens, sorted))
                        upd.push_back(q.insertAt(q.rowSlice(part, t, one), dest,
                                                 {row, ib.getIndexAttr(0)},
                                                 {one, q.sizes(part)[1]}));
                      scf::YieldOp::create(ib, il, upd);
                    },
                    [&](OpBuilder &ib, Location il) {
                      scf::YieldOp::create(ib, il, sorted);
                    });
                SmallVector<Value> next = {pos, cursor};
                llvm::append_range(next, ifOp.getResults());
                return next;
              }));
        });
    rewriter.replaceOpWithMultiple(op, {ValueRange(placed.drop_front(2)),
                                        ValueRange(offsets), ValueRange(kept),
                                        ValueRange(placed[0])});
    return success();
  }
};

/// out[t, h] = sum_j w[t, j] * y[pos[t, j], h] over the kept copies.
/// out[t, h] = sum over j (ascending, from +0, in f32) of w[t, j] *
/// y[pos[t, j], h], skipping dropped copies (pos outside y): one parallel
/// generic over [T, H] with the k-loop in its body (no zero-filled
/// accumulator pass, the conversion to the result type in the same pass).
struct CombineLowering : RowwiseLowering<CombineOp> {
  using RowwiseLowering::RowwiseLowering;
  LogicalResult
  matchAndRewrite(CombineOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Emitter e{rewriter, op.getLoc()};
    MLIRContext *ctx = rewriter.getContext();
    Value y = adaptor.getExpertOut(), w = adaptor.getWeights(),
          pos = adaptor.getPositions();
    Type elt = op.getType().getElementType();
    int64_t k = cast<RankedTensorType>(w.getType()).getDimSize(1);
    Value rows = e.dim(y, 0);
    auto id = AffineMap::getMultiDimIdentityMap(2, ctx);
    // The tokens that matter only, where nothing reads the others (the
    // rows an exchange sends back: the first sum(counts)).
    OpFoldResult tokens = e.sizes(w)[0];
    if (boundRows(e, op, live, rewriter, op.getType().getDimSize(0)))
      tokens = e.liveCount;
    Value out = e.generic(
        ValueRange{}, e.empty({tokens, e.sizes(y)[1]}, elt), {id},
        {IteratorType::parallel, IteratorType::parallel},
        [&](OpBuilder &nb, Location nl, ValueRange) {
          Emitter n{nb, nl};
          Value t = linalg::IndexOp::create(nb, nl, 0);
          Value hIdx = linalg::IndexOp::create(nb, nl, 1);
          Value kEnd = ShapedType::isDynamic(k) ? n.dim(w, 1) : n.idx(k);
          Value sum = n.forLoop(
              n.idx(0), kEnd, n.f32(0.0),
              [&](Emitter &m, Value j, ValueRange acc) {
                Value p = m.extractIndex(pos, {t, j});
                Value ok = arith::AndIOp::create(
                    m.b, m.loc, m.cmpI(arith::CmpIPredicate::sge, p, m.idx(0)),
                    m.cmpI(arith::CmpIPredicate::slt, p, rows));
                Value safe = m.sel(ok, p, m.idx(0));
                Value v = m.toF32(m.extract(y, {safe, hIdx}));
                Value prod =
                    arith::MulFOp::create(m.b, m.loc, m.extract(w, {t, j}), v);
                Value next = arith::AddFOp::create(m.b, m.loc, acc[0], prod);
                return SmallVector<Value>{m.sel(ok, next, acc[0])};
              })[0];
          return SmallVector<Value>{n.fromF32(sum, elt)};
        })[0];
    rewriter.replaceOp(op, e.fullRows(out, op.getType()));
    return success();
  }
};

/// offsets[g] = sum over j < g of roundup(sum over src of counts[src*S + j],
/// pad): one parallel generic over the S + 1 entries.
struct SlotOffsetsLowering : OpConversionPattern<SlotOffsetsOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(SlotOffsetsOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Emitter e{rewriter, op.getLoc()};
    Value counts = adaptor.getCounts();
    int64_t slots = op.getNumSlots(), pad = op.getPadTo();
    int64_t ranks = op.getCounts().getType().getDimSize(0) / slots;
    auto type = op.getOffsets().getType();
    Type elt = type.getElementType();
    Value offsets = e.generic(
        ValueRange{}, e.empty({e.b.getIndexAttr(slots + 1)}, elt),
        {AffineMap::getMultiDimIdentityMap(1, rewriter.getContext())},
        {IteratorType::parallel}, [&](OpBuilder &b, Location l, ValueRange) {
          Emitter n{b, l};
          Value g = linalg::IndexOp::create(b, l, 0);
          Value at = n.forLoop(
              n.idx(0), g, n.idx(0), [&](Emitter &m, Value j, ValueRange s) {
                Value rows = m.forLoop(
                    m.idx(0), m.idx(ranks), m.idx(0),
                    [&](Emitter &q, Value src, ValueRange r) {
                      Value slot = q.addI(
                          arith::MulIOp::create(q.b, q.loc, src, q.idx(slots)),
                          j);
                      return SmallVector<Value>{
                          q.addI(r[0], q.extractIndex(counts, slot))};
                    })[0];
                return SmallVector<Value>{m.addI(s[0], m.roundUp(rows, pad))};
              })[0];
          return SmallVector<Value>{n.fromIndex(at, elt)};
        })[0];
    rewriter.replaceOp(op, offsets);
    return success();
  }
};

/// Over a group of one rank: copy the rows (cut or zero-padded).
struct AllToAllLowering : OpConversionPattern<AllToAllOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(AllToAllOp op, OneToNOpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    SymbolTableCollection symbols;
    if (op.getGroupSize(symbols) != 1)
      return op.emitOpError(
          "exchanges rows between several ranks; -convert-moe-to-linalg only "
          "lowers groups of one rank (run -convert-moe-to-runtime first)");
    Emitter e{rewriter, op.getLoc()};
    if (op.getPadTo() > 1)
      return lowerPaddedSlots(e, op, adaptor, rewriter);
    // Each part of the rows (an MX tensor's data and scales) alike.
    SmallVector<Value> outs;
    for (auto [in, rt] : llvm::zip(adaptor.getInput(),
                                   loweredTypes(op.getResult().getType()))) {
      SmallVector<OpFoldResult> outSizes = {e.b.getIndexAttr(rt.getDimSize(0)),
                                            e.sizes(in)[1]};
      if (rt.isDynamicDim(0))
        outSizes[0] = e.sizes(in)[0];
      Value out = e.zeros(outSizes, rt.getElementType());
      Value n = e.minI(e.dim(in, 0), e.dim(out, 0));
      Value rowsIn = e.rowSlice(in, e.idx(0), n);
      out = e.insertAt(rowsIn, out, {e.b.getIndexAttr(0), e.b.getIndexAttr(0)},
                       {n, outSizes[1]});
      outs.push_back(tensor::CastOp::create(rewriter, op.getLoc(), rt, out));
    }
    rewriter.replaceOpWithMultiple(
        op, {ValueRange(outs), ValueRange(adaptor.getSendCounts())});
    return success();
  }

  /// One rank with padded slot-major sides: slot j's rows (send_counts[j] of
  /// them) move from where the input layout puts them to where the result
  /// layout does; padding and the tail are zero.
  static LogicalResult lowerPaddedSlots(Emitter &e, AllToAllOp op,
                                        OneToNOpAdaptor adaptor,
                                        ConversionPatternRewriter &rewriter) {
    using P = arith::CmpIPredicate;
    MLIRContext *ctx = rewriter.getContext();
    Value counts = adaptor.getSendCounts()[0];
    int64_t slots = op.getSendCounts().getType().getDimSize(0);
    int64_t pad = op.getPadTo();
    auto resultTypes = loweredTypes(op.getResult().getType());
    int64_t rows = resultTypes[0].getDimSize(0);
    if (ShapedType::isDynamic(rows) || ShapedType::isDynamic(slots))
      return op.emitOpError("with padded slots needs static row and count "
                            "sizes");
    bool slotIn = op.getSlotMajorInput(), slotOut = op.getSlotMajorResult();
    auto id = [&](int n) { return AffineMap::getMultiDimIdentityMap(n, ctx); };
    // The input row of every result row, or -1.
    Value source = e.generic(
        ValueRange{}, e.empty({e.b.getIndexAttr(rows)}, e.b.getIndexType()),
        {id(1)}, {IteratorType::parallel},
        [&](OpBuilder &b, Location l, ValueRange) {
          Emitter n{b, l};
          Value r = linalg::IndexOp::create(b, l, 0);
          ValueRange found = n.forLoop(
              n.idx(0), n.idx(slots), {n.idx(0), n.idx(0), n.idx(-1)},
              [&](Emitter &m, Value j, ValueRange s) {
                Value c = m.extractIndex(counts, j);
                Value in = m.cmpI(P::sge, r, s[1]);
                in = arith::AndIOp::create(m.b, m.loc, in,
                                           m.cmpI(P::slt, r, m.addI(s[1], c)));
                Value src = m.addI(s[0], m.subI(r, s[1]));
                return SmallVector<Value>{
                    m.addI(s[0], slotIn ? m.roundUp(c, pad) : c),
                    m.addI(s[1], slotOut ? m.roundUp(c, pad) : c),
                    m.sel(in, src, s[2])};
              });
          return SmallVector<Value>{found[2]};
        })[0];
    SmallVector<Value> outs;
    for (Value in : adaptor.getInput())
      outs.push_back(e.gatherRows(in, source, e.b.getIndexAttr(rows)));
    rewriter.replaceOpWithMultiple(
        op, {ValueRange(outs), ValueRange(adaptor.getSendCounts())});
    return success();
  }
};

//===----------------------------------------------------------------------===//
// The pass
//===----------------------------------------------------------------------===//

struct ConvertMoEToLinalgPass
    : moe::impl::ConvertMoEToLinalgBase<ConvertMoEToLinalgPass> {
  using ConvertMoEToLinalgBase::ConvertMoEToLinalgBase;
  void runOnOperation() override {
    MLIRContext *ctx = &getContext();
    ModuleOp module = getOperation();

    // Zero-size dimensions (no tokens, an empty hidden size) have no
    // lowering: refused here, naming the op and the type, instead of IR
    // that does not verify or an error deep in upstream folders.
    WalkResult empty = module.walk([](Operation *op) {
      if (!isa<MoEDialect>(op->getDialect()))
        return WalkResult::advance();
      SmallVector<Type> types(op->getOperandTypes());
      llvm::append_range(types, op->getResultTypes());
      for (Type type : types) {
        ArrayRef<int64_t> shape;
        if (auto t = dyn_cast<RankedTensorType>(type))
          shape = t.getShape();
        else if (auto scaled = dyn_cast<BlockScaledType>(type))
          shape = scaled.getShape();
        if (llvm::is_contained(shape, 0)) {
          op->emitOpError("has a zero-size dimension in ")
              << type
              << ": the lowering needs every dimension of moe ops' operands "
                 "and results to be at least 1";
          return WalkResult::interrupt();
        }
      }
      return WalkResult::advance();
    });
    if (empty.wasInterrupted())
      return signalPassFailure();

    // The grids moe.all_to_all ops refer to, looked up before they are
    // lowered (or folded away by the expansion below).
    llvm::SetVector<Operation *> grids;
    SymbolTableCollection symbols;
    module.walk([&](AllToAllOp op) {
      if (auto grid = shard::getGridOrNull(op, op.getGridAttr(), symbols))
        grids.insert(grid);
    });

    RewritePatternSet expand(ctx);
    populateExpandGroupedMlpPatterns(expand);
    if (failed(applyPatternsGreedily(module, std::move(expand))))
      return signalPassFailure();
    if (parallel) {
      WalkResult experts = module.walk([](ExpertsOp op) {
        op.emitOpError("has no data-parallel lowering: run -moe-group-experts "
                       "first to turn its body into grouped ops");
        return WalkResult::interrupt();
      });
      if (experts.wasInterrupted())
        return signalPassFailure();
    }
    if (failed(lowerExpertsToLoops(module)))
      return signalPassFailure();

    TypeConverter converter;
    populateBlockScaledTypeConversion(converter);
    ConversionTarget target(*ctx);
    target.addIllegalDialect<MoEDialect>();
    target.markUnknownOpDynamicallyLegal(
        [&](Operation *op) { return converter.isLegal(op); });
    target.addDynamicallyLegalOp<func::FuncOp>([&](func::FuncOp op) {
      return converter.isSignatureLegal(op.getFunctionType()) &&
             converter.isLegal(&op.getBody());
    });
    // The ops that need compute only the rows before their dispatch's
    // offsets[E] (found before anything is rewritten).
    LiveRowBounds live;
    if (liveRows)
      live = findLiveRowBounds(module);
    RewritePatternSet patterns(ctx);
    populateMoEToLinalgConversionPatterns(converter, patterns, &live);
    if (parallel)
      populateMoEToParallelLinalgPatterns(converter, patterns, &live);
    populateFunctionOpInterfaceTypeConversionPattern<func::FuncOp>(patterns,
                                                                   converter);
    populateCallOpTypeConversionPattern(patterns, converter);
    populateReturnOpTypeConversionPattern(patterns, converter);
    scf::populateSCFStructuralTypeConversionsAndLegality(converter, patterns,
                                                         target);
    if (failed(applyPartialConversion(module, target, std::move(patterns))))
      return signalPassFailure();
    // The attributes the live-rows analysis read have served.
    if (liveRows) {
      module.walk([](func::FuncOp f) {
        for (unsigned i = 0; i < f.getNumArguments(); ++i)
          for (StringRef name : {kGroupRowsAttr, kGroupOffsetsAttr,
                                 kRowsCountedByAttr, kRowsUnreadAttr})
            f.removeArgAttr(i, name);
      });
      module.walk([](func::CallOp call) {
        call->removeAttr(kRowsInSlotsPaddedToAttr);
      });
    }
    // A grid that nothing refers to once its moe.all_to_all ops are lowered
    // is dead: erase it, or the module cannot reach LLVM (shard.grid has no
    // lowering, and mlir-runner does not even parse the shard dialect).
    // Grids that other ops still use are kept.
    for (Operation *grid : grids)
      if (SymbolTable::symbolKnownUseEmpty(grid, module))
        grid->erase();
  }
};
} // namespace

void mlir::moe::populateBlockScaledTypeConversion(TypeConverter &converter) {
  converter.addConversion([](Type t) { return t; });
  converter.addConversion(
      [](MXTensorType t, SmallVectorImpl<Type> &results) -> LogicalResult {
        results.push_back(t.getDataType());
        results.push_back(t.getScalesType());
        return success();
      });
  converter.addConversion([](FP8BlockTensorType t,
                             SmallVectorImpl<Type> &results) -> LogicalResult {
    results.push_back(t.getDataType());
    results.push_back(t.getScalesType());
    return success();
  });
}

void mlir::moe::populateMoEToLinalgConversionPatterns(
    const TypeConverter &converter, RewritePatternSet &patterns,
    const LiveRowBounds *live) {
  patterns.add<MXPackLowering, MXUnpackLowering, GroupedMatmulLowering,
               GroupedMatmulWgradLowering, RouterLowering, DispatchLowering,
               AllToAllLowering, SlotOffsetsLowering>(converter,
                                                      patterns.getContext());
  patterns.add<QuantizeLowering, DequantizeLowering, SwigluLowering,
               SwigluGradLowering, CombineLowering>(
      converter, patterns.getContext(), live);
  populateModelOpLoweringPatterns(converter, patterns);
}

LogicalResult mlir::moe::lowerExpertsToLoops(Operation *root) {
  SmallVector<ExpertsOp> ops;
  root->walk([&](ExpertsOp op) { ops.push_back(op); });
  for (ExpertsOp op : ops) {
    OpBuilder b(op);
    Emitter e{b, op.getLoc()};
    Value tokens = op.getTokens(), offsets = op.getOffsets();
    auto resultType = op.getResult().getType();
    SmallVector<OpFoldResult> outSizes = {
        e.sizes(tokens)[0], b.getIndexAttr(resultType.getDimSize(1))};
    Value rows = e.dim(tokens, 0);
    Block &body = op.getBody().front();
    auto yield = cast<YieldOp>(body.getTerminator());
    Value out = e.forLoop(
        e.idx(0), e.idx(op.getNumExperts()),
        e.zeros(outSizes, resultType.getElementType()),
        [&](Emitter &n, Value ex, ValueRange it) {
          auto [lo, size] = n.groupBounds(offsets, ex, rows);
          IRMapping mapping;
          mapping.map(body.getArgument(0), n.rowSlice(tokens, lo, size));
          for (auto [i, w] : llvm::enumerate(op.getWeights()))
            mapping.map(body.getArgument(i + 1), n.expertSlice(w, ex));
          for (Operation &inner : body.without_terminator())
            n.b.clone(inner, mapping);
          Value y = mapping.lookup(yield.getValue());
          return SmallVector<Value>{n.insertAt(
              y, it[0], {lo, n.b.getIndexAttr(0)}, {size, outSizes[1]})};
        })[0];
    op.getResult().replaceAllUsesWith(out);
    op.erase();
  }
  return success();
}
