//===- ModelOps.cpp - model ops and gradient ops to linalg ----------------===//
//
// The reference lowerings of the transformer ops around the MoE block
// (embedding, RMSNorm, rotary, attention, cross-entropy) and of the gradient
// ops -moe-autodiff emits. Every op becomes linalg.generic ops with parallel
// and reduction loops only, so the same IR serves the CPU and the
// data-parallel GPU lowering. All arithmetic is f32.
//
//===----------------------------------------------------------------------===//

#include "Emitter.h"

#include "moe/Dialect/MoE/IR/MoEOps.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::detail;

namespace {

constexpr IteratorType kPar = IteratorType::parallel;
constexpr IteratorType kRed = IteratorType::reduction;

AffineMap dims(MLIRContext *ctx, unsigned n, ArrayRef<AffineExpr> exprs) {
  return AffineMap::get(n, 0, exprs, ctx);
}

/// The first `n` loop dimensions as expressions.
SmallVector<AffineExpr> loopDims(MLIRContext *ctx, unsigned n) {
  SmallVector<AffineExpr> d;
  for (unsigned i = 0; i < n; ++i)
    d.push_back(getAffineDimExpr(i, ctx));
  return d;
}

Value add(Emitter &e, Value x, Value y) {
  return arith::AddFOp::create(e.b, e.loc, x, y);
}
Value sub(Emitter &e, Value x, Value y) {
  return arith::SubFOp::create(e.b, e.loc, x, y);
}
Value mul(Emitter &e, Value x, Value y) {
  return arith::MulFOp::create(e.b, e.loc, x, y);
}
Value div(Emitter &e, Value x, Value y) {
  return arith::DivFOp::create(e.b, e.loc, x, y);
}
Value loopIndex(Emitter &e, unsigned d) {
  return linalg::IndexOp::create(e.b, e.loc, d);
}
/// 0 <= i < n for index values.
Value inRange(Emitter &e, Value i, Value n) {
  return arith::AndIOp::create(e.b, e.loc,
                               e.cmpI(arith::CmpIPredicate::sge, i, e.idx(0)),
                               e.cmpI(arith::CmpIPredicate::slt, i, n));
}

Type f32Of(Emitter &e) { return e.b.getF32Type(); }

/// sum over the reduction loops of a * b into a fresh f32 tensor `init`
/// (zeros), in loop order.
Value sumOfProducts(Emitter &e, Value a, Value bv, Value init, AffineMap mapA,
                    AffineMap mapB, AffineMap mapC,
                    ArrayRef<IteratorType> iterators) {
  return e.generic({a, bv}, init, {mapA, mapB, mapC}, iterators,
                   [&](OpBuilder &nb, Location nl, ValueRange x) {
                     Emitter n{nb, nl};
                     return SmallVector<Value>{
                         add(n, x[2], mul(n, n.toF32(x[0]), n.toF32(x[1])))};
                   })[0];
}

/// Sum of a tensor's last dimension: [..., n] -> [...] (f32, in order), of
/// f(x) for each element.
Value lastDimSum(Emitter &e, Value v, function_ref<Value(Emitter &, Value)> f) {
  MLIRContext *ctx = e.b.getContext();
  auto type = cast<RankedTensorType>(v.getType());
  unsigned r = type.getRank();
  SmallVector<AffineExpr> d = loopDims(ctx, r);
  SmallVector<IteratorType> its(r, kPar);
  its.back() = kRed;
  SmallVector<OpFoldResult> sizes = e.sizes(v);
  sizes.pop_back();
  return e.generic(v, e.zeros(sizes, f32Of(e)),
                   {dims(ctx, r, d), dims(ctx, r, ArrayRef(d).drop_back())},
                   its, [&](OpBuilder &nb, Location nl, ValueRange x) {
                     Emitter n{nb, nl};
                     return SmallVector<Value>{
                         add(n, x[1], f(n, n.toF32(x[0])))};
                   })[0];
}

/// The reassociation of a rank-`rank` tensor that folds all dims but the
/// last `keep` into one: keep 1 makes [..., n] rows [R, n]; keep 0, [R].
SmallVector<ReassociationIndices> foldLeading(int64_t rank, int64_t keep) {
  SmallVector<ReassociationIndices> assoc(1 + keep);
  for (int64_t i = 0; i < rank; ++i)
    assoc[std::max<int64_t>(0, i - (rank - 1 - keep))].push_back(i);
  return assoc;
}

/// Softmax over the last dimension of a tensor of any rank (f32).
Value lastDimSoftmax(Emitter &e, Value v) {
  auto type = cast<RankedTensorType>(v.getType());
  if (type.getRank() == 2)
    return rowSoftmax(e, v);
  SmallVector<ReassociationIndices> assoc = foldLeading(type.getRank(), 1);
  Value rows = tensor::CollapseShapeOp::create(e.b, e.loc, v, assoc);
  Value p = rowSoftmax(e, rows);
  return tensor::ExpandShapeOp::create(e.b, e.loc, type, p, assoc, e.sizes(v));
}

//===----------------------------------------------------------------------===//
// Embedding
//===----------------------------------------------------------------------===//

struct EmbeddingLowering : OpConversionPattern<EmbeddingOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(EmbeddingOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Emitter e{rewriter, op.getLoc()};
    MLIRContext *ctx = rewriter.getContext();
    Value table = adaptor.getTable(), ids = adaptor.getIds();
    unsigned r = op.getIds().getType().getRank();
    SmallVector<AffineExpr> d = loopDims(ctx, r + 1);
    Type elt = op.getType().getElementType();
    SmallVector<OpFoldResult> sizes = e.sizes(ids);
    sizes.push_back(e.sizes(table)[1]);
    Value vocab = e.dim(table, 0);
    Value out = e.generic(
        ids, e.empty(sizes, elt),
        {dims(ctx, r + 1, ArrayRef(d).drop_back()), dims(ctx, r + 1, d)},
        SmallVector<IteratorType>(r + 1, kPar),
        [&](OpBuilder &nb, Location nl, ValueRange x) {
          Emitter n{nb, nl};
          Value id = n.toIndex(x[0]);
          Value ok = inRange(n, id, vocab);
          Value v = n.toF32(
              n.extract(table, {n.sel(ok, id, n.idx(0)), loopIndex(n, r)}));
          return SmallVector<Value>{n.fromF32(n.sel(ok, v, n.f32(0)), elt)};
        })[0];
    rewriter.replaceOp(op, out);
    return success();
  }
};

