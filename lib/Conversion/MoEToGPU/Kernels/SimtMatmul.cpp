//===- SimtMatmul.cpp - f32 matmul on CUDA cores --------------------------===//
//
// Hopper (sm_90a): f32 dense matmul on CUDA cores
// -----------------------------------------------
// Handles linalg.matmul (the plain form: no broadcast or transposed maps) on
// f32 tensors of static shape: C = C_in + A [M, K] @ B [K, N]. The router's
// projection and its gradients, attention and LM-head projections are such
// matmuls; without this kernel each output element is one thread's K-long
// loop over global memory.
//
// Grid (ceil(N/128), ceil(M/128)), 256 threads (16 x 16). CTA (bx, by) owns
// C[m0 : m0+128][n0 : n0+128], m0 = 128 by, n0 = 128 bx; thread (tx, ty) =
// (t % 16, t / 16) owns rows m0 + 64 p + 4 ty + i and columns n0 + 64 q +
// 4 tx + j (p, q = 0, 1; i, j = 0..3), 64 f32 accumulators in registers
// (two 4-row and two 4-column groups 64 apart, so that a warp's 16-byte
// shared loads of one group cover 256 contiguous bytes). K advances 16 at a
// time: the A tile (128 x 16) is stored transposed in shared memory
// (As[k][m], byte 4 (128 k + m)), the B tile (16 x 128) as is (Bs[k][n],
// byte 8192 + 4 (128 k + n)); elements outside A or B are stored as zeros.
// Each thread loads 8 elements of each: 4 consecutive ones of two rows (one
// 16-byte load each for a run inside A or B with 16-byte aligned rows),
// and the next step's while the FMAs of this one run (held in registers,
// stored after the step). Per step: store, barrier, then for each of the 16
// k four 16-byte shared loads (As[k], Bs[k], both groups) and 64 FMAs;
// barrier. (Against 64 x 64 tiles of 4 x 4: half the shared-memory reads an
// FMA, which bounded those at half the FP32 rate.) Each output is summed over
// k = 0..K-1 in order (one FMA chain,
// starting from 0) and C_in is added at the end, as the generic lowering
// contracts them. Few tiles over a long K (simtSplits: a weight gradient
// summed over tokens, [2048 x 128] over 8192 of them is 64 tiles) split K
// over the grid's z: CTA z sums its split's steps into partial[z] ([splits,
// M, N], allocated in the function), and a second kernel adds the partials
// in split order and C_in; the sum's order then differs from the generic
// lowering's single chain (f32 rounding).
//
//===----------------------------------------------------------------------===//

#include "HopperBuilder.h"
#include "Kernels.h"

using namespace mlir;
using namespace mlir::moe;

