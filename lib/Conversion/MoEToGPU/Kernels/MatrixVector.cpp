//===- MatrixVector.cpp - grouped matrix-vector products ------------------===//
//
// Grouped matrix-vector products on CUDA cores
// --------------------------------------------
// moe.grouped_matmul with N under 16 columns and K of at least 16 (a sum
// over the hidden dim, a projection to a few outputs, a dot product of two
// long vectors): out[r, n] = sum_k lhs[r, k] * rhs[g(r), k, n] (or
// rhs[g(r), n, k] transposed), f32 or bf16 operands, an f32 result. Too few
// columns for a tensor-core tile; on the generic kernels each output is one
// thread's K-long loop, and the threads of a warp read rows K apart (16384 x
// 2880 bf16 ran at 0.8 TB/s; a dot product of 16384 terms, one thread,
// took 0.4 ms).
//
// Work: a warp a row when there are at least MinWarpRows rows, else a CTA of
// 256 threads a row; rows strided over at most MaxCtas CTAs. The row's
// threads walk K in chunks of W consecutive values (16-byte loads: W = 8
// bf16 or 4 f32; W = 1 when K is not a multiple of W, or where a buffer is
// not 16-byte aligned), thread t taking chunks t, t + T, ... (a warp's loads
// of one step are 512 contiguous bytes, bf16); the rhs's W values of column
// n are one vector load where they are consecutive (transposed, or N = 1:
// 8 to 32 bytes by the rhs's type, assumed aligned to at most 16), else W
// loads (rhs is small and stays in cache). Each thread keeps N f32 sums;
// the warp adds them with xor shuffles, and a CTA row's 8 warps through
// shared memory (warp order). The row's group g(r) is the last expert whose
// clamped rows [lo, hi) hold r, as the reference computes it (the lanes
// test 32 experts at a time, the warp takes the largest that matches); a
// row in no group is +0.
//
// Numerics: products in f32 (exact for bf16 operands), summed per thread in
// k order, then across threads: the generic lowering's single k-ascending
// chain in another order (f32 rounding).
//
//===----------------------------------------------------------------------===//

#include "KernelBuilder.h"
#include "Kernels.h"

using namespace mlir;
using namespace mlir::moe;

namespace mlir::moe::kernels {

namespace matvec {
constexpr int64_t Threads = 256, Warps = Threads / 32;
constexpr int64_t MinWarpRows = 1024;
constexpr int64_t MaxCtas = 2048;
constexpr int64_t VectorBytes = 16;
} // namespace matvec

using namespace matvec;

namespace {

struct MatrixVector {
  int64_t rows, k, n, experts;
  Type lhsElt, rhsElt, offsetElt;
  bool transposed;