/// d table [V, H] = the sum of the rows of `grad` whose id is v, in
/// position order. Without a scatter and without a pass over [V, H, T]:
/// next[t] links each position to the next one holding its id (a scan of
/// the later ids), first[v] is the first position holding v (a scan of
/// all ids), and row v walks its chain from first[v], adding its rows in
/// position order (the order of the sequential sum, so every path gives
/// the same bits). Work: T^2 / 2 + V T id comparisons, V H outputs, T H
/// additions. Out-of-range ids start no chain: their rows are dropped.
struct EmbeddingGradLowering : OpConversionPattern<EmbeddingGradOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(EmbeddingGradOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    if (op.getType().isDynamicDim(0))
      return rewriter.notifyMatchFailure(op, "dynamic vocabulary size");
    Emitter e{rewriter, op.getLoc()};
    MLIRContext *ctx = rewriter.getContext();
    Value ids = adaptor.getIds(), grad = adaptor.getGrad();
    unsigned r = op.getIds().getType().getRank();
    // ids [T] and grad [T, H].
    if (r != 1) {
      ids = tensor::CollapseShapeOp::create(rewriter, e.loc, ids,
                                            foldLeading(r, 0));
      grad = tensor::CollapseShapeOp::create(rewriter, e.loc, grad,
                                             foldLeading(r + 1, 1));
    }
    Type i32 = rewriter.getI32Type();
    Value n = e.dim(ids, 0);
    AffineExpr d0, d1;
    bindDims(ctx, d0, d1);
    auto id1 = AffineMap::get(1, 0, {d0}, ctx);
    auto none = [&](Emitter &m) {
      return arith::ConstantOp::create(m.b, m.loc, m.b.getI32IntegerAttr(-1))
          .getResult();
    };
    // The first position in [from, n) holding `target` (an index), or -1.
    auto firstHolding = [&](Emitter &m, Value from, Value target) {
      return m.forLoop(
          from, n, none(m), [&](Emitter &l, Value t, ValueRange acc) {
            Value hit = arith::AndIOp::create(
                l.b, l.loc, l.cmpI(arith::CmpIPredicate::eq, acc[0], none(l)),
                l.cmpI(arith::CmpIPredicate::eq, l.toIndex(l.extract(ids, {t})),
                       target));
            return SmallVector<Value>{
                l.sel(hit, l.fromIndex(t, l.b.getI32Type()), acc[0])};
          })[0];
    };
    // next[t]: the first t' > t with ids[t'] == ids[t], or -1.
    Value next = e.generic(ids, e.empty(e.sizes(ids), i32), {id1, id1}, {kPar},
                           [&](OpBuilder &nb, Location nl, ValueRange a) {
                             Emitter m{nb, nl};
                             Value from = m.addI(loopIndex(m, 0), m.idx(1));
                             return SmallVector<Value>{
                                 firstHolding(m, from, m.toIndex(a[0]))};
                           })[0];
    // first[v]: the first position holding v, or -1.
    auto type = op.getType();
    int64_t vocab = type.getDimSize(0);
    Value first = e.generic(
        ValueRange{}, e.empty({rewriter.getIndexAttr(vocab)}, i32), {id1},
        {kPar}, [&](OpBuilder &nb, Location nl, ValueRange) {
          Emitter m{nb, nl};
          return SmallVector<Value>{firstHolding(m, m.idx(0), loopIndex(m, 0))};
        })[0];
    // Row v: its chain's rows, in position order.
    Type f32 = f32Of(e);
    Value out = e.generic(
        first, e.empty({rewriter.getIndexAttr(vocab), e.sizes(grad)[1]}, f32),
        {AffineMap::get(2, 0, {d0}, ctx), AffineMap::get(2, 0, {d0, d1}, ctx)},
        {kPar, kPar}, [&](OpBuilder &nb, Location nl, ValueRange a) {
          Emitter m{nb, nl};
          Value h = loopIndex(m, 1);
          Type types[] = {i32, f32};
          auto loop = scf::WhileOp::create(
              nb, nl, types, ValueRange{a[0], m.f32(0)},
              [&](OpBuilder &cb, Location cl, ValueRange s) {
                Emitter c{cb, cl};
                scf::ConditionOp::create(
                    cb, cl,
                    c.cmpI(arith::CmpIPredicate::sge, s[0],
                           arith::ConstantOp::create(cb, cl,
                                                     cb.getI32IntegerAttr(0))),
                    s);
              },
              [&](OpBuilder &bb, Location bl, ValueRange s) {
                Emitter w{bb, bl};
                Value t = w.toIndex(s[0]);
                Value sum = add(w, s[1], w.toF32(w.extract(grad, {t, h})));
                scf::YieldOp::create(bb, bl,
                                     ValueRange{w.extract(next, {t}), sum});
              });
          return SmallVector<Value>{loop.getResult(1)};
        })[0];
    rewriter.replaceOp(op, e.castElements(out, type.getElementType()));
    return success();
  }
};

//===----------------------------------------------------------------------===//
// RMSNorm
//===----------------------------------------------------------------------===//

/// 1 / sqrt(mean(x^2) + eps) for every row of `x` (f32 [...]).
Value rmsInverse(Emitter &e, Value x, double eps) {
  int64_t h = cast<RankedTensorType>(x.getType()).getShape().back();
  Value sumSq =
      lastDimSum(e, x, [](Emitter &n, Value v) { return mul(n, v, v); });
  return e.map(sumSq, f32Of(e), [&](Emitter &n, ValueRange a) {
    Value mean = div(n, a[0], n.f32(double(h)));
    Value s = math::SqrtOp::create(n.b, n.loc, add(n, mean, n.f32(eps)));
    return div(n, n.f32(1.0), s);
  });
}

/// Maps of an elementwise loop over `x` [..., H] reading a row value [...]
/// and a [H] vector.
struct RowMapsN {
  AffineMap full, row, last;
  SmallVector<IteratorType> par;
  RowMapsN(MLIRContext *ctx, unsigned r) : par(r, kPar) {
    SmallVector<AffineExpr> d = loopDims(ctx, r);
    full = dims(ctx, r, d);
    row = dims(ctx, r, ArrayRef(d).drop_back());
    last = dims(ctx, r, d.back());
  }
};

struct RMSNormLowering : OpConversionPattern<RMSNormOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(RMSNormOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Emitter e{rewriter, op.getLoc()};
    Value x = adaptor.getInput(), w = adaptor.getWeight();
    Value inv = rmsInverse(e, x, op.getEps().convertToDouble());
    RowMapsN m(rewriter.getContext(), op.getType().getRank());
    Type elt = op.getType().getElementType();
    Value out = e.generic(
        {x, inv, w}, e.empty(e.sizes(x), elt), {m.full, m.row, m.last, m.full},
        m.par, [&](OpBuilder &nb, Location nl, ValueRange a) {
          Emitter n{nb, nl};
          Value y = mul(n, mul(n, n.toF32(a[0]), a[1]), n.toF32(a[2]));
          return SmallVector<Value>{n.fromF32(y, elt)};
        })[0];
    rewriter.replaceOp(op, out);
    return success();
  }
};