namespace mlir::moe::kernels {

namespace simt {
constexpr int64_t Tile = 128, TileK = 16, Threads = 256, Per = 4;
// A thread's rows (columns): 2 groups of Per, Half apart.
constexpr int64_t Groups = 2, Half = Tile / Groups;
constexpr int64_t Acc = Groups * Per * Groups * Per; // 64
// Per K step a thread loads 2 x 4 elements of A and of B.
constexpr int64_t Loads = 2 * Groups * Per;
constexpr int64_t BTileBytes = TileK * Tile * 4; // 8192
// Every element of the 128 x 16 A and 16 x 128 B tiles loaded once a step.
static_assert(Threads * Loads == 2 * Tile * TileK, "f32 matmul: tile loads");
} // namespace simt

using namespace simt;

namespace {

struct SimtMatmul {
  int64_t m, n, k;
  /// K splits (1: none).
  int64_t splits = 1;
  std::string name() const {
    return llvm::formatv("moe_simt_matmul_{0}x{1}x{2}_f32", m, n, k).str();
  }
  int64_t steps() const { return llvm::divideCeil(k, TileK); }
  /// K steps of 16 a split takes.
  int64_t stepsPerSplit() const { return llvm::divideCeil(steps(), splits); }
};

/// Few output tiles over a long K (a weight gradient summed over tokens:
/// [2048 x 128] over 8192 tokens is 16 tiles) would leave most of the GPU's
/// 132 SMs idle: K is split so that about two CTAs run per SM, each split
/// at least 64 steps of 16.
int64_t simtSplits(int64_t m, int64_t n, int64_t k) {
  int64_t tiles = tilesOf(m, Tile) * tilesOf(n, Tile);
  int64_t steps = llvm::divideCeil(k, TileK);
  int64_t splits = 1;
  while (splits < 16 && tiles * splits * 2 <= 264 && steps / (splits * 2) >= 64)
    splits *= 2;
  return splits;
}

/// The shape of `op` if the CUDA-core kernel takes it. `why` stays empty
/// where the generic path is the better choice (few outputs).
std::optional<SimtMatmul> matchSimtMatmul(linalg::MatmulOp op, WhyNot why) {
  if (op.hasUserDefinedMaps() || !op.hasPureTensorSemantics() ||
      op.getInputs().size() != 2 || op.getOutputs().size() != 1)
    return noKernel(why, "indexing maps or operands the kernel does not take");
  if (op->getParentOfType<ExpertsOp>())
    return noKernel(why, "inside a moe.experts region (not grouped)");
  auto a = dyn_cast<RankedTensorType>(op.getInputs()[0].getType());
  auto b = dyn_cast<RankedTensorType>(op.getInputs()[1].getType());
  auto c = dyn_cast<RankedTensorType>(op.getOutputs()[0].getType());
  if (!a || !b || !c || a.getRank() != 2 || b.getRank() != 2 ||
      c.getRank() != 2)
    return noKernel(why, "operands that are not matrices");
  if (!a.getElementType().isF32() || !b.getElementType().isF32() ||
      !c.getElementType().isF32())
    return noKernel(why,
                    "{0} x {1} -> {2}: only f32 matmuls have a dense kernel; "
                    "under a precision recipe dense GEMMs take the wgmma "
                    "kernels as moe.grouped_matmul (-moe-dense-to-grouped)",
                    a.getElementType(), b.getElementType(), c.getElementType());
  if (!a.hasStaticShape() || !b.hasStaticShape() || !c.hasStaticShape())
    return noKernel(why, "a dynamic shape (the kernels are generated for "
                         "static shapes)");
  int64_t m = a.getDimSize(0), k = a.getDimSize(1), n = b.getDimSize(1);
  if (m < 1 || n < 1 || k < 1 || b.getDimSize(0) != k || c.getDimSize(0) != m ||
      c.getDimSize(1) != n)
    return noKernel(why, "an empty or inconsistent shape");
  // Fewer than 1024 outputs (a dot product, a short matrix-vector product):
  // one or two CTAs would do all of K; the generic path splits such
  // reductions over many threads (-moe-gpu-split-reductions).
  if (m * n < 1024)
    return std::nullopt;
  return SimtMatmul{m, n, k, simtSplits(m, n, k)};
}

/// Emits the body of the f32 matmul's gpu.launch.
struct SimtMatmulEmitter : HopperBuilder {
  const SimtMatmul &g;
  Value a, bm, cIn, out; // A [M, K], B [K, N], C_in [M, N], result [M, N]
  /// With K split: partial sums [splits, M, N], written instead of `out`
  /// (CTA z sums its split's K steps, without C_in).
  Value partial;
  Value tid{}, m0{}, n0{}, aBase{}, bBase{};

  void storeSharedF32(Value byteOffset, Value v) {
    LLVM::StoreOp::create(b, loc, v, sharedPtrAt(byteOffset), /*alignment=*/4);
  }
  /// `memref[r][c]` when (r, c) is inside (rows, cols), else 0.
  Value loadOrZero(Value memref, Value r, Value c, int64_t rows, int64_t cols) {
    Value inside = land(cmp(P::slt, r, idx(rows)), cmp(P::slt, c, idx(cols)));
    auto ifOp = scf::IfOp::create(b, loc, TypeRange{b.getF32Type()}, inside,
                                  /*withElseRegion=*/true);
    {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(&ifOp.getThenRegion().front());
      scf::YieldOp::create(
          b, loc,
          ValueRange{memref::LoadOp::create(b, loc, memref, ValueRange{r, c})});
      b.setInsertionPointToStart(&ifOp.getElseRegion().front());
      scf::YieldOp::create(
          b, loc,
          ValueRange{arith::ConstantOp::create(b, loc, b.getF32FloatAttr(0))});
    }
    return ifOp.getResult(0);
  }

