//===- WgmmaWgrad.cpp - Hopper grouped weight gradients -------------------===//
//
// Hopper (sm_90a): bf16 grouped weight-gradient GEMM on wgmma
// -----------------------------------------------------------
// Handles moe.grouped_matmul_wgrad with bf16 lhs [R, K] and rhs [R, N], f32
// result [E, K, N] (stored in bf16 by the TMA kernel when every user rounds
// it to bf16), static shapes, K % 128 == 0, N % 128 == 0 (R arbitrary):
// result[e] = lhs[lo:hi]^T @ rhs[lo:hi] over expert e's rows [lo, hi)
// (offsets clamped to [0, R]).
//
// Grid (N/128, K/128, E), 128 threads = one warpgroup. CTA (bx, by, e) owns
// result[e][k0 : k0+128][n0 : n0+128], k0 = 128 by, n0 = 128 bx: the MMA's M
// is the lhs's K, its N the rhs's N, and its reduction runs over the
// expert's rows, 64 per stage, through the forward kernel's 3-buffer
// cp.async ring and schedule (pipelinedMma). The number of stages,
// ceil((hi - lo) / 64), differs by expert; an empty group stores zeros.
//
// Tiles (the forward kernel's 128-byte swizzled layouts): both are MN-major,
// the contraction running down their 64 rows. A (64 rows x 128 K values:
// the lhs's rows are K-contiguous) is read by wgmma as a transposed A (NVVM
// layout `col`, allowed for 16-bit types), half h of the M = K values at
// byte 8192 h; B (64 rows x 128 N values) as the forward kernel's MN-major
// B. MMA j of half h: A at 8192 h + 2048 j, B at 2048 j. Thread t copies
// chunk t%16 of rows t/16 + 8 i of both (i = 0..7).
// Rows at or past hi are zero in both tiles (cp.async with source size 0,
// from a clamped address): rows of the next expert add nothing, and
// whatever they hold (even Inf or NaN) cannot leak in.
//
// Numerics: bf16 products accumulated in f32 by the tensor core, in its own
// order: results match the reference (f32 in row order) to f32 rounding.
//
//===----------------------------------------------------------------------===//

#include "HopperBuilder.h"
#include "Kernels.h"
#include "TmaGemm.h"
#include "moe/Dialect/MoE/Transforms/GemmRecipe.h"

using namespace mlir;
using namespace mlir::moe;

namespace mlir::moe::kernels {

namespace {

/// One bf16 grouped weight-gradient shape the wgmma kernel handles.
struct WgmmaWgrad {
  int64_t rows, k, n, experts;
  Type offsetElt;
  /// The TMA, warp-specialized kernel (N % 256 == 0 or N > 256, R >= 64;
  /// or partial tiles: K % 128 or N % 128), else the cp.async one.
  bool tma = false;
  /// The TMA kernel stores the result in bf16 (every user rounds it so).
  bool outBf16 = false;
  std::string name() const {
    return llvm::formatv("moe_wgmma_wgrad_{0}x{1}x{2}_e{3}_bf16_{4}{5}{6}",
                         rows, k, n, experts, elementName(offsetElt),
                         tma ? "_tma" : "", outBf16 ? "_obf16" : "")
        .str();
  }
};

std::optional<WgmmaWgrad> matchWgmmaWgrad(GroupedMatmulWgradOp op, WhyNot why) {
  std::optional<Bf16GemmTypes> types = bf16GemmTypes(
      op, op.getLhs(), op.getRhs(), op.getOffsets(), /*rhsRank=*/2,
      /*resultRank=*/3, why);
  if (!types)
    return std::nullopt;
  auto [lhs, rhs, offsets, result] = *types;
  int64_t rows = lhs.getDimSize(0), k = lhs.getDimSize(1),
          n = rhs.getDimSize(1), experts = result.getDimSize(0);
  if (rows < 1 || experts < 1)
    return noKernel(why, "no rows or no experts");
  if (isMatrixVector(k, n))
    return std::nullopt;
  // The copy engine reads rows of multiples of 16 bytes.
  if (k % 8 || n % 8)
    return noKernel(why,
                    "K = {0} (the lhs's columns) or N = {1} is not a multiple "
                    "of 8 (the TMA kernel's bf16 rows are multiples of 16 "
                    "bytes)",
                    k, n);
  // The cp.async kernel takes whole tiles only; the TMA kernel partial ones.
  bool wholeTiles = k % hopper::TileM == 0 && n % hopper::TileN == 0;
  return WgmmaWgrad{rows,
                    k,
                    n,
                    experts,
                    offsets.getElementType(),
                    /*tma=*/!wholeTiles || tmaKernelTakes(rows, n, tma::TileK)};
}

/// Emits the body of the wgmma weight-gradient kernel's gpu.launch.
struct WgmmaWgradEmitter : HopperBuilder {
  const WgmmaWgrad &g;
  // Buffers: lhs [R, K] bf16, rhs [R, N] bf16, offsets [E+1], result
  // [E, K, N] f32.
  Value x, dy, offsets, out;
  Value tid{}, k0{}, n0{}, xGlobal{}, dyGlobal{};