struct RMSNormGradLowering : OpConversionPattern<RMSNormGradOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(RMSNormGradOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Emitter e{rewriter, op.getLoc()};
    MLIRContext *ctx = rewriter.getContext();
    Value x = adaptor.getInput(), w = adaptor.getWeight(),
          g = adaptor.getGrad();
    unsigned r = op.getInput().getType().getRank();
    int64_t h = op.getInput().getType().getShape().back();
    Value inv = rmsInverse(e, x, op.getEps().convertToDouble());
    RowMapsN m(ctx, r);
    // c = sum_h grad * weight * x per row.
    SmallVector<IteratorType> rowRed = m.par;
    rowRed.back() = kRed;
    SmallVector<OpFoldResult> rowSizes = e.sizes(x);
    rowSizes.pop_back();
    Value c = e.generic(
        {g, w, x}, e.zeros(rowSizes, f32Of(e)), {m.full, m.last, m.full, m.row},
        rowRed, [&](OpBuilder &nb, Location nl, ValueRange a) {
          Emitter n{nb, nl};
          Value p = mul(n, mul(n, n.toF32(a[0]), n.toF32(a[1])), n.toF32(a[2]));
          return SmallVector<Value>{add(n, a[3], p)};
        })[0];
    Type dxElt = op.getInputGrad().getType().getElementType();
    Value dx = e.generic(
        {g, w, x, inv, c}, e.empty(e.sizes(x), dxElt),
        {m.full, m.last, m.full, m.row, m.row, m.full}, m.par,
        [&](OpBuilder &nb, Location nl, ValueRange a) {
          Emitter n{nb, nl};
          Value ri = a[3];
          Value first = mul(n, mul(n, n.toF32(a[0]), n.toF32(a[1])), ri);
          Value r3 = mul(n, mul(n, ri, ri), ri);
          Value second =
              div(n, mul(n, mul(n, n.toF32(a[2]), r3), a[4]), n.f32(double(h)));
          return SmallVector<Value>{n.fromF32(sub(n, first, second), dxElt)};
        })[0];
    // d_weight[h] = sum over rows of grad * x * r: loops (h, row), the
    // rows folded into one dim (one reduction loop, which
    // -moe-gpu-split-reductions can spread over the GPU).
    if (r > 2) {
      g = tensor::CollapseShapeOp::create(rewriter, e.loc, g,
                                          foldLeading(r, 1));
      x = tensor::CollapseShapeOp::create(rewriter, e.loc, x,
                                          foldLeading(r, 1));
      inv = tensor::CollapseShapeOp::create(rewriter, e.loc, inv,
                                            foldLeading(r - 1, 0));
      r = 2;
    }
    SmallVector<AffineExpr> d = loopDims(ctx, r);
    SmallVector<AffineExpr> rows(d.begin() + 1, d.end()), rowsH = rows;
    rowsH.push_back(d[0]);
    SmallVector<IteratorType> its(r, kRed);
    its[0] = kPar;
    Value dw =
        e.generic({g, x, inv}, e.zeros({rewriter.getIndexAttr(h)}, f32Of(e)),
                  {dims(ctx, r, rowsH), dims(ctx, r, rowsH), dims(ctx, r, rows),
                   dims(ctx, r, d[0])},
                  its, [&](OpBuilder &nb, Location nl, ValueRange a) {
                    Emitter n{nb, nl};
                    Value p =
                        mul(n, mul(n, n.toF32(a[0]), n.toF32(a[1])), a[2]);
                    return SmallVector<Value>{add(n, a[3], p)};
                  })[0];
    rewriter.replaceOp(
        op, {dx, e.castElements(
                     dw, op.getWeightGrad().getType().getElementType())});
    return success();
  }
};

//===----------------------------------------------------------------------===//
// Rotary position embedding
//===----------------------------------------------------------------------===//

struct RotaryLowering : OpConversionPattern<RotaryOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(RotaryOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Emitter e{rewriter, op.getLoc()};
    MLIRContext *ctx = rewriter.getContext();
    Value x = adaptor.getInput();
    int64_t dim = op.getInput().getType().getDimSize(3), half = dim / 2;
    float theta = float(op.getTheta().convertToDouble());
    bool inverse = op.getInverse();
    Type elt = op.getType().getElementType();
    AffineMap id = AffineMap::getMultiDimIdentityMap(4, ctx);
    Value out = e.generic(
        x, e.empty(e.sizes(x), elt), {id, id},
        SmallVector<IteratorType>(4, kPar),
        [&](OpBuilder &nb, Location nl, ValueRange a) {
          Emitter n{nb, nl};
          Value b = loopIndex(n, 0), s = loopIndex(n, 1), h = loopIndex(n, 2),
                d = loopIndex(n, 3);
          Value low = n.cmpI(arith::CmpIPredicate::slt, d, n.idx(half));
          Value partner =
              n.sel(low, n.addI(d, n.idx(half)), n.subI(d, n.idx(half)));
          Value i = n.sel(low, d, n.subI(d, n.idx(half)));
          Value xv = n.toF32(a[0]);
          Value xp = n.toF32(n.extract(x, {b, s, h, partner}));
          auto toF = [&](Value index) {
            Value i64 =
                arith::IndexCastOp::create(nb, nl, nb.getI64Type(), index);
            return arith::SIToFPOp::create(nb, nl, nb.getF32Type(), i64);
          };
          // f_i = 1 / theta^(2i / D); angle = s * f_i (as Hugging Face
          // computes them, in f32).
          Value expo = div(n, toF(arith::MulIOp::create(nb, nl, i, n.idx(2))),
                           n.f32(double(dim)));
          Value freq = div(n, n.f32(1.0),
                           math::PowFOp::create(nb, nl, n.f32(theta), expo));
          Value angle = mul(n, toF(s), freq);
          Value cos = math::CosOp::create(nb, nl, angle);
          Value sin = math::SinOp::create(nb, nl, angle);
          if (inverse)
            sin = arith::NegFOp::create(nb, nl, sin);
          // low half: x cos - x[i + D/2] sin; high half: x cos + x[i] sin.
          Value ps = mul(n, xp, sin);
          Value y = n.sel(low, sub(n, mul(n, xv, cos), ps),
                          add(n, mul(n, xv, cos), ps));
          return SmallVector<Value>{n.fromF32(y, elt)};
        })[0];
    rewriter.replaceOp(op, out);
    return success();
  }
};

//===----------------------------------------------------------------------===//
// Attention
//===----------------------------------------------------------------------===//

