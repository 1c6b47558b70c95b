//===- Emitter.h - building blocks of the moe lowerings ---------*- C++ -*-===//
//
// Private to lib/Conversion/MoEToLinalg: the helpers the reference and the
// data-parallel lowerings share (one builder and location, MX block views,
// the MX and router building blocks).
//
//===----------------------------------------------------------------------===//
#ifndef MOE_LIB_CONVERSION_MOETOLINALG_EMITTER_H
#define MOE_LIB_CONVERSION_MOETOLINALG_EMITTER_H

#include "moe/Conversion/MoEToLinalg/MoEToLinalg.h"
#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Dialect/MoE/Utils/Activations.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Bufferization/IR/Bufferization.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/Dialect/Utils/StaticValueUtils.h"
#include "mlir/Transforms/DialectConversion.h"

namespace mlir::moe::detail {

using utils::IteratorType;

/// The tensors a value of type `t` lowers to: itself, or an MX tensor's
/// data and scales.
inline SmallVector<RankedTensorType> loweredTypes(Type t) {
  if (auto mx = dyn_cast<MXTensorType>(t))
    return {mx.getDataType(), mx.getScalesType()};
  return {cast<RankedTensorType>(t)};
}

/// One builder and location, with the small helpers every lowering uses.
struct Emitter {
  OpBuilder &b;
  Location loc;
  /// Set for a computation over rows [0, liveCount) of tensors of
  /// `liveCapacity` rows (the rows that matter, moe/Dialect/MoE/Utils/
  /// LiveRows.h): `sizes` reports dynamic leading dimensions as liveCount,
  /// and `empty` of liveCount rows is a view of a tensor of liveCapacity
  /// rows (static storage whatever the count).
  Value liveCount = {};
  int64_t liveCapacity = 0;

  Value idx(int64_t v) { return arith::ConstantIndexOp::create(b, loc, v); }
  Value f32(double v) {
    return arith::ConstantOp::create(b, loc, b.getF32FloatAttr(v));
  }
  /// Zero; for E8M0 scales (no zero) the all-zero encoding, 2^-127: the
  /// scale of an all-zero MX block, so that zero rows of an MX tensor are
  /// zero bytes in both parts.
  Value zeroOf(Type t) {
    if (auto f = dyn_cast<FloatType>(t);
        f && !APFloat::semanticsHasZero(f.getFloatSemantics()))
      return arith::ConstantOp::create(
          b, loc,
          FloatAttr::get(
              f, APFloat(f.getFloatSemantics(), APInt(f.getWidth(), 0))));
    return arith::ConstantOp::create(b, loc, b.getZeroAttr(t));
  }
  Value dim(Value t, int64_t d) { return tensor::DimOp::create(b, loc, t, d); }
  /// `t` as `type` (tensor.cast where the static sizes differ).
  Value castTo(Value t, Type type) {
    if (t.getType() == type)
      return t;
    return tensor::CastOp::create(b, loc, type, t);
  }
  SmallVector<OpFoldResult> sizes(Value t) {
    auto type = cast<RankedTensorType>(t.getType());
    if (liveCount && type.getRank() > 0 && type.isDynamicDim(0)) {
      SmallVector<OpFoldResult> s = {liveCount};
      for (int64_t d = 1; d < type.getRank(); ++d)
        s.push_back(type.isDynamicDim(d) ? OpFoldResult(dim(t, d))
                                         : b.getIndexAttr(type.getDimSize(d)));
      return s;
    }
    return tensor::getMixedSizes(b, loc, t);
  }

  Value empty(ArrayRef<OpFoldResult> sizes, Type elt) {
    if (liveCount && !sizes.empty() &&
        llvm::dyn_cast_if_present<Value>(sizes[0]) == liveCount) {
      // An explicit allocation: a view of a tensor.empty would fold into a
      // tensor.empty of liveCount rows, sized where liveCount may not be
      // readable (the host, for a count in device memory).
      SmallVector<int64_t> shape;
      SmallVector<Value> dynamic;
      for (OpFoldResult s : sizes.drop_front()) {
        if (auto v = llvm::dyn_cast_if_present<Value>(s)) {
          shape.push_back(ShapedType::kDynamic);
          dynamic.push_back(v);
        } else {
          shape.push_back(cast<IntegerAttr>(cast<Attribute>(s)).getInt());
        }
      }
      shape.insert(shape.begin(), liveCapacity);
      Value full = bufferization::AllocTensorOp::create(
          b, loc, RankedTensorType::get(shape, elt), dynamic);
      return leadingRows(full, liveCount);
    }
    return tensor::EmptyOp::create(b, loc, sizes, elt);
  }