  bool warpPerRow() const { return rows >= MinWarpRows; }
  /// Threads a row.
  int64_t rowThreads() const { return warpPerRow() ? 32 : Threads; }
  /// Values a chunk: one 16-byte load of the lhs, when K allows.
  int64_t width() const {
    int64_t w = VectorBytes / (lhsElt.getIntOrFloatBitWidth() / 8);
    return k % w == 0 ? w : 1;
  }
  /// Whether a chunk's rhs values of one column are consecutive.
  bool rhsAlongK() const { return transposed || n == 1; }
  std::string name() const {
    return llvm::formatv("moe_matvec_{0}x{1}x{2}_e{3}_{4}_{5}{6}_{7}", rows, k,
                         n, experts, elementName(lhsElt), elementName(rhsElt),
                         transposed ? "_rhsT" : "", elementName(offsetElt))
        .str();
  }
};

bool isMatvecFloat(Type t) { return t.isF32() || t.isBF16(); }

} // namespace

bool isMatrixVectorGemm(GroupedMatmulOp op) {
  auto lhs = dyn_cast<ShapedType>(op.getLhs().getType());
  auto rhs = dyn_cast<ShapedType>(op.getRhs().getType());
  if (!lhs || !rhs || !lhs.hasRank() || !rhs.hasRank())
    return false;
  int64_t k = lhs.getDimSize(1),
          n = rhs.getDimSize(op.getTransposeRhs() ? 1 : 2);
  return !ShapedType::isDynamic(k) && !ShapedType::isDynamic(n) && k >= 16 &&
         isMatrixVector(k, n);
}

namespace {

std::optional<MatrixVector> matchMatrixVector(GroupedMatmulOp op, WhyNot why) {
  auto lhs = dyn_cast<RankedTensorType>(op.getLhs().getType());
  auto rhs = dyn_cast<RankedTensorType>(op.getRhs().getType());
  auto offsets = dyn_cast<RankedTensorType>(op.getOffsets().getType());
  RankedTensorType out = op.getType();
  // Only matrix-vector products (N under 16, K of 16 or more, float
  // tensors) are this family's.
  if (!lhs || !rhs || !offsets || !isMatrixVectorGemm(op))
    return std::nullopt;
  if (!lhs.hasStaticShape() || !rhs.hasStaticShape() ||
      !offsets.hasStaticShape() || !out.hasStaticShape())
    return noKernel(why, "a dynamic shape (the kernels are generated for "
                         "static shapes)");
  bool transposed = op.getTransposeRhs();
  int64_t k = lhs.getDimSize(1), n = rhs.getDimSize(transposed ? 1 : 2);
  if (op->getParentOfType<ExpertsOp>())
    return noKernel(why, "inside a moe.experts region (not grouped)");
  if (!isMatvecFloat(lhs.getElementType()) ||
      !isMatvecFloat(rhs.getElementType()))
    return noKernel(why,
                    "a {0} lhs and {1} rhs (the matrix-vector kernel takes f32 "
                    "or bf16)",
                    lhs.getElementType(), rhs.getElementType());
  if (!out.getElementType().isF32())
    return noKernel(why, "a {0} result (the kernel writes f32)",
                    out.getElementType());
  int64_t rows = lhs.getDimSize(0), experts = rhs.getDimSize(0);
  if (rows < 1 || experts < 1)
    return noKernel(why, "no rows or no experts");
  return MatrixVector{rows,
                      k,
                      n,
                      experts,
                      lhs.getElementType(),
                      rhs.getElementType(),
                      offsets.getElementType(),
                      transposed};
}

/// Emits the body of the matrix-vector kernel's gpu.launch.
struct MatrixVectorEmitter : KernelBuilder {
  const MatrixVector &g;
  int64_t grid;
  Value lhs, rhs, offsets, out;

  /// `v` (f32 or i32) summed (or, with `max`, the largest) over the warp.
  Value warpReduce(Value v, bool max) {
    for (int64_t d : {16, 8, 4, 2, 1}) {
      Value other = gpu::ShuffleOp::create(b, loc, v, int32(d), int32(32),
                                           gpu::ShuffleMode::XOR)
                        .getShuffleResult();
      v = max ? arith::MaxSIOp::create(b, loc, v, other).getResult()
              : arith::AddFOp::create(b, loc, v, other).getResult();
    }
    return v;
  }

  /// The group of row `r`: the last expert whose clamped rows hold it, or
  /// -1 (i32). Every lane of the warp takes part.
  Value groupOf(Value r, Value lane) {
    if (g.experts == 1) {
      auto [lo, hi] = groupRows(offsets, idx(0), g.rows);
      Value in = land(cmp(P::sge, r, lo), cmp(P::slt, r, hi));
      return select(in, int32(0), int32(-1));
    }
    int64_t rounds = tilesOf(g.experts, 32);
    SmallVector<Value> found = forLoop(
        0, idx(rounds), ValueRange{int32(-1)},
        [&](Value round, ValueRange cur) -> SmallVector<Value> {
          Value e = add(mul(round, idx(32)), lane);
          Value mine = ifElse(
              TypeRange{i32()}, cmp(P::slt, e, idx(g.experts)),
              [&]() -> SmallVector<Value> {
                auto [lo, hi] = groupRows(offsets, e, g.rows);
                Value in = land(cmp(P::sge, r, lo), cmp(P::slt, r, hi));
                return {select(
                    in,
                    arith::IndexCastOp::create(b, loc, i32(), e).getResult(),
                    int32(-1))};
              },
              [&]() -> SmallVector<Value> { return {int32(-1)}; })[0];
          return {arith::MaxSIOp::create(b, loc, cur[0], mine).getResult()};
        });
    return warpReduce(found[0], /*max=*/true);
  }