/// The attention probabilities p [B, N, S, S] (f32) of query [B, S, N, D]
/// and key [B, S, M, D], keys of other documents hidden where `documents`
/// [B, S] is given.
Value attentionProbs(Emitter &e, Value q, Value k, Value documents,
                     int64_t group, bool causal, double scale) {
  MLIRContext *ctx = e.b.getContext();
  // scores[b, n, i, j] = sum_d q[b, i, n, d] * k[b, j, n / G, d]
  SmallVector<AffineExpr> d = loopDims(ctx, 5); // b n i j d
  AffineExpr b = d[0], n = d[1], i = d[2], j = d[3], dd = d[4];
  SmallVector<OpFoldResult> qs = e.sizes(q);
  SmallVector<OpFoldResult> sizes = {qs[0], qs[2], qs[1], qs[1]};
  Value scores = sumOfProducts(
      e, q, k, e.zeros(sizes, f32Of(e)), dims(ctx, 5, {b, i, n, dd}),
      dims(ctx, 5, {b, j, n.floorDiv(group), dd}), dims(ctx, 5, {b, n, i, j}),
      {kPar, kPar, kPar, kPar, kRed});
  float inf = std::numeric_limits<float>::infinity();
  Value masked = e.map(scores, f32Of(e), [&](Emitter &m, ValueRange a) {
    Value v = mul(m, a[0], m.f32(scale));
    // linalg.map-style body of a generic: the loop indices are available.
    Value hidden;
    if (causal)
      hidden =
          m.cmpI(arith::CmpIPredicate::sgt, loopIndex(m, 3), loopIndex(m, 2));
    if (documents) {
      Value batch = loopIndex(m, 0);
      Value other = m.cmpI(arith::CmpIPredicate::ne,
                           m.extract(documents, {batch, loopIndex(m, 2)}),
                           m.extract(documents, {batch, loopIndex(m, 3)}));
      hidden = hidden ? arith::OrIOp::create(m.b, m.loc, hidden, other) : other;
    }
    return hidden ? m.sel(hidden, m.f32(-inf), v) : v;
  });
  return lastDimSoftmax(e, masked);
}

struct AttentionLowering : OpConversionPattern<AttentionOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(AttentionOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Emitter e{rewriter, op.getLoc()};
    MLIRContext *ctx = rewriter.getContext();
    Value q = adaptor.getQuery(), k = adaptor.getKey(), v = adaptor.getValue();
    int64_t group = op.getQuery().getType().getDimSize(2) /
                    op.getKey().getType().getDimSize(2);
    Value p = attentionProbs(e, q, k, adaptor.getDocuments(), group,
                             op.getCausal(), op.getScaleOrDefault());
    // out[b, i, n, d] = sum_j p[b, n, i, j] * v[b, j, n / G, d]
    SmallVector<AffineExpr> d = loopDims(ctx, 5); // b i n d j
    AffineExpr b = d[0], i = d[1], n = d[2], dd = d[3], j = d[4];
    Value out = sumOfProducts(
        e, p, v, e.zeros(e.sizes(q), f32Of(e)), dims(ctx, 5, {b, n, i, j}),
        dims(ctx, 5, {b, j, n.floorDiv(group), dd}),
        dims(ctx, 5, {b, i, n, dd}), {kPar, kPar, kPar, kPar, kRed});
    rewriter.replaceOp(op, e.castElements(out, op.getType().getElementType()));
    return success();
  }
};

struct AttentionGradLowering : OpConversionPattern<AttentionGradOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(AttentionGradOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Emitter e{rewriter, op.getLoc()};
    MLIRContext *ctx = rewriter.getContext();
    Value q = adaptor.getQuery(), k = adaptor.getKey(), v = adaptor.getValue(),
          dout = adaptor.getGrad();
    int64_t heads = op.getQuery().getType().getDimSize(2);
    int64_t kvHeads = op.getKey().getType().getDimSize(2);
    int64_t group = heads / kvHeads;
    double scale = op.getScaleOrDefault();
    Value p = attentionProbs(e, q, k, adaptor.getDocuments(), group,
                             op.getCausal(), scale);
    SmallVector<AffineExpr> d = loopDims(ctx, 5);
    SmallVector<IteratorType> red5 = {kPar, kPar, kPar, kPar, kRed};
    SmallVector<OpFoldResult> qs = e.sizes(q);
    SmallVector<OpFoldResult> perQueryHead = {qs[0], qs[1], qs[2], qs[3]};
    SmallVector<OpFoldResult> probSizes = {qs[0], qs[2], qs[1], qs[1]};

    // Per query head, loops (b, j, n, d, i):
    // dv_full[b, j, n, d] = sum_i p[b, n, i, j] * dout[b, i, n, d].
    AffineExpr b = d[0], j = d[1], n = d[2], dd = d[3], i = d[4];
    Value dvFull = sumOfProducts(
        e, p, dout, e.zeros(perQueryHead, f32Of(e)), dims(ctx, 5, {b, n, i, j}),
        dims(ctx, 5, {b, i, n, dd}), dims(ctx, 5, {b, j, n, dd}), red5);

    // dp[b, n, i, j] = sum_d dout[b, i, n, d] * v[b, j, n / G, d]: loops
    // (b, n, i, j, d).
    {
      b = d[0], n = d[1], i = d[2], j = d[3], dd = d[4];
    }
    Value dp = sumOfProducts(e, dout, v, e.zeros(probSizes, f32Of(e)),
                             dims(ctx, 5, {b, i, n, dd}),
                             dims(ctx, 5, {b, j, n.floorDiv(group), dd}),
                             dims(ctx, 5, {b, n, i, j}), red5);
    // ds = p * (dp - sum_j dp * p) * scale.
    SmallVector<AffineExpr> d4 = loopDims(ctx, 4);
    AffineMap full4 = dims(ctx, 4, d4);
    AffineMap row4 = dims(ctx, 4, ArrayRef(d4).drop_back());
    Value rowDot =
        e.generic({dp, p}, e.zeros({qs[0], qs[2], qs[1]}, f32Of(e)),
                  {full4, full4, row4}, {kPar, kPar, kPar, kRed},
                  [&](OpBuilder &nb, Location nl, ValueRange a) {
                    Emitter m{nb, nl};
                    return SmallVector<Value>{add(m, a[2], mul(m, a[0], a[1]))};
                  })[0];
    Value ds = e.generic({p, dp, rowDot}, e.empty(probSizes, f32Of(e)),
                         {full4, full4, row4, full4}, {kPar, kPar, kPar, kPar},
                         [&](OpBuilder &nb, Location nl, ValueRange a) {
                           Emitter m{nb, nl};
                           Value t = mul(m, a[0], sub(m, a[1], a[2]));
                           return SmallVector<Value>{mul(m, t, m.f32(scale))};
                         })[0];
    // dq[b, i, n, d] = sum_j ds[b, n, i, j] * k[b, j, n / G, d]: loops
    // (b, i, n, d, j).
    {
      b = d[0], i = d[1], n = d[2], dd = d[3], j = d[4];
    }
    Value dq = sumOfProducts(e, ds, k, e.zeros(perQueryHead, f32Of(e)),
                             dims(ctx, 5, {b, n, i, j}),
                             dims(ctx, 5, {b, j, n.floorDiv(group), dd}),
                             dims(ctx, 5, {b, i, n, dd}), red5);
    // dk_full[b, j, n, d] = sum_i ds[b, n, i, j] * q[b, i, n, d]: loops
    // (b, j, n, d, i).
    {
      b = d[0], j = d[1], n = d[2], dd = d[3], i = d[4];
    }
    Value dkFull = sumOfProducts(
        e, ds, q, e.zeros(perQueryHead, f32Of(e)), dims(ctx, 5, {b, n, i, j}),
        dims(ctx, 5, {b, i, n, dd}), dims(ctx, 5, {b, j, n, dd}), red5);
    // Key/value heads: sum the query heads of each group: heads split into
    // [M, G] (head m * G + g), then loops (b, j, m, d, g).
    auto groupSum = [&](Value full) {
      if (group == 1)
        return full;
      AffineExpr b = d[0], j = d[1], m = d[2], dd = d[3], g = d[4];
      auto fullType = cast<RankedTensorType>(full.getType());
      auto splitType =
          RankedTensorType::get({fullType.getDimSize(0), fullType.getDimSize(1),
                                 kvHeads, group, fullType.getDimSize(3)},
                                fullType.getElementType());
      SmallVector<OpFoldResult> splitSizes = {
          qs[0], qs[1], rewriter.getIndexAttr(kvHeads),
          rewriter.getIndexAttr(group), qs[3]};
      Value split = tensor::ExpandShapeOp::create(
          rewriter, e.loc, splitType, full,
          SmallVector<ReassociationIndices>{{0}, {1}, {2, 3}, {4}}, splitSizes);
      SmallVector<OpFoldResult> kvSizes = {
          qs[0], qs[1], rewriter.getIndexAttr(kvHeads), qs[3]};
      return e.generic(
          split, e.zeros(kvSizes, f32Of(e)),
          {dims(ctx, 5, {b, j, m, g, dd}), dims(ctx, 5, {b, j, m, dd})}, red5,
          [&](OpBuilder &nb, Location nl, ValueRange a) {
            Emitter x{nb, nl};
            return SmallVector<Value>{add(x, a[1], a[0])};
          })[0];
    };
    rewriter.replaceOp(
        op, {e.castElements(dq, op.getQueryGrad().getType().getElementType()),
             e.castElements(groupSum(dkFull),
                            op.getKeyGrad().getType().getElementType()),
             e.castElements(groupSum(dvFull),
                            op.getValueGrad().getType().getElementType())});
    return success();
  }
};

