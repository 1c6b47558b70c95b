//===- ParallelLowering.cpp - moe ops as data-parallel linalg -------------===//
//
// The reference lowering writes router, dispatch and the grouped GEMMs as
// loops over tokens or experts on the host, which is simplest to read but
// cannot run where the data lives on a device. These patterns give the same
// results (bit for bit) as data-parallel `linalg.generic`s: every output
// element is computed independently, loops appear only inside generic bodies.
// Mapped to GPU threads, each generic becomes a kernel; a faster kernel (TMA,
// wgmma) replaces one of them without touching the rest.
//
//===----------------------------------------------------------------------===//

#include "Emitter.h"

#include "moe/Conversion/MoEToLinalg/MoEToLinalg.h"
#include "moe/Dialect/MoE/IR/MoEOps.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::detail;
using utils::IteratorType;
using P = arith::CmpIPredicate;

namespace {

/// Clamped group bounds [lo, hi) of expert `e`, as the reference computes
/// them (so malformed offsets give the same result on every path).
std::pair<Value, Value> clampedBounds(Emitter &n, Value offsets, Value e,
                                      Value rows) {
  auto [lo, size] = n.groupBounds(offsets, e, rows);
  return {lo, n.addI(lo, size)};
}

/// group[r] = the expert whose clamped range holds row r (the last one, as
/// the reference's later experts overwrite earlier ones), or E for none.
Value groupOfRows(Emitter &e, Value offsets, int64_t numExperts, Value rows,
                  OpFoldResult rowSize) {
  MLIRContext *ctx = e.b.getContext();
  Value init = e.empty({rowSize}, e.b.getIndexType());
  auto id = AffineMap::getMultiDimIdentityMap(1, ctx);
  return e.generic(ValueRange{}, init, {id}, {IteratorType::parallel},
                   [&](OpBuilder &nb, Location nl, ValueRange) {
                     Emitter n{nb, nl};
                     Value r = linalg::IndexOp::create(nb, nl, 0);
                     Value found = n.forLoop(
                         n.idx(0), n.idx(numExperts), n.idx(numExperts),
                         [&](Emitter &m, Value ex, ValueRange cur) {
                           auto [lo, hi] = clampedBounds(m, offsets, ex, rows);
                           Value in = arith::AndIOp::create(
                               m.b, m.loc, m.cmpI(P::sge, r, lo),
                               m.cmpI(P::slt, r, hi));
                           return SmallVector<Value>{m.sel(in, ex, cur[0])};
                         })[0];
                     return SmallVector<Value>{found};
                   })[0];
}

/// out[r, n] = sum_k lhs[r, k] * rhs[group(r), k, n] in f32 (k ascending,
/// from +0), +0 for rows in no group: the reference's per-expert matmul, row
/// by row.
struct ParallelGroupedMatmul : OpConversionPattern<GroupedMatmulOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(GroupedMatmulOp op, OneToNOpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Emitter e{rewriter, op.getLoc()};
    MLIRContext *ctx = rewriter.getContext();
    Value a = gemmOperand(e, op.getLhs().getType(), adaptor.getLhs());
    Value w = gemmOperand(e, op.getRhs().getType(), adaptor.getRhs());
    Value offsets = adaptor.getOffsets()[0];
    bool transpose = op.getTransposeRhs();
    int64_t numExperts =
        cast<RankedTensorType>(offsets.getType()).getDimSize(0) - 1;
    Type f32 = rewriter.getF32Type();
    SmallVector<OpFoldResult> outSizes = {e.sizes(a)[0],
                                          e.sizes(w)[transpose ? 1 : 2]};
    Value group = groupOfRows(e, offsets, numExperts, e.dim(a, 0), outSizes[0]);
    Value kSize = e.dim(a, 1);
    AffineExpr r, n;
    bindDims(ctx, r, n);
    // One output element per point; its K loop runs only for rows in a group
    // (rows past the groups, e.g. the unused part of a worst-case receive
    // buffer, cost nothing and stay +0).
    Value out = e.generic(
        group, e.empty(outSizes, f32),
        {AffineMap::get(2, 0, {r}, ctx), AffineMap::get(2, 0, {r, n}, ctx)},
        {IteratorType::parallel, IteratorType::parallel},
        [&](OpBuilder &nb, Location nl, ValueRange args) {
          Emitter q{nb, nl};
          Value valid = q.cmpI(P::slt, args[0], q.idx(numExperts));
          Value g = q.sel(valid, args[0], q.idx(0));
          Value ri = linalg::IndexOp::create(nb, nl, 0);
          Value ni = linalg::IndexOp::create(nb, nl, 1);
          Value kEnd = q.sel(valid, kSize, q.idx(0));
          Value acc = q.forLoop(
              q.idx(0), kEnd, q.f32(0.0),
              [&](Emitter &m, Value ki, ValueRange it) {
                Value av = m.extract(a, {ri, ki});
                Value bv = m.extract(w, transpose ? ValueRange{g, ni, ki}
                                                  : ValueRange{g, ki, ni});
                Value p =
                    arith::MulFOp::create(m.b, m.loc, m.toF32(av), m.toF32(bv));
                return SmallVector<Value>{
                    arith::AddFOp::create(m.b, m.loc, it[0], p)};
              })[0];
          return SmallVector<Value>{acc};
        })[0];
    rewriter.replaceOp(op, e.castElements(out, op.getType().getElementType()));
    return success();
  }
};