  /// Computes over rows [0, count) (clamped to [0, capacity]) of tensors
  /// of `capacity` rows from here on (see liveCount).
  void bindLiveRows(Value count, int64_t capacity) {
    liveCount = minI(maxI(count, idx(0)), idx(capacity));
    liveCapacity = capacity;
  }

  /// Rows [0, count) of `t` (dim 0).
  Value leadingRows(Value t, OpFoldResult count) {
    auto type = cast<RankedTensorType>(t.getType());
    int64_t rank = type.getRank();
    SmallVector<OpFoldResult> offs(rank, b.getIndexAttr(0)),
        strides(rank, b.getIndexAttr(1));
    SmallVector<OpFoldResult> sz = tensor::getMixedSizes(b, loc, t);
    sz[0] = count;
    return tensor::ExtractSliceOp::create(b, loc, t, offs, sz, strides);
  }

  /// `part`, rows [0, n) of a computation over the rows that matter, as a
  /// tensor of type `full` whose other rows are unspecified: inserted back
  /// into the storage `empty` allocated for it where it has one (no copy),
  /// else into a new tensor.
  Value fullRows(Value part, RankedTensorType full) {
    auto type = cast<RankedTensorType>(part.getType());
    if (!liveCount || !type.isDynamicDim(0) || full.isDynamicDim(0))
      return part;
    // Through a collapse that keeps the rows a dimension of their own.
    if (auto c = part.getDefiningOp<tensor::CollapseShapeOp>();
        c && c.getReassociationIndices()[0].size() == 1) {
      SmallVector<int64_t> shape(c.getSrcType().getShape());
      shape[0] = full.getDimSize(0);
      Value src = fullRows(c.getSrc(),
                           RankedTensorType::get(shape, full.getElementType()));
      return tensor::CollapseShapeOp::create(b, loc, full, src,
                                             c.getReassociationIndices());
    }
    Value dest;
    SmallVector<OpFoldResult> offs, sz, strides;
    // The storage `empty` made: through the destinations of the ops that
    // wrote `part` (a generic's init, an insert_slice's destination), a
    // leading slice of a tensor of type `full`.
    Value v = part;
    while (auto dps = v.getDefiningOp<DestinationStyleOpInterface>()) {
      v = dps.getTiedOpOperand(cast<OpResult>(v))->get();
      auto slice = v.getDefiningOp<tensor::ExtractSliceOp>();
      if (!slice)
        continue;
      auto zero = [](OpFoldResult f) { return isConstantIntValue(f, 0); };
      auto one = [](OpFoldResult f) { return isConstantIntValue(f, 1); };
      if (slice.getSourceType() == full && slice.getType() == type &&
          llvm::all_of(slice.getMixedOffsets(), zero) &&
          llvm::all_of(slice.getMixedStrides(), one)) {
        dest = slice.getSource();
        offs = slice.getMixedOffsets();
        sz = slice.getMixedSizes();
        strides = slice.getMixedStrides();
      }
      break;
    }
    if (!dest) {
      dest = tensor::EmptyOp::create(b, loc, full.getShape(),
                                     full.getElementType());
      offs.assign(full.getRank(), b.getIndexAttr(0));
      strides.assign(full.getRank(), b.getIndexAttr(1));
      sz = tensor::getMixedSizes(b, loc, part);
    }
    return tensor::InsertSliceOp::create(b, loc, part, dest, offs, sz, strides);
  }
  Value fill(Value init, Value v) {
    return linalg::FillOp::create(b, loc, v, init).getResult(0);
  }
  /// A tensor of the given sizes filled with zeros.
  Value zeros(ArrayRef<OpFoldResult> sizes, Type elt) {
    return fill(empty(sizes, elt), zeroOf(elt));
  }