//===----------------------------------------------------------------------===//
// Cross-entropy
//===----------------------------------------------------------------------===//

/// For every row: (a label in [0, V) or not, the label as an index).
std::pair<Value, Value> labelOf(Emitter &n, Value label, Value vocab) {
  Value l = n.toIndex(label);
  Value ok = inRange(n, l, vocab);
  return {ok, n.sel(ok, l, n.idx(0))};
}

/// The number of counted rows, as a 0-d f32 tensor.
Value countedRows(Emitter &e, Value labels, Value vocab) {
  MLIRContext *ctx = e.b.getContext();
  return e.generic(labels, e.zeros({}, f32Of(e)),
                   {dims(ctx, 1, getAffineDimExpr(0, ctx)), dims(ctx, 1, {})},
                   {kRed}, [&](OpBuilder &nb, Location nl, ValueRange a) {
                     Emitter n{nb, nl};
                     auto [ok, l] = labelOf(n, a[0], vocab);
                     (void)l;
                     return SmallVector<Value>{
                         n.sel(ok, add(n, a[1], n.f32(1.0)), a[1])};
                   })[0];
}

struct CrossEntropyLowering : OpConversionPattern<CrossEntropyOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(CrossEntropyOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Emitter e{rewriter, op.getLoc()};
    MLIRContext *ctx = rewriter.getContext();
    Value logits = e.castElements(adaptor.getLogits(), f32Of(e));
    Value labels = adaptor.getLabels();
    Value vocab = e.dim(logits, 1);
    auto [rowMax, sumExp] = rowMaxAndSumExp(e, logits);
    // The loss of every counted row, summed in row order.
    AffineMap r1 = dims(ctx, 1, getAffineDimExpr(0, ctx)),
              scalar = dims(ctx, 1, {});
    Value total = e.generic(
        {labels, rowMax, sumExp}, e.zeros({}, f32Of(e)), {r1, r1, r1, scalar},
        {kRed}, [&](OpBuilder &nb, Location nl, ValueRange a) {
          Emitter m{nb, nl};
          auto [ok, l] = labelOf(m, a[0], vocab);
          Value x = m.extract(logits, {loopIndex(m, 0), l});
          Value lse = add(m, a[1], math::LogOp::create(nb, nl, a[2]));
          return SmallVector<Value>{
              m.sel(ok, add(m, a[3], sub(m, lse, x)), a[3])};
        })[0];
    Value count = countedRows(e, labels, vocab);
    // total / count in a one-iteration loop (not a 0-d generic: that would
    // be host code, and on the GPU these tensors live in device memory).
    AffineMap none = dims(ctx, 1, {});
    Value one = e.generic(
        {total, count}, e.empty({rewriter.getIndexAttr(1)}, f32Of(e)),
        {none, none, r1}, {kPar},
        [&](OpBuilder &nb, Location nl, ValueRange a) {
          Emitter m{nb, nl};
          Value any = arith::CmpFOp::create(nb, nl, arith::CmpFPredicate::OGT,
                                            a[1], m.f32(0));
          return SmallVector<Value>{m.sel(any, div(m, a[0], a[1]), m.f32(0))};
        })[0];
    Value loss =
        tensor::CollapseShapeOp::create(rewriter, e.loc, op.getType(), one,
                                        SmallVector<ReassociationIndices>{});
    rewriter.replaceOp(op, loss);
    return success();
  }
};

struct CrossEntropyGradLowering : OpConversionPattern<CrossEntropyGradOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(CrossEntropyGradOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Emitter e{rewriter, op.getLoc()};
    MLIRContext *ctx = rewriter.getContext();
    Value logits = e.castElements(adaptor.getLogits(), f32Of(e));
    Value labels = adaptor.getLabels();
    Value vocab = e.dim(logits, 1);
    Value p = rowSoftmax(e, logits);
    Value count = countedRows(e, labels, vocab);
    AffineExpr n = getAffineDimExpr(0, ctx), v = getAffineDimExpr(1, ctx);
    AffineMap nv = dims(ctx, 2, {n, v}), row = dims(ctx, 2, n),
              scalar = dims(ctx, 2, {});
    Type elt = op.getType().getElementType();
    Value out = e.generic(
        {p, labels, adaptor.getGrad(), count}, e.empty(e.sizes(logits), elt),
        {nv, row, scalar, scalar, nv}, {kPar, kPar},
        [&](OpBuilder &nb, Location nl, ValueRange a) {
          Emitter m{nb, nl};
          auto [ok, l] = labelOf(m, a[1], vocab);
          Value hit = arith::AndIOp::create(
              nb, nl, ok, m.cmpI(arith::CmpIPredicate::eq, l, loopIndex(m, 1)));
          Value t = sub(m, a[0], m.sel(hit, m.f32(1.0), m.f32(0)));
          Value gv = div(m, mul(m, t, a[2]), a[3]);
          return SmallVector<Value>{m.fromF32(m.sel(ok, gv, m.f32(0)), elt)};
        })[0];
    rewriter.replaceOp(op, out);
    return success();
  }
};