  /// This thread's N sums over row r of group `group` (index), chunks of
  /// `w` values: vector loads when `w` > 1.
  SmallVector<Value> rowSums(Value lhsFlat, Value rhsFlat, Value lhsBase,
                             Value rhsBase, Value r, Value group, Value t,
                             int64_t w, Value chunks) {
    Type f32 = b.getF32Type();
    SmallVector<Value> zeros(
        g.n, arith::ConstantFloatOp::create(b, loc, cast<FloatType>(f32),
                                            APFloat(0.0f)));
    int64_t lhsBytes = g.lhsElt.getIntOrFloatBitWidth() / 8,
            rhsBytes = g.rhsElt.getIntOrFloatBitWidth() / 8;
    auto op = scf::ForOp::create(b, loc, t, chunks, idx(g.rowThreads()), zeros);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(op.getBody());
    Value k0 = mul(op.getInductionVar(), idx(w));
    Value at = add(mul(r, idx(g.k)), k0);
    SmallVector<Value> a =
        w > 1 ? loadVector(g.lhsElt, w,
                           globalPtr(lhsBase, mul(at, idx(lhsBytes))),
                           w * lhsBytes)
              : SmallVector<Value>{
                    memref::LoadOp::create(b, loc, lhsFlat, ValueRange{at})};
    SmallVector<Value> sums(op.getRegionIterArgs());
    for (int64_t c = 0; c < g.n; ++c) {
      // rhs[group, k, c] at (group K + k) N + c, or rhs[group, c, k] at
      // (group N + c) K + k.
      SmallVector<Value> v;
      if (g.transposed || g.n == 1) {
        Value from =
            g.transposed
                ? add(mul(add(mul(group, idx(g.n)), idx(c)), idx(g.k)), k0)
                : add(mul(group, idx(g.k)), k0);
        if (w > 1)
          v = loadVector(g.rhsElt, w,
                         globalPtr(rhsBase, mul(from, idx(rhsBytes))),
                         std::min(w * rhsBytes, VectorBytes));
        else
          v.push_back(
              memref::LoadOp::create(b, loc, rhsFlat, ValueRange{from}));
      } else {
        for (int64_t i = 0; i < w; ++i) {
          Value from =
              add(mul(add(add(mul(group, idx(g.k)), k0), idx(i)), idx(g.n)),
                  idx(c));
          v.push_back(
              memref::LoadOp::create(b, loc, rhsFlat, ValueRange{from}));
        }
      }
      Value s = sums[c];
      for (int64_t i = 0; i < w; ++i)
        s = arith::AddFOp::create(
            b, loc, s, arith::MulFOp::create(b, loc, toF32(a[i]), toF32(v[i])));
      sums[c] = s;
    }
    scf::YieldOp::create(b, loc, sums);
    b.setInsertionPointAfter(op);
    return SmallVector<Value>(op.getResults());
  }