  /// Scalar conversions to and from the f32 in which everything is computed.
  Value toF32(Value v) {
    if (v.getType().isF32())
      return v;
    return arith::ExtFOp::create(b, loc, b.getF32Type(), v);
  }
  Value fromF32(Value v, Type t) {
    if (t.isF32())
      return v;
    return arith::TruncFOp::create(b, loc, t, v);
  }
  /// Integer tensor element <-> index.
  Value toIndex(Value v) {
    return arith::IndexCastOp::create(b, loc, b.getIndexType(), v);
  }
  Value fromIndex(Value v, Type t) {
    return arith::IndexCastOp::create(b, loc, t, v);
  }
  Value extract(Value t, ValueRange at) {
    return tensor::ExtractOp::create(b, loc, t, at);
  }
  Value extractIndex(Value t, ValueRange at) { return toIndex(extract(t, at)); }
  Value insert(Value v, Value t, ValueRange at) {
    return tensor::InsertOp::create(b, loc, v, t, at);
  }
  Value insertIndex(Value v, Value t, ValueRange at) {
    return insert(
        fromIndex(v, cast<RankedTensorType>(t.getType()).getElementType()), t,
        at);
  }
  Value minI(Value x, Value y) { return arith::MinSIOp::create(b, loc, x, y); }
  Value maxI(Value x, Value y) { return arith::MaxSIOp::create(b, loc, x, y); }
  Value addI(Value x, Value y) { return arith::AddIOp::create(b, loc, x, y); }
  /// x (an index, >= 0) rounded up to a multiple of m.
  Value roundUp(Value x, int64_t m) {
    return arith::MulIOp::create(
        b, loc, arith::DivUIOp::create(b, loc, addI(x, idx(m - 1)), idx(m)),
        idx(m));
  }
  Value subI(Value x, Value y) { return arith::SubIOp::create(b, loc, x, y); }
  Value cmpI(arith::CmpIPredicate p, Value x, Value y) {
    return arith::CmpIOp::create(b, loc, p, x, y);
  }
  Value sel(Value c, Value x, Value y) {
    return arith::SelectOp::create(b, loc, c, x, y);
  }

  /// A linalg.generic with one result per `outs` and a body that returns the
  /// values to yield.
  ValueRange
  generic(ValueRange ins, ValueRange outs, ArrayRef<AffineMap> maps,
          ArrayRef<IteratorType> iterators,
          function_ref<SmallVector<Value>(OpBuilder &, Location, ValueRange)>
              body) {
    SmallVector<Type> types;
    for (Value o : outs)
      types.push_back(o.getType());
    auto op = linalg::GenericOp::create(
        b, loc, types, ins, outs, maps, iterators,
        [&](OpBuilder &nb, Location nl, ValueRange args) {
          linalg::YieldOp::create(nb, nl, body(nb, nl, args));
        });
    return op.getResults();
  }

  /// `count` rows: row r is row source[r] of the 2-d tensor `rows`, or zero
  /// where source[r] is outside it (-1: nothing there).
  Value gatherRows(Value rows, Value source, OpFoldResult count) {
    MLIRContext *ctx = b.getContext();
    Type elt = cast<RankedTensorType>(rows.getType()).getElementType();
    AffineExpr r, h;
    bindDims(ctx, r, h);
    Value n = dim(rows, 0);
    Value gathered = generic(
        source, empty({count, sizes(rows)[1]}, elt),
        {AffineMap::get(2, 0, {r}, ctx),
         AffineMap::getMultiDimIdentityMap(2, ctx)},
        {IteratorType::parallel, IteratorType::parallel},
        [&](OpBuilder &nb, Location nl, ValueRange a) {
          Emitter m{nb, nl};
          Value valid = arith::AndIOp::create(
              nb, nl, m.cmpI(arith::CmpIPredicate::sge, a[0], m.idx(0)),
              m.cmpI(arith::CmpIPredicate::slt, a[0], n));
          Value src = m.sel(valid, a[0], m.idx(0));
          Value v = m.extract(rows, {src, linalg::IndexOp::create(nb, nl, 1)});
          return SmallVector<Value>{m.sel(valid, v, m.zeroOf(elt))};
        })[0];
    gathered.getDefiningOp()->setAttr(kGatheredRowsAttr, b.getUnitAttr());
    return gathered;
  }