//===----------------------------------------------------------------------===//
// Router losses
//===----------------------------------------------------------------------===//

/// What moe.router_loss and its gradient share: the logits in f32, C, the
/// layers' counts summed ([E] f32), and the sizes E and N (all layers'
/// rows) as index values.
struct RouterLossTerms {
  SmallVector<Value> logits;
  Value counts, experts, rows;
};

RouterLossTerms routerLossTerms(Emitter &e, ValueRange rawLogits,
                                ValueRange counts) {
  MLIRContext *ctx = e.b.getContext();
  RouterLossTerms terms;
  for (Value l : rawLogits)
    terms.logits.push_back(e.castElements(l, f32Of(e)));
  ValueRange logits = terms.logits;
  terms.experts = e.dim(logits[0], 1);
  terms.rows = e.dim(logits[0], 0);
  for (Value l : logits.drop_front())
    terms.rows = arith::AddIOp::create(e.b, e.loc, terms.rows, e.dim(l, 0));
  AffineMap id = dims(ctx, 1, getAffineDimExpr(0, ctx));
  SmallVector<AffineMap> maps(counts.size() + 1, id);
  terms.counts = e.generic(
      counts, e.empty(e.sizes(counts[0]), f32Of(e)), maps, {kPar},
      [&](OpBuilder &nb, Location nl, ValueRange a) {
        Emitter m{nb, nl};
        Value sum = m.f32(0);
        for (Value c : a.drop_back())
          sum = add(m, sum, arith::SIToFPOp::create(nb, nl, f32Of(m), c));
        return SmallVector<Value>{sum};
      })[0];
  return terms;
}

/// An index value as f32 (in a loop body).
Value indexToF32(Emitter &m, Value i) {
  Value i64 = arith::IndexCastOp::create(m.b, m.loc, m.b.getI64Type(), i);
  return arith::SIToFPOp::create(m.b, m.loc, f32Of(m), i64);
}

/// logsumexp of a row from its max and sum of exp(x - max).
Value logSumExp(Emitter &m, Value rowMax, Value sumExp) {
  return add(m, rowMax, math::LogOp::create(m.b, m.loc, sumExp));
}

struct RouterLossLowering : OpConversionPattern<RouterLossOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(RouterLossOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Emitter e{rewriter, op.getLoc()};
    MLIRContext *ctx = rewriter.getContext();
    RouterLossTerms terms =
        routerLossTerms(e, adaptor.getLogits(), adaptor.getCounts());
    ArrayRef<Value> logits = terms.logits;
    double auxCoef = op.getAuxCoef().convertToDouble(),
           zCoef = op.getZCoef().convertToDouble();
    AffineExpr d0 = getAffineDimExpr(0, ctx), d1 = getAffineDimExpr(1, ctx);
    AffineMap rowScalar = dims(ctx, 1, {}), r1 = dims(ctx, 1, d0);
    // Per layer, once: the rows' max and sum of exp. P[e], the softmax
    // summed over the layers' rows in row order (loops (e, t): the
    // parallel one outermost); zSum, logsumexp^2 summed over the rows.
    Value probs = e.zeros(e.sizes(terms.counts), f32Of(e));
    Value zSum = e.zeros({}, f32Of(e));
    AffineMap xtIn = dims(ctx, 2, {d1, d0}), xOut = dims(ctx, 2, d0);
    for (Value l : auxCoef != 0 || zCoef != 0 ? logits : ArrayRef<Value>{}) {
      auto [rowMax, sumExp] = rowMaxAndSumExp(e, l);
      if (auxCoef != 0)
        probs = e.generic(rowSoftmaxFrom(e, l, rowMax, sumExp), probs,
                          {xtIn, xOut}, {kPar, kRed},
                          [&](OpBuilder &nb, Location nl, ValueRange a) {
                            Emitter m{nb, nl};
                            return SmallVector<Value>{add(m, a[1], a[0])};
                          })[0];
      if (zCoef != 0)
        zSum = e.generic({rowMax, sumExp}, zSum, {r1, r1, rowScalar}, {kRed},
                         [&](OpBuilder &nb, Location nl, ValueRange a) {
                           Emitter m{nb, nl};
                           Value lse = logSumExp(m, a[0], a[1]);
                           return SmallVector<Value>{
                               add(m, a[2], mul(m, lse, lse))};
                         })[0];
    }
    // sum_e C[e] * P[e].
    Value dot = e.zeros({}, f32Of(e));
    if (auxCoef != 0)
      dot = e.generic({terms.counts, probs}, dot, {r1, r1, rowScalar}, {kRed},
                      [&](OpBuilder &nb, Location nl, ValueRange a) {
                        Emitter m{nb, nl};
                        return SmallVector<Value>{
                            add(m, a[2], mul(m, a[0], a[1]))};
                      })[0];
    // aux_coef * E / N^2 * dot + z_coef / N * zSum, in a one-iteration loop
    // (a 0-d generic would be host code; on the GPU these live on the
    // device).
    Value one =
        e.generic({dot, zSum}, e.empty({rewriter.getIndexAttr(1)}, f32Of(e)),
                  {rowScalar, rowScalar, r1}, {kPar},
                  [&](OpBuilder &nb, Location nl, ValueRange a) {
                    Emitter m{nb, nl};
                    Value n = indexToF32(m, terms.rows);
                    Value experts = indexToF32(m, terms.experts);
                    Value aux =
                        div(m, mul(m, mul(m, m.f32(auxCoef), experts), a[0]),
                            mul(m, n, n));
                    Value z = div(m, mul(m, m.f32(zCoef), a[1]), n);
                    return SmallVector<Value>{add(m, aux, z)};
                  })[0];
    rewriter.replaceOp(op, tensor::CollapseShapeOp::create(
                               rewriter, e.loc, op.getType(), one,
                               SmallVector<ReassociationIndices>{}));
    return success();
  }
};

