//===- WgmmaFp8Gemm.cpp - Hopper block-scaled GEMMs on FP8 wgmma ----------===//
//
// Hopper (sm_90a): MXFP8 grouped GEMM on FP8 wgmma with per-block promotion
// -------------------------------------------------------------------------
// Handles moe.grouped_matmul with MX operands lhs !moe.mx<R x K x f8,
// axis = 1>, rhs !moe.mx<E x K x N x f8, axis = 1> (f8 = f8E4M3FN or
// f8E5M2, blocks of 32, E8M0 scales), f32 result, no transpose_rhs, static
// shapes, K % 64 == 0, N % 128 == 0 (R arbitrary). The function takes the
// unpacked parts: (A data [R, K], A scales [R, K/32], B data [E, K, N],
// B scales [E, K/32, N], offsets).
//
// Hopper has no block-scaled MMA, so the kernel stays exact by promotion:
// every 32-wide K slice (one MX block of both operands) is one FP8 wgmma
// (m64n128k32 .f32.e4m3.e4m3, or e5m2) into a fresh f32 accumulator
// (scale-d = 0), and its partial sum P is added to the running f32
// accumulator as
//     acc[r][c] = fma(P[r][c] * 2^sa(r, blk), 2^sb(blk, c), acc[r][c])
// where sa is the lhs row's scale and sb the rhs column's scale of that
// block. Both multiplications by powers of two are exact (unless the
// product leaves the f32 range, as it would in the reference's dequantized
// values too); a NaN scale (0xFF) gives NaN. The tensor core sums the 32
// products of a slice in its own order, so results match the reference to
// f32 rounding, not bit for bit.
//
// Grid, CTA tile (128 x 128, two m64 halves), 128 threads = one warpgroup,
// expert walk and masking, rows in no group, rows >= R: all as the bf16
// wgmma kernel's (WgmmaGemm.cpp).
//
// K loop: stages of 64 K values (2 MX blocks), a ring of 4 shared-memory
// buffers of 18 KiB, two stages loaded ahead, the bf16 kernel's wait /
// fence.proxy.async / bar.sync / refill sequence. A stage slot holds
//   0      A tile, 128 rows x 64 bytes, K-major (as bf16: LBO = 128; SBO =
//          512 = 4 core matrices of 8 rows x 16 bytes along K)
//   8192   B tile, 128 columns x 64 bytes, K-major, same layout (row = N)
//   16384  A scales as f32 2^(e-127): [block j][row] (1 KiB)
//   17408  B scales as f32: [block j][column] (1 KiB)
// Element (r, k) of a tile is at (r/8)*512 + (k/16)*128 + (r%8)*16 + k%16;
// wgmma slice s of half h uses A at 4096 h + 256 s and B at 8192 + 256 s.
// Both operands K-major: the only layout FP8 wgmma accepts (NVVM layouts
// A `row`, B `col`; the transpose bits exist only for 16-bit types).
//   A: cp.async, 16 bytes per copy (4 per thread per stage): chunk
//     (row 8 (4i + t/32) + t%8, K chunk (t/8)%4), so a warp fills 512
//     contiguous bytes.
//   B: the rhs is [K, N] with N contiguous, so it is transposed while
//     copied (cp.async cannot transpose): thread t takes 4 x 4 byte blocks
//     (K rows 4 (t/32) + 16 i .. +3, N columns 4 (t%32) .. +3), i = 0..3:
//     four 32-bit global loads (a warp reads 128 contiguous bytes of each
//     K row: coalesced), a byte transpose in registers, four 32-bit shared
//     stores (column n + c, 4 consecutive K bytes). These are synchronous
//     loads issued two stages ahead; the generic-proxy stores are made
//     visible to wgmma by the fence.proxy.async + bar.sync that precede the
//     stage's MMAs.
//   Scales: thread t loads row m0 + t's (clamped to R-1) and column
//     n0 + t's two E8M0 scales of the stage and stores them converted to
//     f32 (e = 0 -> 2^-127, e = 255 -> NaN).
//
// Per iteration, for slice s = 0, 1 and half h = 0, 1: wgmma.fence, the
// wgmma into a fresh accumulator, commit, wait_group 0, then the promotion
// of its 64 registers (fragment as the bf16 kernel's: register 4 j + 2 hh +
// c is row 16 w + l/4 + 8 hh, column 8 j + 2 (l%4) + c of the half); the
// thread reads its 2 row scales and 32 column scales from the slot. Every
// MMA is complete before the next barrier, so the ring discipline of the
// bf16 kernel holds a fortiori.
//
// Performance: the tensor core idles while a partial is promoted (one
// 64-register partial in flight; two would not fit the register file next
// to the 128 running-accumulator registers). Correctness first.
//
// Checked on an H200 by scripts/gpu-check.sh (test/Integration/GPU).
//
// Blockwise FP8 operands (1 x 128 and 128 x 128 tiles) take the TMA
// kernel's FP8 form instead (TmaGemmMainloop.cpp, lowerBlockwiseTmaGemm):
// lowerToFp8Wgmma routes them there.
//
//===----------------------------------------------------------------------===//