  /// This thread's share of K step `kt`'s tiles, as tile coordinates: A
  /// elements (t / 4 + 64 r, 4 (t % 4) + q) and B elements (t / 32 + 8 r,
  /// 4 (t % 32) + q), r = 0, 1, q = 0..3.
  Value aRow(int64_t r) { return add(div(tid, 4), idx(Half * r)); }
  Value aCol() { return mul(rem(tid, 4), idx(Per)); }
  Value bRow(int64_t r) { return add(div(tid, 32), idx(8 * r)); }
  Value bCol() { return mul(rem(tid, 32), idx(Per)); }
  /// Loads them (zero outside A or B), A's 8, then B's: each run of 4 as
  /// one 16-byte load where it lies inside its matrix and rows are 16-byte
  /// aligned (`vectorOk`), else one bounds-checked load an element (so a
  /// matrix narrower than the tile takes the slow loads only at its edge).
  SmallVector<Value> loadStep(Value kt, Value vectorOk) {
    Value k0 = mul(kt, idx(TileK));
    SmallVector<Value> values;
    auto run = [&](Value m, Value base, Value row, Value col, int64_t rows,
                   int64_t cols) {
      Value inside =
          land(vectorOk, land(cmp(P::slt, row, idx(rows)),
                              cmp(P::sle, add(col, idx(Per)), idx(cols))));
      llvm::append_range(
          values, ifElse(
                      SmallVector<Type>(Per, b.getF32Type()), inside,
                      [&] {
                        Value at = mul(add(mul(row, idx(cols)), col), idx(4));
                        return loadVector(b.getF32Type(), Per,
                                          globalPtr(base, at), 16);
                      },
                      [&] {
                        SmallVector<Value> elements;
                        for (int64_t q = 0; q < Per; ++q)
                          elements.push_back(
                              loadOrZero(m, row, add(col, idx(q)), rows, cols));
                        return elements;
                      }));
    };
    for (int64_t r = 0; r < 2; ++r)
      run(a, aBase, add(m0, aRow(r)), add(k0, aCol()), g.m, g.k);
    for (int64_t r = 0; r < 2; ++r)
      run(bm, bBase, add(k0, bRow(r)), add(n0, bCol()), g.k, g.n);
    return values;
  }
  /// Stores loadStep's values: A transposed (As[k][m], byte 4 (128 k + m)),
  /// B as it is (Bs[k][n], 16 bytes at byte 8192 + 4 (128 k + n)).
  void storeStep(ArrayRef<Value> values) {
    for (int64_t r = 0; r < 2; ++r)
      for (int64_t q = 0; q < Per; ++q)
        storeSharedF32(
            mul(add(mul(add(aCol(), idx(q)), idx(Tile)), aRow(r)), idx(4)),
            values[Per * r + q]);
    for (int64_t r = 0; r < 2; ++r) {
      Value v = vectorOf(ArrayRef(values).slice(2 * Per + Per * r, Per));
      LLVM::StoreOp::create(
          b, loc, v,
          sharedPtrAt(add(idx(BTileBytes),
                          mul(add(mul(bRow(r), idx(Tile)), bCol()), idx(4)))),
          /*alignment=*/16);
    }
  }
  /// 4 consecutive f32 of shared memory from byte `byteOffset` (16-aligned).
  SmallVector<Value> loadShared4(Value byteOffset) {
    return loadVector(b.getF32Type(), Per, sharedPtrAt(byteOffset), 16);
  }