struct RouterLossGradLowering : OpConversionPattern<RouterLossGradOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(RouterLossGradOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Emitter e{rewriter, op.getLoc()};
    MLIRContext *ctx = rewriter.getContext();
    RouterLossTerms terms =
        routerLossTerms(e, adaptor.getLogits(), adaptor.getCounts());
    ArrayRef<Value> logits = terms.logits;
    double auxCoef = op.getAuxCoef().convertToDouble(),
           zCoef = op.getZCoef().convertToDouble();
    AffineExpr t = getAffineDimExpr(0, ctx), x = getAffineDimExpr(1, ctx);
    AffineMap tx = dims(ctx, 2, {t, x}), col = dims(ctx, 2, x),
              row = dims(ctx, 2, t), scalar = dims(ctx, 2, {});
    SmallVector<Value> results;
    for (auto [l, result] : llvm::zip(logits, op.getResults())) {
      auto [rowMax, sumExp] = rowMaxAndSumExp(e, l);
      Value p = rowSoftmaxFrom(e, l, rowMax, sumExp);
      // s[t] = sum_e C[e] p[t, e]; lse[t] from rowMax and sumExp.
      Value s = e.generic(
          {p, terms.counts}, e.zeros({e.sizes(l)[0]}, f32Of(e)), {tx, col, row},
          {kPar, kRed}, [&](OpBuilder &nb, Location nl, ValueRange a) {
            Emitter m{nb, nl};
            return SmallVector<Value>{add(m, a[2], mul(m, a[0], a[1]))};
          })[0];
      Type elt = cast<RankedTensorType>(result.getType()).getElementType();
      results.push_back(e.generic(
          {p, terms.counts, s, rowMax, sumExp, adaptor.getGrad()},
          e.empty(e.sizes(l), elt), {tx, col, row, row, row, scalar, tx},
          {kPar, kPar}, [&](OpBuilder &nb, Location nl, ValueRange a) {
            Emitter m{nb, nl};
            Value n = indexToF32(m, terms.rows);
            Value experts = indexToF32(m, terms.experts);
            Value aux = div(m, mul(m, m.f32(auxCoef), experts), mul(m, n, n));
            Value term = mul(m, aux, sub(m, a[1], a[2]));
            if (zCoef != 0) {
              Value lse = logSumExp(m, a[3], a[4]);
              term = add(m, term, div(m, mul(m, m.f32(2 * zCoef), lse), n));
            }
            return SmallVector<Value>{
                m.fromF32(mul(m, a[5], mul(m, a[0], term)), elt)};
          })[0]);
    }
    rewriter.replaceOp(op, results);
    return success();
  }
};

//===----------------------------------------------------------------------===//
// Routing gradients
//===----------------------------------------------------------------------===//

struct RouterGradLowering : OpConversionPattern<RouterGradOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(RouterGradOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Emitter e{rewriter, op.getLoc()};
    MLIRContext *ctx = rewriter.getContext();
    Value logits = e.castElements(adaptor.getLogits(), f32Of(e));
    Value idx = adaptor.getIndices(), grad = adaptor.getGrad();
    Value experts = e.dim(logits, 1);
    bool sigmoid = op.getScore() == ScoreFunction::sigmoid;
    bool after = op.getSoftmaxAfterTopk();
    // The router's scores over all experts, then the picked ones [T, k].
    Value scores = routerScores(e, op.getScore(), after, logits);
    AffineExpr t = getAffineDimExpr(0, ctx), j = getAffineDimExpr(1, ctx);
    AffineMap tj = dims(ctx, 2, {t, j}), tRow = dims(ctx, 2, t);
    SmallVector<OpFoldResult> tk = e.sizes(grad);
    Value picked =
        e.generic(idx, e.empty(tk, f32Of(e)), {tj, tj}, {kPar, kPar},
                  [&](OpBuilder &nb, Location nl, ValueRange a) {
                    Emitter m{nb, nl};
                    Value ex = m.toIndex(a[0]);
                    Value ok = inRange(m, ex, experts);
                    Value v = m.extract(
                        scores, {loopIndex(m, 0), m.sel(ok, ex, m.idx(0))});
                    return SmallVector<Value>{m.sel(ok, v, m.f32(0))};
                  })[0];
    SmallVector<OpFoldResult> rows = {tk[0]};
    // sum_k grad_k w_k per token.
    auto gradDotWeights = [&](Value w) {
      return e.generic(
          {grad, w}, e.zeros(rows, f32Of(e)), {tj, tj, tRow}, {kPar, kRed},
          [&](OpBuilder &nb, Location nl, ValueRange a) {
            Emitter m{nb, nl};
            return SmallVector<Value>{add(m, a[2], mul(m, a[0], a[1]))};
          })[0];
    };
    // g: the gradient of the picked values (the picked scores, or for
    // softmax after top-k the picked logits).
    Value g = grad;
    if (after) {
      Value w = rowSoftmax(e, picked);
      Value dot = gradDotWeights(w);
      g = e.generic(
          {w, grad, dot}, e.empty(tk, f32Of(e)), {tj, tj, tRow, tj},
          {kPar, kPar}, [&](OpBuilder &nb, Location nl, ValueRange a) {
            Emitter m{nb, nl};
            return SmallVector<Value>{mul(m, a[0], sub(m, a[1], a[2]))};
          })[0];
    } else if (op.getNormTopkProb()) {
      Value sum =
          e.generic(picked, e.zeros(rows, f32Of(e)), {tj, tRow}, {kPar, kRed},
                    [&](OpBuilder &nb, Location nl, ValueRange a) {
                      Emitter m{nb, nl};
                      return SmallVector<Value>{add(m, a[1], a[0])};
                    })[0];
      Value w = rowNormalize(e, picked);
      Value dot = gradDotWeights(w);
      g = e.generic(
          {grad, dot, sum}, e.empty(tk, f32Of(e)), {tj, tRow, tRow, tj},
          {kPar, kPar}, [&](OpBuilder &nb, Location nl, ValueRange a) {
            Emitter m{nb, nl};
            return SmallVector<Value>{div(m, sub(m, a[0], a[1]), a[2])};
          })[0];
    }
    // G[t, e]: g scattered to the selected experts (loops (t, e, j)).
    AffineExpr t3 = getAffineDimExpr(0, ctx), e3 = getAffineDimExpr(1, ctx),
               j3 = getAffineDimExpr(2, ctx);
    AffineMap te = dims(ctx, 2, {t, j}); // (t, e) of a 2-loop space
    Value scattered = e.generic(
        {idx, g}, e.zeros(e.sizes(logits), f32Of(e)),
        {dims(ctx, 3, {t3, j3}), dims(ctx, 3, {t3, j3}),
         dims(ctx, 3, {t3, e3})},
        {kPar, kPar, kRed}, [&](OpBuilder &nb, Location nl, ValueRange a) {
          Emitter m{nb, nl};
          Value hit = m.cmpI(arith::CmpIPredicate::eq, m.toIndex(a[0]),
                             loopIndex(m, 1));
          return SmallVector<Value>{m.sel(hit, add(m, a[2], a[1]), a[2])};
        })[0];
    Type elt = op.getType().getElementType();
    Value out;
    if (after) {
      out = scattered;
    } else if (sigmoid) {
      out = e.map({scattered, scores}, f32Of(e), [&](Emitter &m, ValueRange a) {
        return mul(m, a[0], mul(m, a[1], sub(m, m.f32(1.0), a[1])));
      });
    } else {
      // d_logits = p * (G - <G, p>).
      Value dot = e.generic(
          {scattered, scores}, e.zeros(rows, f32Of(e)), {te, te, tRow},
          {kPar, kRed}, [&](OpBuilder &nb, Location nl, ValueRange a) {
            Emitter m{nb, nl};
            return SmallVector<Value>{add(m, a[2], mul(m, a[0], a[1]))};
          })[0];
      out = e.generic(
          {scattered, scores, dot}, e.empty(e.sizes(logits), f32Of(e)),
          {te, te, tRow, te}, {kPar, kPar},
          [&](OpBuilder &nb, Location nl, ValueRange a) {
            Emitter m{nb, nl};
            return SmallVector<Value>{mul(m, a[1], sub(m, a[0], a[2]))};
          })[0];
    }
    rewriter.replaceOp(op, e.castElements(out, elt));
    return success();
  }
};