#include "HopperBuilder.h"
#include "Kernels.h"

using namespace mlir;
using namespace mlir::moe;

namespace mlir::moe::kernels {

namespace fp8wgmma {
constexpr int64_t MmaK = hopper::F8MmaK;
constexpr int64_t BlockwiseTile = 128;   // blockwise FP8 tiles (and stages)
constexpr int64_t Stages = 4, Ahead = 2; // ring depth, stages ahead
constexpr int64_t LBO = 128;             // next core matrix along K
} // namespace fp8wgmma

using namespace fp8wgmma;

namespace {

/// One block-scaled grouped GEMM shape the FP8 wgmma kernels handle: MXFP8
/// (E8M0 scales per 32 of K; this file's kernel) or blockwise FP8 (f32
/// scales per 1 x 128 lhs and 128 x 128 rhs tile; the TMA kernel's).
struct WgmmaMxGemm {
  int64_t rows, k, n, experts;
  Type lhsElt, rhsElt, offsetElt;
  bool blockwise = false;

  /// K values summed by the tensor core between promotions.
  int64_t promoteK() const { return MXBlock; }
  /// K values per stage: 2 MX blocks.
  int64_t tileK() const { return 64; }
  int64_t blocks() const { return tileK() / promoteK(); }
  int64_t sbo() const { return tileK() / 16 * 128; }
  int64_t offB() const { return hopper::TileM * tileK(); }
  int64_t offSA() const { return offB() + hopper::TileN * tileK(); }
  int64_t offSB() const { return offSA() + blocks() * hopper::TileM * 4; }
  int64_t stageBytes() const { return offSB() + blocks() * hopper::TileN * 4; }
  int64_t smemBytes() const { return Stages * stageBytes(); }

