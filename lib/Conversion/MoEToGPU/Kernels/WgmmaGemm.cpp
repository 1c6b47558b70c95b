//===- WgmmaGemm.cpp - Hopper bf16 grouped GEMM (cp.async) ----------------===//
//
// Hopper (sm_90a): bf16 grouped GEMM on warpgroup MMA (wgmma)
// -----------------------------------------------------------
// Handles moe.grouped_matmul with bf16 lhs [R, K] and rhs [E, K, N] (or,
// with transpose_rhs, [E, N, K]), f32 result, static shapes, K % 64 == 0,
// N % 128 == 0 (R arbitrary). Anything else keeps the generic path. Shapes
// with N % 256 == 0 or N > 256, and R >= 128, take the TMA kernel
// (TmaGemmMainloop.cpp) instead (same operands and results, the same layouts in
// shared memory).
//
// Grid (N/128, ceil(R/128)), 128 threads = one warpgroup. CTA (bx, by) owns
// output rows [m0, m0+128), m0 = 128 by, and columns [n0, n0+128), n0 =
// 128 bx (the N tiles of one row tile run side by side, so the A rows they
// share and the few experts' B they read stay in L2).
//
// Groups: as the Blackwell kernel. The CTA walks the experts in order; for
// every expert whose clamped row range [lo, hi) meets the tile it runs a full
// K loop into a fresh (zero) accumulator and stores only the rows in
// [lo, hi). The MMA's rows are independent, so rows of other experts in the
// tile (multiplied with this expert's weights) change nothing that is
// stored. Rows in no group are written as zeros at the end (only those
// before offsets[E] when nothing reads the others: the `_live` variant, for
// the rows of a dispatch, LiveRows.h); rows >= R are loaded from row R-1
// (clamped address) and never stored.
//
// K loop: stages of 64 K values, a ring of 3 shared-memory buffers of 32 KiB
// (A tile 128 x 64 bf16, then B tile 64 x 128 bf16; 97 KiB with the
// alignment slack, so two CTAs share an SM and one's MMAs run while the
// other waits), filled with cp.async (16 bytes per copy, .cg, 16 copies per
// thread per stage), two stages loaded ahead. Iteration `it`:
//   cp.async.wait_group 1        this thread's copies of stage `it` are done
//   fence.proxy.async.shared::cta  (generic-proxy writes -> wgmma reads)
//   bar.sync                     everyone's copies are done, and everyone
//                                has passed wgmma.wait_group 0 of iteration
//                                it-1, so the MMAs of it-1 are complete: its
//                                buffer, (it+2) % 3, may be refilled
//   cp.async stage it+2 (if any); cp.async.commit_group (always, so the group
//                                count stays uniform)
//   wgmma.fence; 8 x wgmma.mma_async m64n128k16 (4 K steps x 2 M halves);
//   wgmma.commit_group; wgmma.wait_group 0
// (hopper::Stages, Ahead and MmaInFlight in HopperBuilder.h; measured on the
// H200 at the Qwen3 GEMM1 shape: 3/2/0 at 0.64 ms, 3/1/1 0.75, 4/2/1 0.81,
// 4/3/0 0.84).
//
// Shared memory layouts: 128-byte swizzle (PTX ISA, "Asynchronous warpgroup
// level matrix shared memory layout"; CUTLASS's canonical GMMA layouts, T =
// 8 bf16 = 16 bytes). Every tile is stored as rows of 128 bytes, 16-byte
// chunk c of row r at chunk c ^ (r % 8) of that row: an atom of 8 rows is
// 1024 bytes, and atoms start on 1024-byte boundaries (the pattern is a
// function of address bits 4-9; the kernel rounds the dynamic shared memory
// up to 1 KiB and asks for 1 KiB more).
//   A, K-major, Swizzle<3,4,3> o ((8,m),(T,2)):((8T,SBO),(1,T)): row r of
//     the 128 x 64 tile at byte 128 r (its 64 K values). SBO = 1024 (next 8
//     rows); LBO unused.
//   B, MN-major (the rhs is [K, N] with N contiguous; wgmma's transpose-B,
//     layout `row` in NVVM, reads it as is), Swizzle<3,4,3> o
//     ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)): columns [64 q, 64 q + 64) of
//     the 64 x 128 tile are a block of 64 K rows x 128 bytes at 8192 q, K
//     row k of it at 128 k. SBO = 1024 (next 8 K rows), LBO = 8192 (next 64
//     columns).
//   B, K-major (transpose_rhs: the rhs is [E, N, K] with K contiguous, as a
//     data gradient reads its weights; wgmma's untransposed B, layout `col`):
//     laid out as A, N for the rows, so no transposed copy of the weights is
//     made.
//   MMA j (K step of 16) of half h uses A at byte 8192 h + 32 j (32 bytes
//   into the rows: the hardware swizzles the addresses it forms) and B at
//   2048 j (MN-major: two atoms of K rows) or 32 j (K-major).
//   Descriptor (sm_90 format): bits 0-13 start address >> 4, 16-29 LBO >> 4,
//   32-45 SBO >> 4, 49-51 base offset (0), 62-63 layout type (1: 128-byte
//   swizzle).
//   Copies: 8 consecutive lanes copy one 128-byte row (whole global lines;
//   with the unswizzled layout two warps read halves of every line, which
//   the profiler showed as twice the L2 sectors) into one 128-byte row of
//   shared memory (a permutation of its chunks: no bank conflicts). A: row
//   t/8 + 16 i, chunk t%8; MN-major B: K row t/16 + 8 i, N chunk t%16;
//   i = 0..7.
//
// Accumulator (PTX ISA, "wgmma D matrix fragment", m64nNk16, f32): thread t
// of the warpgroup (warp w = t/32, lane l = t%32) holds N/2 = 64 floats;
// register i = 4 j + 2 h + c (j = 0..15, h, c = 0..1) is
//   row 16 w + l/4 + 8 h, column 8 j + 2 (l%4) + c
// of the 64 x 128 result of that MMA half. The NVVM op returns them as an
// LLVM struct of 64 f32 in that order.
//
// Numerics: bf16 products accumulated in f32 by the tensor core, in its own
// order: results match the reference to f32 rounding, not bit for bit.
//
// Checked on an H200 by scripts/gpu-check.sh (test/Integration/GPU).
//
//===----------------------------------------------------------------------===//