  /// Elementwise map of same-shaped tensors into a fresh tensor of `elt`.
  Value map(ValueRange ins, Type elt,
            function_ref<Value(Emitter &, ValueRange)> body) {
    Value init = empty(sizes(ins[0]), elt);
    int64_t rank = cast<RankedTensorType>(init.getType()).getRank();
    SmallVector<AffineMap> maps(ins.size() + 1, b.getMultiDimIdentityMap(rank));
    SmallVector<IteratorType> its(rank, IteratorType::parallel);
    return generic(
        ins, init, maps, its, [&](OpBuilder &nb, Location nl, ValueRange args) {
          Emitter e{nb, nl};
          return SmallVector<Value>{body(e, args.take_front(ins.size()))};
        })[0];
  }

  /// Converts every element of `t` to `elt` (f32 in between).
  Value castElements(Value t, Type elt) {
    if (cast<RankedTensorType>(t.getType()).getElementType() == elt)
      return t;
    return map(t, elt, [&](Emitter &e, ValueRange a) {
      return e.fromF32(e.toF32(a[0]), elt);
    });
  }

  /// A counted loop with tensors carried through it.
  ValueRange
  forLoop(Value lb, Value ub, ValueRange inits,
          function_ref<SmallVector<Value>(Emitter &, Value, ValueRange)> body) {
    auto loop = scf::ForOp::create(
        b, loc, lb, ub, idx(1), inits,
        [&](OpBuilder &nb, Location nl, Value iv, ValueRange iter) {
          Emitter e{nb, nl};
          scf::YieldOp::create(nb, nl, body(e, iv, iter));
        });
    return loop.getResults();
  }

  /// Rows [lo, lo + size) of expert `e`'s group, clamped to [0, rows) so that
  /// malformed offsets read nothing out of bounds.
  std::pair<Value, Value> groupBounds(Value offsets, Value e, Value rows) {
    Value lo = extractIndex(offsets, e);
    Value hi = extractIndex(offsets, addI(e, idx(1)));
    lo = minI(maxI(lo, idx(0)), rows);
    hi = minI(maxI(hi, lo), rows);
    return {lo, subI(hi, lo)};
  }

  /// Rows [lo, lo + size) of a 2-d tensor.
  Value rowSlice(Value t, Value lo, Value size) {
    auto type = cast<RankedTensorType>(t.getType());
    auto result = RankedTensorType::get(
        {ShapedType::kDynamic, type.getDimSize(1)}, type.getElementType());
    return tensor::ExtractSliceOp::create(
        b, loc, result, t, ArrayRef<OpFoldResult>{lo, b.getIndexAttr(0)},
        ArrayRef<OpFoldResult>{size, sizes(t)[1]},
        ArrayRef<OpFoldResult>{b.getIndexAttr(1), b.getIndexAttr(1)});
  }

  /// Slice `e` of a tensor stacked on a leading expert dimension, without
  /// that dimension.
  Value expertSlice(Value t, Value e) {
    auto type = cast<RankedTensorType>(t.getType());
    int64_t rank = type.getRank();
    SmallVector<OpFoldResult> offs(rank, b.getIndexAttr(0)),
        sz = sizes(t), strides(rank, b.getIndexAttr(1));
    offs[0] = e;
    sz[0] = b.getIndexAttr(1);
    auto result = RankedTensorType::get(type.getShape().drop_front(),
                                        type.getElementType());
    return tensor::ExtractSliceOp::create(b, loc, result, t, offs, sz, strides);
  }