  std::string name() const {
    return llvm::formatv("moe_wgmma_mx_gmm_{0}x{1}x{2}_e{3}_{4}_{5}_{6}", rows,
                         k, n, experts, elementName(lhsElt),
                         elementName(rhsElt), elementName(offsetElt))
        .str();
  }
};

/// The shapes both scalings need: 2-d lhs [R, K], 3-d rhs, a static f32
/// result, integer offsets [E + 1].
std::optional<WgmmaMxGemm>
matchShapes(GroupedMatmulOp op, ArrayRef<int64_t> lhs, ArrayRef<int64_t> rhs,
            Type lhsElt, Type rhsElt, int64_t kMultiple, int64_t nMultiple,
            WhyNot why = nullptr) {
  auto offsets = dyn_cast<RankedTensorType>(op.getOffsets().getType());
  RankedTensorType result = op.getType();
  bool t = op.getTransposeRhs();
  if (!offsets || lhs.size() != 2 || rhs.size() != 3 || result.getRank() != 2 ||
      offsets.getRank() != 1 || !isMXFP8(lhsElt) || !isMXFP8(rhsElt) ||
      !result.getElementType().isF32() || !result.hasStaticShape() ||
      !offsets.hasStaticShape() || !offsets.getElementType().isInteger() ||
      ShapedType::isDynamicShape(lhs) || ShapedType::isDynamicShape(rhs))
    return noKernel(why, "not [R, K] x [E, K, N] FP8 operands of static "
                         "shapes with an f32 result");
  int64_t rows = lhs[0], k = lhs[1];
  int64_t experts = rhs[0], n = rhs[t ? 1 : 2];
  if (rows < 1 || experts < 1 || rhs[t ? 2 : 1] != k ||
      offsets.getDimSize(0) != experts + 1 || result.getDimSize(0) != rows ||
      result.getDimSize(1) != n)
    return noKernel(why, "mismatched shapes");
  if (k < kMultiple || k % kMultiple)
    return noKernel(why, "K = {0} is not a multiple of {1}", k, kMultiple);
  if (n < nMultiple || n % nMultiple)
    return noKernel(why, "N = {0} is not a multiple of {1}", n, nMultiple);
  return WgmmaMxGemm{
      rows, k, n, experts, lhsElt, rhsElt, offsets.getElementType()};
}

std::optional<WgmmaMxGemm> matchWgmmaMxGemm(GroupedMatmulOp op,
                                            WhyNot why = nullptr) {
  if (op->getParentOfType<ExpertsOp>())
    return noKernel(why, "inside a moe.experts region (not grouped)");
  if (auto lhs = dyn_cast<FP8BlockTensorType>(op.getLhs().getType())) {
    auto rhs = dyn_cast<FP8BlockTensorType>(op.getRhs().getType());
    if (!rhs || lhs.getBlock() != ArrayRef<int64_t>{1, BlockwiseTile} ||
        rhs.getBlock() != ArrayRef<int64_t>{1, BlockwiseTile, BlockwiseTile})
      return noKernel(why, "not 1 x {0} lhs and {0} x {0} rhs tiles",
                      BlockwiseTile);
    // K and N multiples of 64 (the byte transpose's tile; rows of 16-byte
    // multiples for the copy engine): a partial last stage of K reads zeros,
    // a partial last column tile stores its first columns only.
    std::optional<WgmmaMxGemm> g = matchShapes(
        op, lhs.getShape(), rhs.getShape(), lhs.getElementType(),
        rhs.getElementType(), BlockwiseTile / 2, BlockwiseTile / 2, why);
    // The forward's rhs is transposed first (FP8 wgmma reads K-major
    // operands only).
    if (g && !op.getTransposeRhs() &&
        !transposesBytes(
            cast<BlockScaledType>(op.getRhs().getType()).getDataType()))
      return noKernel(why, "the rhs cannot be transposed to K-major (FP8 "
                           "wgmma reads K-major operands only)");
    if (g)
      g->blockwise = true;
    return g;
  }
  auto lhs = dyn_cast<MXTensorType>(op.getLhs().getType());
  auto rhs = dyn_cast<MXTensorType>(op.getRhs().getType());
  if (op.getTransposeRhs() || !lhs || !rhs || lhs.getAxis() != 1 ||
      rhs.getAxis() != 1 || lhs.getBlockSize() != MXBlock ||
      rhs.getBlockSize() != MXBlock)
    return noKernel(why,
                    "not MX operands in blocks of {0} along K, the rhs "
                    "not transposed",
                    MXBlock);
  return matchShapes(op, lhs.getShape(), rhs.getShape(), lhs.getElementType(),
                     rhs.getElementType(), 64, hopper::TileN, why);
}

/// Emits the body of the FP8 wgmma grouped GEMM's gpu.launch.
struct WgmmaMxEmitter : HopperBuilder {
  const WgmmaMxGemm &g;
  // Buffers: A data [R, K], A scales [R, K/32], B data [E, K, N], B scales
  // [E, K/32, N] (E8M0), offsets [E+1], result [R, N].
  Value a, aScales, w, wScales, offsets, out;
  Value tid{}, m0{}, n0{}, aGlobal{}, wGlobal{};
  // Per thread: byte offsets (index) of its accumulator rows' scales within
  // a block's A scales ([hf][hh]) and of its columns' within B's ([j][c]).
  SmallVector<Value> rowScaleOff{}, colScaleOff{};