/// out[e, k, n] = sum over the rows r of group e (ascending) of
/// lhs[r, k] * rhs[r, n], in f32.
struct ParallelGroupedMatmulWgrad : OpConversionPattern<GroupedMatmulWgradOp> {
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
    Type f32 = rewriter.getF32Type();
    Value rows = e.dim(a, 0);
    SmallVector<OpFoldResult> outSizes = {
        rewriter.getIndexAttr(resultType.getDimSize(0)), e.sizes(a)[1],
        e.sizes(g)[1]};
    auto id = AffineMap::getMultiDimIdentityMap(3, ctx);
    Value out = e.generic(
        ValueRange{}, e.empty(outSizes, f32), {id},
        SmallVector<IteratorType>(3, IteratorType::parallel),
        [&](OpBuilder &nb, Location nl, ValueRange) {
          Emitter q{nb, nl};
          Value ex = linalg::IndexOp::create(nb, nl, 0);
          Value ki = linalg::IndexOp::create(nb, nl, 1);
          Value ni = linalg::IndexOp::create(nb, nl, 2);
          auto [lo, hi] = clampedBounds(q, offsets, ex, rows);
          Value acc = q.forLoop(
              lo, hi, q.f32(0.0), [&](Emitter &m, Value r, ValueRange it) {
                Value p = arith::MulFOp::create(m.b, m.loc,
                                                m.toF32(m.extract(a, {r, ki})),
                                                m.toF32(m.extract(g, {r, ni})));
                return SmallVector<Value>{
                    arith::AddFOp::create(m.b, m.loc, it[0], p)};
              })[0];
          return SmallVector<Value>{acc};
        })[0];
    rewriter.replaceOp(op, e.castElements(out, resultType.getElementType()));
    return success();
  }
};