  /// Inserts `src` (all of it) into `dest` at `offsets`, with sizes taken
  /// from `srcSizes` (dest rank; leading 1s drop dimensions).
  Value insertAt(Value src, Value dest, ArrayRef<OpFoldResult> offsets,
                 ArrayRef<OpFoldResult> srcSizes) {
    SmallVector<OpFoldResult> strides(offsets.size(), b.getIndexAttr(1));
    return tensor::InsertSliceOp::create(b, loc, src, dest, offsets, srcSizes,
                                         strides);
  }

  /// C[m, n] += A[m, k] * B[k, n] (or B[n, k] with transposeB), in f32 in
  /// order of increasing k. C is f32.
  Value matmul(Value a, Value bm, Value c, bool transposeB) {
    MLIRContext *ctx = b.getContext();
    AffineExpr m, n, k;
    bindDims(ctx, m, n, k);
    auto mapA = AffineMap::get(3, 0, {m, k}, ctx);
    auto mapB = AffineMap::get(3, 0,
                               transposeB ? ArrayRef<AffineExpr>{n, k}
                                          : ArrayRef<AffineExpr>{k, n},
                               ctx);
    auto mapC = AffineMap::get(3, 0, {m, n}, ctx);
    return generic(
        {a, bm}, c, {mapA, mapB, mapC},
        {IteratorType::parallel, IteratorType::parallel,
         IteratorType::reduction},
        [&](OpBuilder &nb, Location nl, ValueRange args) {
          Emitter e{nb, nl};
          Value p =
              arith::MulFOp::create(nb, nl, e.toF32(args[0]), e.toF32(args[1]));
          return SmallVector<Value>{arith::AddFOp::create(nb, nl, args[2], p)};
        })[0];
  }

  Value sigmoid(Value x) { return buildSigmoid(b, loc, x); }
};

//===----------------------------------------------------------------------===//
// MX quantize / dequantize on tensors
//===----------------------------------------------------------------------===//

/// How an MX tensor's blocks sit in its shape: the scaled axis `a` is split
/// into (a / block, block), the block dimension at index a + 1.
struct BlockView {
  MXTensorType type;
  SmallVector<ReassociationIndices> reassociation;
  int64_t blockDim;

  explicit BlockView(MXTensorType t) : type(t) {
    int64_t j = 0;
    for (int64_t i = 0; i < t.getRank(); ++i) {
      if (i == int64_t(t.getAxis())) {
        reassociation.push_back({j, j + 1});
        blockDim = j + 1;
        j += 2;
      } else {
        reassociation.push_back({j++});
      }
    }
  }
  int64_t expandedRank() const { return type.getRank() + 1; }