struct CombineGradLowering : OpConversionPattern<CombineGradOp> {
  using OpConversionPattern::OpConversionPattern;
  /// Interleaved partial sums per dot product (a warp's width).
  static constexpr int64_t kLanes = 32;
  LogicalResult
  matchAndRewrite(CombineGradOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Emitter e{rewriter, op.getLoc()};
    MLIRContext *ctx = rewriter.getContext();
    Value y = adaptor.getExpertOut(), pos = adaptor.getPositions(),
          grad = adaptor.getGrad();
    Value rows = e.dim(y, 0);
    auto gradType = cast<RankedTensorType>(grad.getType());
    int64_t hidden = gradType.getDimSize(1);
    if (!ShapedType::isDynamic(hidden) && hidden % kLanes == 0) {
      // Each dot product as kLanes interleaved partial sums, then their sum
      // in order: partial[t, j, l] sums h = l, l + kLanes, ... On a GPU
      // consecutive threads take consecutive l, so the gathered rows are
      // read in whole lines (one thread per dot product would read one
      // float per line of each row).
      AffineExpr t = getAffineDimExpr(0, ctx), j = getAffineDimExpr(1, ctx),
                 l = getAffineDimExpr(2, ctx), b = getAffineDimExpr(3, ctx);
      SmallVector<OpFoldResult> partialSizes = e.sizes(pos);
      partialSizes.push_back(rewriter.getIndexAttr(kLanes));
      // grad [T, H] as [T, H / kLanes, kLanes].
      SmallVector<OpFoldResult> gradSizes = e.sizes(grad);
      Value lanes = tensor::ExpandShapeOp::create(
          rewriter, e.loc,
          RankedTensorType::get(
              {gradType.getDimSize(0), hidden / kLanes, kLanes},
              gradType.getElementType()),
          grad, SmallVector<ReassociationIndices>{{0}, {1, 2}},
          SmallVector<OpFoldResult>{gradSizes[0],
                                    rewriter.getIndexAttr(hidden / kLanes),
                                    rewriter.getIndexAttr(kLanes)});
      Value partial = e.generic(
          {pos, lanes}, e.zeros(partialSizes, f32Of(e)),
          {AffineMap::get(4, 0, {t, j}, ctx),
           AffineMap::get(4, 0, {t, b, l}, ctx),
           AffineMap::get(4, 0, {t, j, l}, ctx)},
          {kPar, kPar, kPar, kRed},
          [&](OpBuilder &nb, Location nl, ValueRange a) {
            Emitter m{nb, nl};
            Value p = m.toIndex(a[0]);
            Value ok = inRange(m, p, rows);
            Value hIdx = arith::AddIOp::create(
                nb, nl,
                arith::MulIOp::create(nb, nl, loopIndex(m, 3), m.idx(kLanes)),
                loopIndex(m, 2));
            Value v = m.toF32(m.extract(y, {m.sel(ok, p, m.idx(0)), hIdx}));
            // Dropped copies add 0.
            Value term = m.sel(ok, mul(m, m.toF32(a[1]), v), m.f32(0.0));
            return SmallVector<Value>{add(m, a[2], term)};
          })[0];
      AffineExpr t3 = getAffineDimExpr(0, ctx), j3 = getAffineDimExpr(1, ctx),
                 l3 = getAffineDimExpr(2, ctx);
      Value out = e.generic({partial}, e.zeros(e.sizes(pos), f32Of(e)),
                            {AffineMap::get(3, 0, {t3, j3, l3}, ctx),
                             AffineMap::get(3, 0, {t3, j3}, ctx)},
                            {kPar, kPar, kRed},
                            [&](OpBuilder &nb, Location nl, ValueRange a) {
                              Emitter m{nb, nl};
                              return SmallVector<Value>{add(m, a[1], a[0])};
                            })[0];
      rewriter.replaceOp(op, out);
      return success();
    }
    AffineExpr t = getAffineDimExpr(0, ctx), j = getAffineDimExpr(1, ctx),
               h = getAffineDimExpr(2, ctx);
    Value out = e.generic(
        {pos, grad}, e.zeros(e.sizes(pos), f32Of(e)),
        {dims(ctx, 3, {t, j}), dims(ctx, 3, {t, h}), dims(ctx, 3, {t, j})},
        {kPar, kPar, kRed}, [&](OpBuilder &nb, Location nl, ValueRange a) {
          Emitter m{nb, nl};
          Value p = m.toIndex(a[0]);
          Value ok = inRange(m, p, rows);
          Value v =
              m.toF32(m.extract(y, {m.sel(ok, p, m.idx(0)), loopIndex(m, 2)}));
          Value s = add(m, a[2], mul(m, m.toF32(a[1]), v));
          return SmallVector<Value>{m.sel(ok, s, a[2])};
        })[0];
    rewriter.replaceOp(op, out);
    return success();
  }
};

} // namespace

void mlir::moe::detail::populateModelOpLoweringPatterns(
    const TypeConverter &converter, RewritePatternSet &patterns) {
  patterns.add<EmbeddingLowering, EmbeddingGradLowering, RMSNormLowering,
               RMSNormGradLowering, RotaryLowering, AttentionLowering,
               AttentionGradLowering, CrossEntropyLowering,
               CrossEntropyGradLowering, RouterLossLowering,
               RouterLossGradLowering, RouterGradLowering, CombineGradLowering>(
      converter, patterns.getContext());
}