  void emit(gpu::LaunchOp launch) {
    tid = launch.getThreadIds().x;
    n0 = mul(launch.getBlockIds().x, idx(Tile));
    m0 = mul(launch.getBlockIds().y, idx(Tile));
    setUp(/*lbo=*/0, /*sbo=*/0); // (no MMA descriptors here)
    aBase = baseAddress(a);
    bBase = baseAddress(bm);
    // 16-byte loads need rows of A and B (K and N f32) and both buffers
    // 16-byte aligned.
    Value vectorOk = boolean(g.k % Per == 0 && g.n % Per == 0);
    vectorOk = land(
        vectorOk,
        cmp(P::eq,
            arith::AndIOp::create(
                b, loc, arith::OrIOp::create(b, loc, aBase, bBase), int64(15)),
            int64(0)));
    Value tx = rem(tid, 16), ty = div(tid, 16);
    Value zero = arith::ConstantOp::create(b, loc, b.getF32FloatAttr(0));
    // This CTA's K steps: all, or those of split z.
    Value split = launch.getBlockIds().z;
    Value first = mul(split, idx(g.stepsPerSplit()));
    Value count = minS(
        idx(g.stepsPerSplit()),
        maxS(arith::SubIOp::create(b, loc, idx(g.steps()), first), idx(0)));
    // Step kt's tiles are in shared memory while step kt + 1's loads are in
    // flight (in registers, stored after the step's FMAs).
    // Accumulator ii * 8 + jj: row 64 (ii / 4) + 4 ty + ii % 4, column
    // 64 (jj / 4) + 4 tx + jj % 4 of the tile.
    constexpr int64_t side = Groups * Per;
    auto rowOf = [&](int64_t ii) {
      return add(m0, add(mul(ty, idx(Per)), idx(Half * (ii / Per) + ii % Per)));
    };
    auto colOf = [&](int64_t jj) {
      return add(n0, add(mul(tx, idx(Per)), idx(Half * (jj / Per) + jj % Per)));
    };
    SmallVector<Value> init(Acc, zero);
    SmallVector<Value> staged = ifElse(
        SmallVector<Type>(Loads, b.getF32Type()), cmp(P::sgt, count, idx(0)),
        [&] { return loadStep(first, vectorOk); },
        [&] { return SmallVector<Value>(Loads, zero); });
    llvm::append_range(init, staged);
    SmallVector<Value> acc = forLoop(
        0, count, init,
        [&](Value kt, ValueRange carried) -> SmallVector<Value> {
          storeStep(llvm::to_vector(carried.drop_front(Acc)));
          NVVM::Barrier0Op::create(b, loc);
          Value next = add(add(first, kt), idx(1));
          SmallVector<Value> prefetched = ifElse(
              SmallVector<Type>(Loads, b.getF32Type()),
              cmp(P::slt, add(kt, idx(1)), count),
              [&] { return loadStep(next, vectorOk); },
              [&] { return SmallVector<Value>(Loads, zero); });
          SmallVector<Value> d(carried.begin(), carried.begin() + Acc);
          for (int64_t kk = 0; kk < TileK; ++kk) {
            SmallVector<Value> av, bv;
            for (int64_t p = 0; p < Groups; ++p) {
              llvm::append_range(
                  av, loadShared4(
                          mul(add(idx(kk * Tile + Half * p), mul(ty, idx(Per))),
                              idx(4))));
              llvm::append_range(
                  bv, loadShared4(add(
                          idx(BTileBytes),
                          mul(add(idx(kk * Tile + Half * p), mul(tx, idx(Per))),
                              idx(4)))));
            }
            for (int64_t i = 0; i < side; ++i)
              for (int64_t j = 0; j < side; ++j)
                d[i * side + j] =
                    math::FmaOp::create(b, loc, av[i], bv[j], d[i * side + j]);
          }
          NVVM::Barrier0Op::create(b, loc);
          llvm::append_range(d, prefetched);
          return d;
        });
    for (int64_t i = 0; i < side; ++i)
      for (int64_t j = 0; j < side; ++j) {
        Value r = rowOf(i), c = colOf(j);
        ifThen(land(cmp(P::slt, r, idx(g.m)), cmp(P::slt, c, idx(g.n))), [&] {
          if (partial) {
            memref::StoreOp::create(b, loc, acc[i * side + j], partial,
                                    ValueRange{split, r, c});
            return;
          }
          Value prior = memref::LoadOp::create(b, loc, cIn, ValueRange{r, c});
          Value sum = arith::AddFOp::create(b, loc, prior, acc[i * side + j]);
          memref::StoreOp::create(b, loc, sum, out, ValueRange{r, c});
        });
      }
  }