  Value shl(Value x, int64_t s) {
    return arith::ShLIOp::create(b, loc, x, int32(s));
  }
  /// An E8M0 scale (i8 bits) as the f32 2^(e-127); 0 -> 2^-127
  /// (subnormal), 255 -> NaN.
  Value scaleToF32(Value bits) {
    Value e = arith::ExtUIOp::create(b, loc, i32(), bits);
    Value v = shl(e, 23);
    v = select(cmp(P::eq, e, int32(0)), int32(0x00400000), v);
    v = select(cmp(P::eq, e, int32(255)), int32(0x7FC00000), v);
    return arith::BitcastOp::create(b, loc, b.getF32Type(), v);
  }
  /// A scale as the f32 factor it stands for.
  Value loadScale(Value scales, ValueRange at) {
    return scaleToF32(loadBits(scales, at));
  }

  /// 16-byte chunks of a K-major tile of 128 rows (A):
  /// row `row0 + r` of the global [., K] matrix at `global` (clamped to
  /// `rowsLast`) into the tile at `dst`, chunk (row r, K chunk c) at
  /// (r/8) SBO + c LBO + (r%8) 16. Thread t's copy i: chunk (t/8) % cpr of
  /// row 8 ((t/8)/cpr + (16/cpr) i) + t%8 (a warp fills 512 contiguous
  /// bytes).
  void copyKMajor(Value dst, Value global, Value row0, Value rowsLast,
                  Value k0) {
    int64_t cpr = g.tileK() / 16; // chunks per row
    Value lane8 = rem(tid, 8);
    Value chunk = rem(div(tid, 8), cpr);
    Value group0 = div(div(tid, 8), cpr);
    Value col = add(k0, mul(chunk, idx(16)));
    Value base = add(dst, add(mul(chunk, idx(LBO)), mul(lane8, idx(16))));
    for (int64_t i = 0; i < cpr; ++i) {
      Value group = add(group0, idx(16 / cpr * i));
      Value r = add(lane8, mul(group, idx(8)));
      Value grow = rowsLast ? minS(add(row0, r), rowsLast) : add(row0, r);
      Value src = add(mul(grow, idx(g.k)), col);
      copy16(add(base, mul(group, idx(g.sbo()))), global, src);
    }
  }

  /// Stage `kt` (K values [tileK kt, tileK (kt + 1))) of expert `e` into
  /// ring buffer `slot` (layouts in the header of this section).
  void loadStage(Value e, Value kt, Value slot) {
    Value stageBase = mul(slot, idx(g.stageBytes()));
    Value k0 = mul(kt, idx(g.tileK()));
    Value rowsLast = idx(g.rows - 1);
    Value warp = div(tid, 32), lane = rem(tid, 32);
    copyKMajor(stageBase, aGlobal, m0, rowsLast, k0);
    {
      // B: 4 x 4 byte blocks (K rows 4 (t/32) + 16 i + q, N columns
      // 4 (t%32) + c), transposed in registers.
      Value n = mul(lane, idx(4));
      Value kIn = mul(warp, idx(4)); // k % 16
      Value bDst = add(stageBase, add(idx(g.offB()),
                                      add(mul(div(n, 8), idx(g.sbo())),
                                          add(mul(rem(n, 8), idx(16)), kIn))));
      Value bRow0 = add(mul(e, idx(g.k)), add(k0, kIn));
      for (int64_t i = 0; i < g.tileK() / 16; ++i) {
        SmallVector<Value> in;
        for (int64_t q = 0; q < 4; ++q) {
          Value krow = add(bRow0, idx(16 * i + q));
          Value src = add(mul(krow, idx(g.n)), add(n0, n));
          in.push_back(LLVM::LoadOp::create(b, loc, i32(),
                                            globalPtr(wGlobal, src),
                                            /*alignment=*/4));
        }
        SmallVector<Value> words = transposeBytes4x4(in);
        for (int64_t c = 0; c < 4; ++c) {
          Value dst = add(bDst, idx(i * LBO + c * 16));
          LLVM::StoreOp::create(b, loc, words[c], sharedPtrAt(dst),
                                /*alignment=*/4);
        }
      }
    }
    // Scales: row m0 + t (clamped) and column n0 + t, of each block.
    Value safeRow = minS(add(m0, tid), rowsLast);
    for (int64_t j = 0; j < g.blocks(); ++j) {
      Value block = add(mul(kt, idx(g.blocks())), idx(j));
      Value sa = loadScale(aScales, {safeRow, block});
      Value sb = loadScale(wScales, {e, block, add(n0, tid)});
      Value at = mul(add(idx(j * hopper::TileM), tid), idx(4));
      LLVM::StoreOp::create(
          b, loc, sa, sharedPtrAt(add(stageBase, add(idx(g.offSA()), at))),
          /*alignment=*/4);
      LLVM::StoreOp::create(
          b, loc, sb, sharedPtrAt(add(stageBase, add(idx(g.offSB()), at))),
          /*alignment=*/4);
    }
  }