#include "HopperBuilder.h"
#include "Kernels.h"

using namespace mlir;
using namespace mlir::moe;

namespace mlir::moe::kernels {

/// Brings a grouped GEMM to the form the bf16 wgmma kernel takes (bf16
/// operands whose rows the copy engine reads, rhs [E, K, N]):
/// - Hopper has no block-scaled MMA: an MX operand whose blocks run along K
///   (lhs `axis = 1`; rhs `axis = 1`, or `axis = 2` with `transpose_rhs`)
///   becomes `moe.dequantize` to bf16. The dequantization is exact: an
///   E4M3/E5M2 element has at most 4 significant bits and its scale is a
///   power of two, so `q * 2^e` is a bf16 value (down to bf16's smallest
///   subnormal, 2^-133: scales of 2^-124 (E4M3) / 2^-117 (E5M2) and above,
///   beneath which elements are far below anything a GEMM sums); bf16
///   products are exact in the f32 accumulator. A blockwise FP8 operand
///   with power-of-two scales (any tiles) likewise.
/// - K or N not a multiple of 8 (bf16 rows the copy engine cannot read: a
///   router over 60 experts): the operands padded with zeros to multiples of
///   8, of which the result's first N columns are taken (the same values:
///   the padding adds zero products).
/// - `transpose_rhs` (the data gradient's rhs [E, N, K]) stays: the kernel
///   reads such an rhs K-major, as wgmma's untransposed B.
/// Only when the resulting GEMM fits the kernel; returns the new op, or
/// nullopt (nothing changed; `why` says why when the op needed a rewrite).
std::optional<GroupedMatmulOp> rewriteForWgmma(GroupedMatmulOp op, WhyNot why) {
  bool transposed = op.getTransposeRhs();
  // The operands' shapes (of tensors or MX values), static.
  auto staticShape = [](Value v) -> std::optional<ArrayRef<int64_t>> {
    ArrayRef<int64_t> shape;
    if (RankedTensorType data = blockScaledParts(v.getType()).first)
      shape = data.getShape();
    else if (auto t = dyn_cast<RankedTensorType>(v.getType()))
      shape = t.getShape();
    else
      return std::nullopt;
    if (ShapedType::isDynamicShape(shape))
      return std::nullopt;
    return shape;
  };
  std::optional<ArrayRef<int64_t>> lhs = staticShape(op.getLhs()),
                                   rhs = staticShape(op.getRhs());
  RankedTensorType result = op.getType();
  if (!lhs || !rhs || lhs->size() != 2 || rhs->size() != 3 ||
      !result.hasStaticShape() || op->getParentOfType<ExpertsOp>())
    return std::nullopt;
  int64_t rows = result.getDimSize(0), n = result.getDimSize(1);
  int64_t k = (*lhs)[1], experts = (*rhs)[0];
  auto blockScaled = [](Value v) { return isa<BlockScaledType>(v.getType()); };
  bool anyBlockScaled = blockScaled(op.getLhs()) || blockScaled(op.getRhs());
  bool pad = (k % 8 || n % 8) && !isMatrixVector(k, n);
  if (!anyBlockScaled && !pad)
    return std::nullopt;
  // Each operand: MX with blocks along K or blockwise FP8 with power-of-two
  // scales (dequantized), or already bf16.
  if (!bf16OrMXAlong(op.getLhs(), 1, "lhs", why) ||
      !bf16OrMXAlong(op.getRhs(), transposed ? 2 : 1, "rhs", why))
    return std::nullopt;
  OpBuilder b(op);
  Location loc = op.getLoc();
  SmallVector<Operation *> created;
  Value a = toBF16(b, loc, op.getLhs(), created),
        w = toBF16(b, loc, op.getRhs(), created);
  int64_t k8 = rowsOf16Bytes(k), n8 = rowsOf16Bytes(n);
  if (pad) {
    a = padWithZeros(b, loc, a, {rows, k8}, created);
    w = padWithZeros(b, loc, w,
                     transposed ? SmallVector<int64_t>{experts, n8, k8}
                                : SmallVector<int64_t>{experts, k8, n8},
                     created);
  }
  auto gemm =
      GroupedMatmulOp::create(b, loc, pad ? result.clone({rows, n8}) : result,
                              a, w, op.getOffsets(), transposed);
  if (!matchWgmmaGemm(gemm, why)) {
    gemm.erase();
    for (Operation *c : llvm::reverse(created))
      c->erase();
    return std::nullopt;
  }
  gemm->setDiscardableAttrs(op->getDiscardableAttrDictionary());
  op.getResult().replaceAllUsesWith(
      leadingPart(b, loc, gemm.getResult(), {rows, n}));
  op.erase();
  return gemm;
}

std::optional<WgmmaGemm> matchWgmmaGemm(GroupedMatmulOp op, WhyNot why) {
  bool transposed = op.getTransposeRhs();
  std::optional<Bf16GemmTypes> types = bf16GemmTypes(
      op, op.getLhs(), op.getRhs(), op.getOffsets(), /*rhsRank=*/3,
      /*resultRank=*/2, why);
  if (!types)
    return std::nullopt;
  auto [lhs, rhs, offsets, result] = *types;
  int64_t rows = lhs.getShape()[0], k = lhs.getShape()[1];
  int64_t experts = rhs.getShape()[0], n = rhs.getShape()[transposed ? 1 : 2];
  if (rows < 1 || experts < 1)
    return noKernel(why, "no rows or no experts");
  if (isMatrixVector(k, n))
    return std::nullopt;
  // The copy engine reads rows of multiples of 16 bytes.
  if (k % 8)
    return noKernel(why,
                    "K = {0} is not a multiple of 8 (the TMA kernel's bf16 "
                    "rows are multiples of 16 bytes)",
                    k);
  if (n % 8)
    return noKernel(why,
                    "N = {0} is not a multiple of 8 (the TMA kernel's bf16 "
                    "rows are multiples of 16 bytes)",
                    n);
  WgmmaGemm g{rows, k, n, experts, offsets.getElementType(), transposed};
  // The cp.async kernel takes whole tiles only; the TMA kernel partial ones.
  bool wholeTiles = k % hopper::TileK == 0 && n % hopper::TileN == 0;
  g.tma = !wholeTiles || tmaKernelTakes(rows, n, hopper::TileM);
  return g;
}

std::string WgmmaGemm::whyNotTma() const {
  std::string why;
  tmaKernelTakes(rows, n, hopper::TileM, &why);
  return why;
}

bool tmaKernelTakes(int64_t rows, int64_t n, int64_t minRows, WhyNot why) {
  if (n % 256 && n < 256) {
    noKernel(why,
             "N = {0} is under 256 and not a multiple of it (the TMA "
             "kernel's column tile)",
             n);
    return false;
  }
  if (rows < minRows) {
    noKernel(why, "{0} rows, under the TMA kernel's {1}", rows, minRows);
    return false;
  }
  return true;
}

namespace {

/// Emits the body of the wgmma grouped GEMM's gpu.launch.
struct WgmmaEmitter : HopperBuilder {
  const WgmmaGemm &g;
  // Buffers: A [R, K] bf16, B [E, K, N] bf16, offsets [E+1], result [R, N].
  Value a, w, offsets, out;
  Value tid{}, m0{}, n0{}, aGlobal{}, wGlobal{};