  /// The second kernel of a split K: out = C_in + (((p_0 + p_1) + p_2) ...),
  /// one thread an output, grid-stride.
  void emitSum(gpu::LaunchOp launch, int64_t grid) {
    Value gtid =
        add(mul(launch.getBlockIds().x, idx(Threads)), launch.getThreadIds().x);
    strideLoop(gtid, idx(g.m * g.n), grid * Threads, [&](Value e) {
      Value r = div(e, g.n), c = rem(e, g.n);
      Value sum =
          memref::LoadOp::create(b, loc, partial, ValueRange{idx(0), r, c});
      for (int64_t z = 1; z < g.splits; ++z)
        sum = arith::AddFOp::create(
            b, loc, sum,
            memref::LoadOp::create(b, loc, partial, ValueRange{idx(z), r, c}));
      Value prior = memref::LoadOp::create(b, loc, cIn, ValueRange{r, c});
      memref::StoreOp::create(b, loc, arith::AddFOp::create(b, loc, prior, sum),
                              out, ValueRange{r, c});
    });
  }
};

/// The private function computing one f32 matmul shape: (A, B, C_in) ->
/// C_in + A @ B.
func::FuncOp
getOrCreateSimtMatmulFunction(ModuleOp module, SymbolTable &symbols,
                              const SimtMatmul &g, ArrayRef<Type> argTypes,
                              RankedTensorType resultType, Location loc) {
  return getOrCreateKernelCall(
      module, symbols, g.name(), "f32 matmul, shared-memory tiles", argTypes,
      resultType, loc,
      {tilesOf(g.n, Tile), tilesOf(g.m, Tile), g.splits, Threads,
       2 * BTileBytes},
      [&](OpBuilder &b, gpu::LaunchOp launch, ArrayRef<Value> buf, Value out) {
        SimtMatmulEmitter k{{{b, loc}}, g, buf[0], buf[1], buf[2], out, {}};
        if (g.splits > 1) {
          // The partial sums, allocated before this launch; the sums in a
          // second launch after it (the deallocation pipeline frees the
          // buffer).
          OpBuilder::InsertionGuard guard(b);
          b.setInsertionPoint(launch);
          k.partial = memref::AllocOp::create(
              b, loc, MemRefType::get({g.splits, g.m, g.n}, b.getF32Type()));
        }
        k.emit(launch);
        if (g.splits == 1)
          return;
        OpBuilder::InsertionGuard guard(b);
        b.setInsertionPointAfter(launch);
        int64_t grid = std::min<int64_t>(tilesOf(g.m * g.n, Threads), 1024);
        auto sum = createNamedLaunch(b, loc, {grid, 1, 1, Threads, 0},
                                     g.name() + "_sum_kernel");
        b.setInsertionPoint(sum.getBody().front().getTerminator());
        k.emitSum(sum, grid);
      });
}

} // namespace

bool lowerToSimtMatmul(linalg::MatmulOp op, ModuleOp module,
                       SymbolTable &symbols, KernelReport *report) {
  std::string why;
  std::optional<SimtMatmul> mm = matchSimtMatmul(op, report ? &why : nullptr);
  if (!mm) {
    if (report)
      report->generic(op, why);
    return false;
  }
  Value lhs = op.getInputs()[0], rhs = op.getInputs()[1],
        init = op.getOutputs()[0];
  auto resultType = cast<RankedTensorType>(op->getResult(0).getType());
  func::FuncOp kernel = getOrCreateSimtMatmulFunction(
      module, symbols, *mm, {lhs.getType(), rhs.getType(), init.getType()},
      resultType, op.getLoc());
  OpBuilder b(op);
  auto call =
      func::CallOp::create(b, op.getLoc(), kernel, ValueRange{lhs, rhs, init});
  op->getResult(0).replaceAllUsesWith(call.getResult(0));
  op->erase();
  return true;
}

} // namespace mlir::moe::kernels