/// Whether score (va, ea) ranks before (vb, eb): higher first, a NaN after
/// every number, ties to the lower expert index.
Value ranksBefore(Emitter &n, Value va, Value ea, Value vb, Value eb) {
  auto cmpf = [&](arith::CmpFPredicate p, Value x, Value y) {
    return arith::CmpFOp::create(n.b, n.loc, p, x, y).getResult();
  };
  auto andI = [&](Value x, Value y) {
    return arith::AndIOp::create(n.b, n.loc, x, y).getResult();
  };
  auto orI = [&](Value x, Value y) {
    return arith::OrIOp::create(n.b, n.loc, x, y).getResult();
  };
  Value aNaN = cmpf(arith::CmpFPredicate::UNO, va, va);
  Value bNaN = cmpf(arith::CmpFPredicate::UNO, vb, vb);
  Value lower = n.cmpI(P::slt, ea, eb);
  // Both numbers: greater, or equal with the lower index.
  Value numbers = orI(cmpf(arith::CmpFPredicate::OGT, va, vb),
                      andI(cmpf(arith::CmpFPredicate::OEQ, va, vb), lower));
  Value notANaN = arith::XOrIOp::create(
      n.b, n.loc, aNaN, arith::ConstantIntOp::create(n.b, n.loc, 1, 1));
  // a number before a NaN; two NaNs by index.
  return n.sel(aNaN, andI(bNaN, lower), n.sel(bNaN, notANaN, numbers));
}

/// Slot j of token t holds the j-th expert in the ranking: found by j + 1
/// passes, each picking the best expert ranked after the previous pick.
struct ParallelRouter : OpConversionPattern<RouterOp> {
  using OpConversionPattern::OpConversionPattern;
  LogicalResult
  matchAndRewrite(RouterOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Emitter e{rewriter, op.getLoc()};
    MLIRContext *ctx = rewriter.getContext();
    Type f32 = rewriter.getF32Type();
    Value logits = e.castElements(adaptor.getLogits(), f32);
    int64_t numExperts = cast<RankedTensorType>(logits.getType()).getDimSize(1);
    int64_t k = op.getTopK();
    Value scores =
        routerScores(e, op.getScore(), op.getSoftmaxAfterTopk(), logits);
    // Ranked by score (+ the selection bias); weighted by score.
    Value ranking = routerRanking(e, scores, adaptor.getBias());
    Type idxElt = op.getIndices().getType().getElementType();
    SmallVector<OpFoldResult> tk = {e.sizes(logits)[0],
                                    rewriter.getIndexAttr(k)};
    auto id = AffineMap::getMultiDimIdentityMap(2, ctx);
    ValueRange picked = e.generic(
        ValueRange{}, {e.empty(tk, idxElt), e.empty(tk, f32)}, {id, id},
        {IteratorType::parallel, IteratorType::parallel},
        [&](OpBuilder &nb, Location nl, ValueRange) {
          Emitter n{nb, nl};
          Value t = linalg::IndexOp::create(nb, nl, 0);
          Value j = linalg::IndexOp::create(nb, nl, 1);
          float nan = std::numeric_limits<float>::quiet_NaN();
          // prev = (-1, NaN): nothing picked yet.
          ValueRange last = n.forLoop(
              n.idx(0), n.addI(j, n.idx(1)), {n.idx(-1), n.f32(nan)},
              [&](Emitter &m, Value, ValueRange prev) {
                Value first = m.cmpI(P::slt, prev[0], m.idx(0));
                return llvm::to_vector(m.forLoop(
                    m.idx(0), m.idx(numExperts), {m.idx(-1), m.f32(nan)},
                    [&](Emitter &q, Value ex, ValueRange best) {
                      Value v = q.extract(ranking, {t, ex});
                      Value after = arith::OrIOp::create(
                          q.b, q.loc, first,
                          ranksBefore(q, prev[1], prev[0], v, ex));
                      Value none = q.cmpI(P::slt, best[0], q.idx(0));
                      Value beats = arith::OrIOp::create(
                          q.b, q.loc, none,
                          ranksBefore(q, v, ex, best[1], best[0]));
                      Value take =
                          arith::AndIOp::create(q.b, q.loc, after, beats);
                      return SmallVector<Value>{q.sel(take, ex, best[0]),
                                                q.sel(take, v, best[1])};
                    }));
              });
          return SmallVector<Value>{n.fromIndex(last[0], idxElt), last[1]};
        });
    Value values =
        adaptor.getBias() ? gatherPicked(e, scores, picked[0]) : picked[1];
    rewriter.replaceOp(op, {picked[0], routerWeights(e, op, values)});
    return success();
  }
};