  /// Stage `kt` (K values [64 kt, 64 kt + 64)) of expert `e` into ring
  /// buffer `slot` (layouts in the header of this section).
  void loadStage(Value e, Value kt, Value slot) {
    Value stageBase = mul(slot, idx(hopper::StageBytes));
    Value bBase = add(stageBase, idx(hopper::TileABytes));
    Value k0 = mul(kt, idx(hopper::TileK));
    Value rowsLast = idx(g.rows - 1);
    // A: row r is lhs row m0 + r (clamped: rows past R are never stored).
    copyKMajorTile(tid, stageBase, aGlobal, [&](Value r, Value k) {
      Value grow = minS(add(m0, r), rowsLast);
      return mul(add(mul(grow, idx(g.k)), add(k0, k)), idx(2));
    });
    if (g.rhsTransposed) {
      // rhs [E, N, K]: row r of the B tile is column n0 + r.
      copyKMajorTile(tid, bBase, wGlobal, [&](Value r, Value k) {
        Value wrow = add(mul(e, idx(g.n)), add(n0, r));
        return mul(add(mul(wrow, idx(g.k)), add(k0, k)), idx(2));
      });
      return;
    }
    // rhs [E, K, N]: row r of the B tile is K row k0 + r.
    copyMNMajorTile(tid, bBase, wGlobal, [&](Value r, Value n) {
      Value krow = add(mul(e, idx(g.k)), add(k0, r));
      return std::make_pair(mul(add(mul(krow, idx(g.n)), add(n0, n)), idx(2)),
                            Value());
    });
  }