  /// Stage `st` (rows [lo + 64 st, lo + 64 st + 64), those below `hi`) into
  /// ring buffer `slot`.
  void loadStage(Value lo, Value hi, Value st, Value slot) {
    Value stageBase = mul(slot, idx(hopper::StageBytes));
    Value rowsLast = idx(g.rows - 1);
    // Row r of both tiles is row lo + 64 st + r; rows at or past hi are
    // zero (read from a clamped address with source size 0).
    auto source = [&](int64_t width, Value col0) {
      return [&, width, col0](Value r, Value col) {
        Value row = add(lo, add(mul(st, idx(hopper::TileK)), r));
        Value bytes = select(cmp(P::slt, row, hi), int32(16), int32(0));
        Value at = minS(row, rowsLast);
        return std::make_pair(
            mul(add(mul(at, idx(width)), add(col0, col)), idx(2)), bytes);
      };
    };
    copyMNMajorTile(tid, stageBase, xGlobal, source(g.k, k0));
    copyMNMajorTile(tid, add(stageBase, idx(hopper::TileABytes)), dyGlobal,
                    source(g.n, n0));
  }

  void emit(gpu::LaunchOp launch) {
    tid = launch.getThreadIds().x;
    n0 = mul(launch.getBlockIds().x, idx(hopper::TileN));
    k0 = mul(launch.getBlockIds().y, idx(hopper::TileM));
    Value e = launch.getBlockIds().z;
    setUp(hopper::LBO, hopper::SBO, /*swizzled=*/true);
    xGlobal = baseAddress(x);
    dyGlobal = baseAddress(dy);

    Value lo, hi;
    std::tie(lo, hi) = groupRows(offsets, e, g.rows);
    Value stages =
        div(add(arith::SubIOp::create(b, loc, hi, lo), idx(hopper::TileK - 1)),
            hopper::TileK);
    SmallVector<Value> acc = pipelinedMma(
        stages, [&](Value st, Value slot) { loadStage(lo, hi, st, slot); },
        NVVM::MMALayout::col, NVVM::MMALayout::row);

    // Thread t's accumulator element 4 j + 2 h + c of half hf is
    // result[e][k0 + 64 hf + 16 w + l/4 + 8 h][n0 + 8 j + 2 (l%4) + c].
    Value warp = div(tid, 32), lane = rem(tid, 32);
    Value rowBase = add(k0, add(mul(warp, idx(16)), div(lane, 4)));
    Value colBase = add(n0, mul(rem(lane, 4), idx(2)));
    for (int64_t hf = 0; hf < 2; ++hf)
      for (int64_t h = 0; h < 2; ++h) {
        Value r = add(rowBase, idx(hopper::MmaM * hf + 8 * h));
        for (int64_t j = 0; j < hopper::TileN / 8; ++j)
          for (int64_t c = 0; c < 2; ++c) {
            Value v = LLVM::ExtractValueOp::create(
                b, loc, acc[hf], ArrayRef<int64_t>{4 * j + 2 * h + c});
            memref::StoreOp::create(
                b, loc, v, out, ValueRange{e, r, add(colBase, idx(8 * j + c))});
          }
      }
  }
};

/// The private function computing one bf16 weight-gradient shape on wgmma:
/// (lhs, rhs, offsets) -> result.
func::FuncOp
getOrCreateWgmmaWgradFunction(ModuleOp module, SymbolTable &symbols,
                              const WgmmaWgrad &g, ArrayRef<Type> argTypes,
                              RankedTensorType resultType, Location loc) {
  if (g.tma) {
    TmaGemm t{g.rows,
              g.k,
              g.n,
              g.experts,
              /*rhsTransposed=*/false,
              /*liveRowsOnly=*/false,
              /*wgrad=*/true,
              /*swiglu=*/std::nullopt};
    t.outBf16 = g.outBf16;
    return getOrCreateWgmmaTmaFunction(module, symbols, t, g.name(), argTypes,
                                       ArrayRef(resultType), loc);
  }
  return withGroupedArgs(
      getOrCreateKernelCall(
          module, symbols, g.name(), "wgmma.mma_async bf16 weight gradient",
          argTypes, resultType, loc,
          {g.n / hopper::TileN, g.k / hopper::TileM, g.experts, hopper::Threads,
           hopper::SmemBytes},
          [&](OpBuilder &b, gpu::LaunchOp launch, ArrayRef<Value> buf,
              Value out) {
            WgmmaWgradEmitter k{{{b, loc}}, g, buf[0], buf[1], buf[2], out};
            k.emit(launch);
          }),
      {0, 1}, 2);
}

} // namespace

/// A weight gradient in the form the wgmma kernel takes: MX operands whose
/// blocks run along the rows (the contraction; `axis = 0`) dequantized to
/// bf16, exactly as for the forward GEMM (see rewriteForWgmma). Returns the
/// kernel's call, or nullptr (nothing changed).
Operation *lowerWgradToWgmma(GroupedMatmulWgradOp op, ModuleOp module,
                             SymbolTable &symbols, bool fp8Wgmma,
                             KernelReport *report) {
  // Why blockwise FP8 operands are not on the FP8 wgmma kernel (then they
  // take the bf16 one through exact round trips: slower).
  std::string whyNotFp8;
  if (fp8Wgmma)
    if (Operation *call = lowerBlockwiseTmaWgrad(op, module, symbols,
                                                 report ? &whyNotFp8 : nullptr))
      return call;
  std::string why;
  WhyNot whyNot = report ? &why : nullptr;
  if (!bf16OrMXAlong(op.getLhs(), 0, "lhs", whyNot) ||
      !bf16OrMXAlong(op.getRhs(), 0, "rhs", whyNot)) {
    if (report)
      report->generic(op, why);
    return nullptr;
  }
  OpBuilder b(op);
  Location loc = op.getLoc();
  SmallVector<Operation *> created;
  Value x = toBF16(b, loc, op.getLhs(), created),
        dy = toBF16(b, loc, op.getRhs(), created);
  // K or N not a multiple of 8 (rows the copy engine cannot read): the
  // operands padded with zeros, the result's leading [E, K, N] taken.
  RankedTensorType resultType = op.getType();
  ArrayRef<int64_t> shape = resultType.getShape();
  SmallVector<int64_t> padded = {shape[0], rowsOf16Bytes(shape[1]),
                                 rowsOf16Bytes(shape[2])};
  if (padded != shape && !isMatrixVector(shape[1], shape[2]) &&
      resultType.hasStaticShape()) {
    for (auto [v, cols] : {std::pair(&x, padded[1]), std::pair(&dy, padded[2])})
      if (auto t = dyn_cast<RankedTensorType>(v->getType());
          t && t.hasStaticShape())
        *v = padWithZeros(b, loc, *v, {t.getDimSize(0), cols}, created);
    resultType = resultType.clone(padded);
  }
  auto bf16Op =
      GroupedMatmulWgradOp::create(b, loc, resultType, x, dy, op.getOffsets());
  std::optional<WgmmaWgrad> w = matchWgmmaWgrad(bf16Op, whyNot);
  if (!w) {
    bf16Op.erase();
    for (Operation *c : llvm::reverse(created))
      c->erase();
    if (report)
      report->generic(op, why);
    return nullptr;
  }
  if (report && !whyNotFp8.empty())
    report->slower(op, kOffFp8Wgmma, whyNotFp8);
  if (report && !w->tma) {
    tmaKernelTakes(w->rows, w->n, tma::TileK, &why);
    report->slower(op, "the cp.async wgmma kernel, not the TMA one", why);
  }
  SmallVector<Type> argTypes = {x.getType(), dy.getType(),
                                op.getOffsets().getType()};
  // A gradient every user rounds to bf16 (a bf16 parameter's) is stored in
  // bf16 by the TMA kernel: the f32 array and the rounding pass go.
  w->outBf16 = w->tma && onlyRoundedToBF16(op.getResult());
  if (w->outBf16)
    resultType = resultType.clone(b.getBF16Type());
  func::FuncOp kernel = getOrCreateWgmmaWgradFunction(
      module, symbols, *w, argTypes, resultType, loc);
  auto call =
      func::CallOp::create(b, loc, kernel, ValueRange{x, dy, op.getOffsets()});
  bf16Op.erase();
  Value result = leadingPart(b, loc, call.getResult(0), shape);
  if (w->outBf16)
    replaceRoundings(op.getResult(), result);
  else
    op.getResult().replaceAllUsesWith(result);
  op.erase();
  return call;
}

} // namespace mlir::moe::kernels