/// Dispatch in blocks of copies: per-block expert counts, their prefix sums,
/// then every copy's rank inside its expert, and every row's source token.
struct ParallelDispatch : OpConversionPattern<DispatchOp> {
  ParallelDispatch(const TypeConverter &converter, MLIRContext *ctx,
                   const LiveRowBounds *live)
      : OpConversionPattern(converter, ctx, /*benefit=*/2), live(live) {}
  const LiveRowBounds *live;
  static constexpr int64_t kBlock = 256;

  LogicalResult
  matchAndRewrite(DispatchOp op, OneToNOpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Emitter e{rewriter, op.getLoc()};
    MLIRContext *ctx = rewriter.getContext();
    // The rows: one tensor, or an MX tensor's data and scales (moved alike).
    ValueRange tokens = adaptor.getTokens();
    Value indices = adaptor.getIndices()[0];
    auto idxType = op.getIndices().getType();
    int64_t numTok = idxType.getDimSize(0), k = idxType.getDimSize(1);
    int64_t copies = numTok * k, numExperts = op.getNumExperts();
    int64_t padTo = op.getPadTo(), capacity = op.getCapacity();
    int64_t nb = std::max<int64_t>(1, (copies + kBlock - 1) / kBlock);
    Type countElt = op.getCounts().getType().getElementType();
    Type offElt = op.getOffsets().getType().getElementType();
    Type posElt = op.getPositions().getType().getElementType();
    SmallVector<RankedTensorType> sortedTypes =
        loweredTypes(op.getSorted().getType());
    Type idxT = rewriter.getIndexType();
    auto par = [](int n) {
      return SmallVector<IteratorType>(n, IteratorType::parallel);
    };
    auto id = [&](int n) { return AffineMap::getMultiDimIdentityMap(n, ctx); };

    /// Expert of copy c, or -1 when its index is out of range.
    auto expertOf = [&](Emitter &n, Value c) {
      Value t = arith::DivUIOp::create(n.b, n.loc, c, n.idx(k));
      Value j = arith::RemUIOp::create(n.b, n.loc, c, n.idx(k));
      Value ex = n.extractIndex(indices, {t, j});
      Value ok = arith::AndIOp::create(n.b, n.loc, n.cmpI(P::sge, ex, n.idx(0)),
                                       n.cmpI(P::slt, ex, n.idx(numExperts)));
      return n.sel(ok, ex, n.idx(-1));
    };
    /// The number of copies c in [from, to) with expert ex.
    auto countIn = [&](Emitter &n, Value from, Value to, Value ex) {
      return n.forLoop(
          from, to, n.idx(0), [&](Emitter &m, Value c, ValueRange s) {
            Value hit = m.cmpI(P::eq, expertOf(m, c), ex);
            return SmallVector<Value>{m.sel(hit, m.addI(s[0], m.idx(1)), s[0])};
          })[0];
    };
    auto blockEnd = [&](Emitter &n, Value b) {
      return n.minI(n.addI(arith::MulIOp::create(n.b, n.loc, b, n.idx(kBlock)),
                           n.idx(kBlock)),
                    n.idx(copies));
    };
    OpFoldResult nbSize = rewriter.getIndexAttr(nb),
                 eSize = rewriter.getIndexAttr(numExperts);

    // 1. counts per (block, expert).
    Value blockCounts = e.generic(
        ValueRange{}, e.empty({nbSize, eSize}, idxT), {id(2)}, par(2),
        [&](OpBuilder &b, Location l, ValueRange) {
          Emitter n{b, l};
          Value blk = linalg::IndexOp::create(b, l, 0);
          Value ex = linalg::IndexOp::create(b, l, 1);
          Value from = arith::MulIOp::create(b, l, blk, n.idx(kBlock));
          return SmallVector<Value>{countIn(n, from, blockEnd(n, blk), ex)};
        })[0];
    // 2. copies of each expert in earlier blocks.
    Value blockStart = e.generic(
        ValueRange{}, e.empty({nbSize, eSize}, idxT), {id(2)}, par(2),
        [&](OpBuilder &b, Location l, ValueRange) {
          Emitter n{b, l};
          Value blk = linalg::IndexOp::create(b, l, 0);
          Value ex = linalg::IndexOp::create(b, l, 1);
          return SmallVector<Value>{n.forLoop(
              n.idx(0), blk, n.idx(0), [&](Emitter &m, Value bb, ValueRange s) {
                return SmallVector<Value>{
                    m.addI(s[0], m.extract(blockCounts, {bb, ex}))};
              })[0]};
        })[0];
    // 3. kept copies per expert (capacity applied).
    auto keptOf = [&](Emitter &n, Value ex) {
      Value total = n.addI(n.extract(blockStart, {n.idx(nb - 1), ex}),
                           n.extract(blockCounts, {n.idx(nb - 1), ex}));
      return capacity >= 0 ? n.minI(total, n.idx(capacity)) : total;
    };
    auto padded = [&](Emitter &n, Value x) { return n.roundUp(x, padTo); };
    Value counts = e.generic(ValueRange{}, e.empty({eSize}, countElt), {id(1)},
                             par(1), [&](OpBuilder &b, Location l, ValueRange) {
                               Emitter n{b, l};
                               Value ex = linalg::IndexOp::create(b, l, 0);
                               return SmallVector<Value>{
                                   n.fromIndex(keptOf(n, ex), countElt)};
                             })[0];
    /// offsets[e] = sum of padded kept counts of experts before e.
    auto offsetOf = [&](Emitter &n, Value ex) {
      return n.forLoop(
          n.idx(0), ex, n.idx(0), [&](Emitter &m, Value x, ValueRange s) {
            return SmallVector<Value>{m.addI(s[0], padded(m, keptOf(m, x)))};
          })[0];
    };
    Value offsets = e.generic(
        ValueRange{}, e.empty({rewriter.getIndexAttr(numExperts + 1)}, offElt),
        {id(1)}, par(1), [&](OpBuilder &b, Location l, ValueRange) {
          Emitter n{b, l};
          return SmallVector<Value>{n.fromIndex(
              offsetOf(n, linalg::IndexOp::create(b, l, 0)), offElt)};
        })[0];
    // 4. positions: rank of the copy among its expert's copies.
    Value positions = e.generic(
        ValueRange{},
        e.empty({rewriter.getIndexAttr(numTok), rewriter.getIndexAttr(k)},
                posElt),
        {id(2)}, par(2), [&](OpBuilder &b, Location l, ValueRange) {
          Emitter n{b, l};
          Value t = linalg::IndexOp::create(b, l, 0);
          Value j = linalg::IndexOp::create(b, l, 1);
          Value c = n.addI(arith::MulIOp::create(b, l, t, n.idx(k)), j);
          Value ex = expertOf(n, c);
          Value ok = n.cmpI(P::sge, ex, n.idx(0));
          Value exs = n.sel(ok, ex, n.idx(0));
          Value blk = arith::DivUIOp::create(b, l, c, n.idx(kBlock));
          Value from = arith::MulIOp::create(b, l, blk, n.idx(kBlock));
          Value rank = n.addI(n.extract(blockStart, {blk, exs}),
                              countIn(n, from, c, exs));
          Value keep = arith::AndIOp::create(
              b, l, ok, n.cmpI(P::slt, rank, keptOf(n, exs)));
          Value row = n.addI(offsetOf(n, exs), rank);
          return SmallVector<Value>{
              n.fromIndex(n.sel(keep, row, n.idx(-1)), posElt)};
        })[0];
    // 5. the source token of every row of `sorted` (-1 for padding); only
    // for the rows before offsets[E] when nothing reads the others.
    int64_t rows = sortedTypes[0].getDimSize(0);
    OpFoldResult rowCount = rewriter.getIndexAttr(rows);
    if (live && live->contains(op) && !ShapedType::isDynamic(rows)) {
      e.bindLiveRows(e.extractIndex(offsets, e.idx(numExperts)), rows);
      rowCount = e.liveCount;
    }
    Value source = e.generic(
        ValueRange{}, e.empty({rowCount}, idxT), {id(1)}, par(1),
        [&](OpBuilder &b, Location l, ValueRange) {
          Emitter n{b, l};
          Value r = linalg::IndexOp::create(b, l, 0);
          // The expert whose kept rows hold r, and r's rank there.
          ValueRange owner = n.forLoop(
              n.idx(0), n.idx(numExperts), {n.idx(-1), n.idx(0), n.idx(0)},
              [&](Emitter &m, Value ex, ValueRange s) {
                Value start = s[2];
                Value kept = keptOf(m, ex);
                Value in = arith::AndIOp::create(
                    m.b, m.loc, m.cmpI(P::sge, r, start),
                    m.cmpI(P::slt, r, m.addI(start, kept)));
                return SmallVector<Value>{m.sel(in, ex, s[0]),
                                          m.sel(in, m.subI(r, start), s[1]),
                                          m.addI(start, padded(m, kept))};
              });
          Value ex = owner[0], rank = owner[1];
          Value exs = n.maxI(ex, n.idx(0));
          // The block holding the rank-th copy, then the copy itself.
          Value blk =
              n.forLoop(n.idx(0), n.idx(nb), n.idx(0),
                        [&](Emitter &m, Value bb, ValueRange s) {
                          Value reached = m.cmpI(
                              P::sle, m.extract(blockStart, {bb, exs}), rank);
                          return SmallVector<Value>{m.sel(reached, bb, s[0])};
                        })[0];
          Value from = arith::MulIOp::create(b, l, blk, n.idx(kBlock));
          Value need = n.subI(rank, n.extract(blockStart, {blk, exs}));
          ValueRange found =
              n.forLoop(from, blockEnd(n, blk), {n.idx(0), n.idx(-1)},
                        [&](Emitter &m, Value c, ValueRange s) {
                          Value hit = m.cmpI(P::eq, expertOf(m, c), exs);
                          Value isIt = arith::AndIOp::create(
                              m.b, m.loc, hit, m.cmpI(P::eq, s[0], need));
                          return SmallVector<Value>{
                              m.sel(hit, m.addI(s[0], m.idx(1)), s[0]),
                              m.sel(isIt, c, s[1])};
                        });
          Value copy = found[1];
          Value token = arith::DivSIOp::create(b, l, copy, n.idx(k));
          Value valid =
              arith::AndIOp::create(b, l, n.cmpI(P::sge, ex, n.idx(0)),
                                    n.cmpI(P::sge, copy, n.idx(0)));
          return SmallVector<Value>{n.sel(valid, token, n.idx(-1))};
        })[0];
    // 6. gather the rows (of each part).
    SmallVector<Value> sorted;
    for (auto [part, type] : llvm::zip(tokens, sortedTypes))
      sorted.push_back(e.fullRows(e.gatherRows(part, source, rowCount), type));
    rewriter.replaceOpWithMultiple(op,
                                   {ValueRange(sorted), ValueRange(offsets),
                                    ValueRange(counts), ValueRange(positions)});
    return success();
  }
};

} // namespace

void mlir::moe::populateMoEToParallelLinalgPatterns(
    const TypeConverter &converter, RewritePatternSet &patterns,
    const LiveRowBounds *live) {
  patterns
      .add<ParallelGroupedMatmul, ParallelGroupedMatmulWgrad, ParallelRouter>(
          converter, patterns.getContext(),
          /*benefit=*/2);
  patterns.add<ParallelDispatch>(converter, patterns.getContext(), live);
}