  SmallVector<Value> kLoop(Value e) {
    // A K-major; B MN-major (`row`: wgmma's transposed B) or, for a
    // transposed rhs, K-major (`col`).
    return pipelinedMma(
        idx(g.k / hopper::TileK),
        [&](Value kt, Value slot) { loadStage(e, kt, slot); },
        NVVM::MMALayout::row,
        g.rhsTransposed ? NVVM::MMALayout::col : NVVM::MMALayout::row);
  }

  void emit(gpu::LaunchOp launch) {
    tid = launch.getThreadIds().x;
    n0 = mul(launch.getBlockIds().x, idx(hopper::TileN));
    m0 = mul(launch.getBlockIds().y, idx(hopper::TileM));
    setUp(hopper::LBO, hopper::SBO, /*swizzled=*/true);
    aGlobal = baseAddress(a);
    wGlobal = baseAddress(w);

    // This thread's accumulator rows: (half hf, h) -> m0 + 64 hf + 16 w +
    // l/4 + 8 h; its columns n0 + 8 j + 2 (l%4) + c.
    Value warp = div(tid, 32), lane = rem(tid, 32);
    Value rowBase = add(m0, add(mul(warp, idx(16)), div(lane, 4)));
    Value colBase = add(n0, mul(rem(lane, 4), idx(2)));
    SmallVector<Value> rows;
    for (int64_t hf = 0; hf < 2; ++hf)
      for (int64_t h = 0; h < 2; ++h)
        rows.push_back(add(rowBase, idx(hopper::MmaM * hf + 8 * h)));

    walkGroupedTile(g.experts, offsets, g.rows, m0, rows, out, colBase,
                    g.liveRowsOnly, [&](Value e) { return kLoop(e); });
  }
};

} // namespace

namespace {
/// The private function computing one bf16 grouped GEMM shape on wgmma:
/// (A, B, offsets) -> result.
func::FuncOp getOrCreateWgmmaFunction(ModuleOp module, SymbolTable &symbols,
                                      const WgmmaGemm &g,
                                      ArrayRef<Type> argTypes,
                                      RankedTensorType resultType,
                                      Location loc) {
  if (g.tma)
    return getOrCreateWgmmaTmaFunction(
        module, symbols,
        TmaGemm{g.rows, g.k, g.n, g.experts, g.rhsTransposed, g.liveRowsOnly,
                /*wgrad=*/false, /*swiglu=*/std::nullopt},
        g.name(), argTypes, ArrayRef(resultType), loc);
  return withGroupedArgs(
      getOrCreateKernelCall(
          module, symbols, g.name(), "wgmma.mma_async bf16", argTypes,
          resultType, loc,
          {g.n / hopper::TileN, tilesOf(g.rows, hopper::TileM), 1,
           hopper::Threads, hopper::SmemBytes},
          [&](OpBuilder &b, gpu::LaunchOp launch, ArrayRef<Value> buf,
              Value out) {
            WgmmaEmitter k{{{b, loc}}, g, buf[0], buf[1], buf[2], out};
            k.emit(launch);
          }),
      {0}, 2);
}
} // namespace

void lowerWgmmaGemm(GroupedMatmulOp op, const WgmmaGemm &g, ModuleOp module,
                    SymbolTable &symbols) {
  SmallVector<Type> argTypes = {op.getLhs().getType(), op.getRhs().getType(),
                                op.getOffsets().getType()};
  func::FuncOp kernel = getOrCreateWgmmaFunction(module, symbols, g, argTypes,
                                                 op.getType(), op.getLoc());
  replaceByGemmCall(op, kernel);
}

} // namespace mlir::moe::kernels