  void emit(gpu::LaunchOp launch) {
    Value tid = launch.getThreadIds().x;
    Value lane = rem(tid, 32), warp = div(tid, 32);
    setUpSharedMemory();
    Value lhsFlat = flat(lhs), rhsFlat = flat(rhs), outFlat = flat(out);
    Value lhsBase = baseAddress(lhsFlat), rhsBase = baseAddress(rhsFlat);
    int64_t w = g.width();
    Value vectors = boolean(false);
    if (w > 1) {
      Value mask = arith::AndIOp::create(b, loc, lhsBase, int64(15));
      if (g.rhsAlongK())
        mask = arith::OrIOp::create(
            b, loc, mask, arith::AndIOp::create(b, loc, rhsBase, int64(15)));
      vectors = cmp(P::eq, mask, int64(0));
    }
    bool perWarp = g.warpPerRow();
    // A warp's (or the CTA's) first row and the stride between rows.
    Value first = perWarp ? add(mul(launch.getBlockIds().x, idx(Warps)), warp)
                          : launch.getBlockIds().x;
    int64_t step = perWarp ? grid * Warps : grid;
    Value t = perWarp ? lane : tid;
    Type f32 = b.getF32Type();
    strideLoop(first, idx(g.rows), step, [&](Value r) {
      Value group = groupOf(r, lane);
      Value valid = cmp(P::sge, group, int32(0));
      Value gi = toIndex(select(valid, group, int32(0)));
      // A row in no group sums nothing: +0.
      auto chunksOf = [&](int64_t width) {
        return select(valid, idx(g.k / width), idx(0));
      };
      SmallVector<Type> types(g.n, f32);
      SmallVector<Value> sums =
          w > 1 ? ifElse(
                      types, vectors,
                      [&] {
                        return rowSums(lhsFlat, rhsFlat, lhsBase, rhsBase, r,
                                       gi, t, w, chunksOf(w));
                      },
                      [&] {
                        return rowSums(lhsFlat, rhsFlat, lhsBase, rhsBase, r,
                                       gi, t, 1, chunksOf(1));
                      })
                : rowSums(lhsFlat, rhsFlat, lhsBase, rhsBase, r, gi, t, 1,
                          chunksOf(1));
      for (Value &s : sums)
        s = warpReduce(s, /*max=*/false);
      if (perWarp) {
        ifThen(cmp(P::eq, lane, idx(0)), [&] {
          for (int64_t c = 0; c < g.n; ++c)
            memref::StoreOp::create(b, loc, sums[c], outFlat,
                                    ValueRange{add(mul(r, idx(g.n)), idx(c))});
        });
        return;
      }
      // The 8 warps' sums through shared memory ([warp][column] f32), added
      // in warp order by thread c for column c.
      ifThen(cmp(P::eq, lane, idx(0)), [&] {
        for (int64_t c = 0; c < g.n; ++c)
          LLVM::StoreOp::create(
              b, loc, sums[c],
              sharedPtrAt(mul(add(mul(warp, idx(g.n)), idx(c)), idx(4))), 4);
      });
      NVVM::Barrier0Op::create(b, loc);
      ifThen(cmp(P::slt, tid, idx(g.n)), [&] {
        Value s =
            LLVM::LoadOp::create(b, loc, f32, sharedPtrAt(mul(tid, idx(4))), 4);
        for (int64_t wi = 1; wi < Warps; ++wi)
          s = arith::AddFOp::create(
              b, loc, s,
              LLVM::LoadOp::create(
                  b, loc, f32,
                  sharedPtrAt(mul(add(idx(wi * g.n), tid), idx(4))), 4));
        memref::StoreOp::create(b, loc, s, outFlat,
                                ValueRange{add(mul(r, idx(g.n)), tid)});
      });
      NVVM::Barrier0Op::create(b, loc); // the slots are free for the next row
    });
  }
};

} // namespace

void lowerMatrixVectors(ModuleOp module, SymbolTable &symbols,
                        KernelReport *report) {
  SmallVector<std::pair<GroupedMatmulOp, MatrixVector>> work;
  std::string why;
  for (auto func : module.getOps<func::FuncOp>())
    if (!func->hasAttr("moe.dedicated_kernel"))
      func.walk([&](GroupedMatmulOp op) {
        why.clear();
        if (std::optional<MatrixVector> g =
                matchMatrixVector(op, report ? &why : nullptr))
          work.push_back({op, *g});
        else if (report && !why.empty())
          report->generic(op, why);
      });
  for (auto &[op, g] : work) {
    int64_t perCta = g.warpPerRow() ? Warps : 1;
    int64_t grid = std::min(tilesOf(g.rows, perCta), MaxCtas);
    int64_t smemBytes = g.warpPerRow() ? 0 : Warps * g.n * 4;
    func::FuncOp kernel = getOrCreateKernelCall(
        module, symbols, g.name(), "matrix-vector product",
        {op.getLhs().getType(), op.getRhs().getType(),
         op.getOffsets().getType()},
        op.getType(), op.getLoc(), {grid, 1, 1, Threads, smemBytes},
        [&, &g = g](OpBuilder &b, gpu::LaunchOp launch, ArrayRef<Value> buf,
                    Value out) {
          MatrixVectorEmitter k{{b, op.getLoc()}, g,      grid, buf[0],
                                buf[1],           buf[2], out};
          k.emit(launch);
        });
    replaceByGemmCall(op, kernel);
  }
}

} // namespace mlir::moe::kernels