  Value loadF32(Value byteOffset) {
    return LLVM::LoadOp::create(b, loc, b.getF32Type(), sharedPtrAt(byteOffset),
                                /*alignment=*/4);
  }

  SmallVector<Value> kLoop(Value e) {
    int64_t nk = g.k / g.tileK();
    for (int64_t p = 0; p < Ahead; ++p) {
      if (p < nk)
        loadStage(e, idx(p), idx(p));
      NVVM::CpAsyncCommitGroupOp::create(b, loc);
    }
    Value zero = LLVM::ZeroOp::create(b, loc, accType);
    int64_t slices = g.promoteK() / MmaK;
    SmallVector<Value> acc = forLoop(
        0, idx(nk), {zero, zero},
        [&](Value it, ValueRange carried) -> SmallVector<Value> {
          NVVM::CpAsyncWaitGroupOp::create(b, loc, Ahead - 1);
          fenceForAsyncProxy();
          NVVM::Barrier0Op::create(b, loc);
          Value next = add(it, idx(Ahead));
          ifThen(cmp(P::slt, next, idx(nk)),
                 [&] { loadStage(e, next, rem(next, Stages)); });
          NVVM::CpAsyncCommitGroupOp::create(b, loc);

          Value slot = rem(it, Stages);
          Value slotBase = mul(slot, idx(g.stageBytes()));
          Value slotUnits = toI64(mul(slot, idx(g.stageBytes() >> 4)));
          SmallVector<Value> d(carried.begin(), carried.end());
          for (int64_t s = 0; s < g.blocks(); ++s) {
            Value sbBase =
                add(slotBase, idx(g.offSB() + 4 * hopper::TileN * s));
            Value saBase =
                add(slotBase, idx(g.offSA() + 4 * hopper::TileM * s));
            SmallVector<Value> colScale;
            for (Value off : colScaleOff)
              colScale.push_back(loadF32(add(sbBase, off)));
            for (int64_t hf = 0; hf < hopper::TileM / hopper::MmaM; ++hf) {
              SmallVector<Value> aDesc, bDesc;
              for (int64_t sl = 0; sl < slices; ++sl) {
                int64_t kOff = 256 * (s * slices + sl);
                bDesc.push_back(descriptor(slotUnits, g.offB() + kOff));
                aDesc.push_back(descriptor(
                    slotUnits, hf * (hopper::MmaM / 8) * g.sbo() + kOff));
              }
              // A fresh accumulator for every promoted block: the partial
              // to promote (its first wgmma ignores the input, the others
              // add to it).
              Value part = LLVM::UndefOp::create(b, loc, accType);
              NVVM::WgmmaFenceAlignedOp::create(b, loc);
              for (int64_t sl = 0; sl < slices; ++sl)
                part = f8Mma(part, aDesc[sl], bDesc[sl], g.lhsElt, g.rhsElt,
                             /*accumulate=*/sl > 0);
              NVVM::WgmmaGroupSyncAlignedOp::create(b, loc);
              NVVM::WgmmaWaitGroupSyncOp::create(b, loc, 0);
              // Promotion: acc += (P * sa(row)) * sb(col).
              Value rowScale[2];
              for (int64_t hh = 0; hh < 2; ++hh)
                rowScale[hh] = loadF32(add(saBase, rowScaleOff[2 * hf + hh]));
              Value x = d[hf];
              for (int64_t j = 0; j < hopper::TileN / 8; ++j)
                for (int64_t hh = 0; hh < 2; ++hh)
                  for (int64_t c = 0; c < 2; ++c) {
                    int64_t i = 4 * j + 2 * hh + c;
                    Value p = LLVM::ExtractValueOp::create(b, loc, part, i);
                    Value r = LLVM::ExtractValueOp::create(b, loc, x, i);
                    Value ps = arith::MulFOp::create(b, loc, p, rowScale[hh]);
                    r = LLVM::FMAOp::create(b, loc, ps, colScale[2 * j + c], r);
                    x = LLVM::InsertValueOp::create(b, loc, x, r, i);
                  }
              d[hf] = x;
            }
          }
          return d;
        });
    return acc;
  }