  /// Splits the scaled axis of `t` (of the MX type's shape).
  Value expand(Emitter &e, Value t) const {
    auto tt = cast<RankedTensorType>(t.getType());
    SmallVector<int64_t> shape;
    for (int64_t i = 0; i < tt.getRank(); ++i) {
      if (i == int64_t(type.getAxis())) {
        shape.push_back(tt.getDimSize(i) / type.getBlockSize());
        shape.push_back(type.getBlockSize());
      } else {
        shape.push_back(tt.getDimSize(i));
      }
    }
    auto rt = RankedTensorType::get(shape, tt.getElementType());
    return tensor::ExpandShapeOp::create(e.b, e.loc, rt, t, reassociation);
  }
  Value collapse(Emitter &e, Value t, Type elt) const {
    auto rt = RankedTensorType::get(type.getShape(), elt);
    return tensor::CollapseShapeOp::create(e.b, e.loc, rt, t, reassociation);
  }
  /// Sizes of the expanded tensor and of the scale tensor, from a tensor of
  /// the MX type's shape.
  SmallVector<OpFoldResult> expandedSizes(Emitter &e, Value like) const {
    SmallVector<OpFoldResult> s;
    for (auto [i, sz] : llvm::enumerate(e.sizes(like))) {
      if (int64_t(i) == int64_t(type.getAxis())) {
        s.push_back(e.b.getIndexAttr(type.getShape()[i] / type.getBlockSize()));
        s.push_back(e.b.getIndexAttr(type.getBlockSize()));
      } else {
        s.push_back(sz);
      }
    }
    return s;
  }
  SmallVector<OpFoldResult> scaleSizes(Emitter &e, Value like) const {
    SmallVector<OpFoldResult> s = e.sizes(like);
    s[type.getAxis()] =
        e.b.getIndexAttr(type.getShape()[type.getAxis()] / type.getBlockSize());
    return s;
  }
  AffineMap identity(MLIRContext *ctx) const {
    return AffineMap::getMultiDimIdentityMap(expandedRank(), ctx);
  }
  /// The expanded iteration space -> the scale tensor (drops the block dim).
  AffineMap toScales(MLIRContext *ctx) const {
    SmallVector<AffineExpr> exprs;
    for (int64_t i = 0; i < expandedRank(); ++i)
      if (i != blockDim)
        exprs.push_back(getAffineDimExpr(i, ctx));
    return AffineMap::get(expandedRank(), 0, exprs, ctx);
  }
};

/// Quantizes `x` (shape of `type`) to (data, scales) with the MX rules.
std::pair<Value, Value> quantizeMX(Emitter &e, Value x, MXTensorType type,
                                   ScaleMode mode);

/// (data, scales) of `type` -> a float tensor of element type `elt`.
Value dequantizeMX(Emitter &e, Value data, Value scales, MXTensorType type,
                   Type elt);

/// Quantizes `x` (shape of `type`) to (data, scales) with the blockwise FP8
/// rules (moe.quantize).
std::pair<Value, Value> quantizeFP8Block(Emitter &e, Value x,
                                         FP8BlockTensorType type);

/// (data, scales) of `type` -> a float tensor of element type `elt`.
Value dequantizeFP8Block(Emitter &e, Value data, Value scales,
                         FP8BlockTensorType type, Type elt);

/// A GEMM operand as a float tensor: block-scaled (MX, blockwise FP8)
/// operands are dequantized to f32.
Value gemmOperand(Emitter &e, Type original, ValueRange converted);

/// If `live` bounds `op`: sets `e` to compute rows [0, n) of `rows`, n the
/// bounding dispatch's offsets[E] (clamped to [0, rows]), and returns true.
bool boundRows(Emitter &e, Operation *op, const LiveRowBounds *live,
               ConversionPatternRewriter &rewriter, int64_t rows);

/// The ops under `root` whose rows the lowering computes only up to a
/// dispatch's offsets[E], with that dispatch (see LiveRows.h).
LiveRowBounds findLiveRowBounds(Operation *root);

/// The router's per-expert scores (f32 [T, E]) from f32 logits: softmax,
/// sigmoid, or the logits themselves when softmax comes after top-k.
Value routerScores(Emitter &e, ScoreFunction score, bool softmaxAfterTopk,
                   Value logits);

/// The router's combine weights from the picked scores (f32 [T, k]).
Value routerWeights(Emitter &e, RouterOp op, Value picked);

/// What a router ranks its experts by: `scores` [T, E], plus `bias[e]`
/// when the router has a selection bias (null: the scores themselves).
Value routerRanking(Emitter &e, Value scores, Value bias);

/// picked[t, j] = scores[t, indices[t, j]] (f32 [T, k]).
Value gatherPicked(Emitter &e, Value scores, Value indices);

/// For every row of a [T, n] f32 tensor: its max m and sum_j exp(v_j - m)
/// (in order); the pieces of softmax and log-sum-exp.
std::pair<Value, Value> rowMaxAndSumExp(Emitter &e, Value v);

/// Row-wise softmax of a [T, n] f32 tensor (max-subtracted, sums in order).
Value rowSoftmax(Emitter &e, Value v);

/// The same from the rows' max and sum of exp (rowMaxAndSumExp), for
/// callers that need those too.
Value rowSoftmaxFrom(Emitter &e, Value v, Value rowMax, Value sum);

/// Divides every row of a [T, k] f32 tensor by its sum (in slot order).
Value rowNormalize(Emitter &e, Value v);

/// The lowerings of the model ops (embedding, RMSNorm, rotary, attention,
/// cross-entropy) and of the gradient ops -moe-autodiff emits.
void populateModelOpLoweringPatterns(const TypeConverter &converter,
                                     RewritePatternSet &patterns);

} // namespace mlir::moe::detail

#endif