  void emit(gpu::LaunchOp launch) {
    tid = launch.getThreadIds().x;
    n0 = mul(launch.getBlockIds().x, idx(hopper::TileN));
    m0 = mul(launch.getBlockIds().y, idx(hopper::TileM));
    setUp(LBO, g.sbo());
    aGlobal = baseAddress(a);
    wGlobal = baseAddress(w);

    Value warp = div(tid, 32), lane = rem(tid, 32);
    Value rowInHalf = add(mul(warp, idx(16)), div(lane, 4));
    Value colInTile = mul(rem(lane, 4), idx(2));
    Value rowBase = add(m0, rowInHalf);
    Value colBase = add(n0, colInTile);
    SmallVector<Value> rows;
    for (int64_t hf = 0; hf < 2; ++hf)
      for (int64_t h = 0; h < 2; ++h) {
        rows.push_back(add(rowBase, idx(hopper::MmaM * hf + 8 * h)));
        rowScaleOff.push_back(
            mul(add(rowInHalf, idx(hopper::MmaM * hf + 8 * h)), idx(4)));
      }
    for (int64_t j = 0; j < hopper::TileN / 8; ++j)
      for (int64_t c = 0; c < 2; ++c)
        colScaleOff.push_back(mul(add(colInTile, idx(8 * j + c)), idx(4)));

    walkGroupedTile(g.experts, offsets, g.rows, m0, rows, out, colBase,
                    /*liveRowsOnly=*/false, [&](Value e) { return kLoop(e); });
  }
};

/// The private function computing one block-scaled grouped GEMM shape on
/// FP8 wgmma: (A data, A scales, B data, B scales, offsets) -> result.
func::FuncOp getOrCreateWgmmaMxFunction(ModuleOp module, SymbolTable &symbols,
                                        const WgmmaMxGemm &g,
                                        ArrayRef<Type> argTypes,
                                        RankedTensorType resultType,
                                        Location loc) {
  return withGroupedArgs(
      getOrCreateKernelCall(
          module, symbols, g.name(), "wgmma.mma_async f8 promoted", argTypes,
          resultType, loc,
          {g.n / hopper::TileN, tilesOf(g.rows, hopper::TileM), 1,
           hopper::Threads, g.smemBytes()},
          [&](OpBuilder &b, gpu::LaunchOp launch, ArrayRef<Value> buf,
              Value out) {
            WgmmaMxEmitter k{{{b, loc}}, g,      buf[0], buf[1],
                             buf[2],     buf[3], buf[4], out};
            k.emit(launch);
          }),
      {0, 1}, 4);
}

} // namespace

bool fitsFp8Wgmma(GroupedMatmulOp op, WhyNot why) {
  return matchWgmmaMxGemm(op, why).has_value();
}

bool lowerToFp8Wgmma(GroupedMatmulOp op, ModuleOp module,
                     SymbolTable &symbols) {
  std::optional<WgmmaMxGemm> mx = matchWgmmaMxGemm(op);
  if (!mx)
    return false;
  if (mx->blockwise) {
    lowerBlockwiseTmaGemm(op, module, symbols);
    return true;
  }
  SmallVector<Type> argTypes = mxGemmArgTypes(op);
  func::FuncOp kernel = getOrCreateWgmmaMxFunction(
      module, symbols, *mx, argTypes, op.getType(), op.getLoc());
  replaceByMXGemmCall(op, kernel);
  return true;
}

} // namespace mlir::moe::kernels
