//===- HopperBuilder.h - the Hopper layer of the builder --------*- C++ -*-===//
//
// The Hopper (sm_90a) layer of the kernel builder: the shared tile shapes of
// the wgmma kernels (namespace hopper), HopperBuilder (swizzled cp.async
// copies, matrix descriptors, wgmma, the cp.async ring, mbarriers, TMA,
// accumulator fragments), and the bf16 operand helpers of the grouped GEMMs.
// The layouts are documented in WgmmaGemm.cpp ("Hopper (sm_90a): bf16
// grouped GEMM on warpgroup MMA").
//
//===----------------------------------------------------------------------===//
#ifndef MOE_CONVERSION_MOETOGPU_KERNELS_HOPPERBUILDER_H
#define MOE_CONVERSION_MOETOGPU_KERNELS_HOPPERBUILDER_H

#include "KernelBuilder.h"

namespace mlir::moe::kernels {

/// The wgmma kernels' tiles, their cp.async ring and its shared memory.
namespace hopper {
constexpr int64_t TileM = 128; // rows per CTA: two m64 MMAs
constexpr int64_t TileN = 128; // columns per CTA = MMA N
constexpr int64_t TileK = 64;  // K per stage
constexpr int64_t MmaM = 64, MmaK = 16;
constexpr int64_t F8MmaK = 32;        // K of one FP8 (E4M3 / E5M2) wgmma
constexpr int64_t Stages = 3;         // shared-memory ring (2 CTAs an SM)
constexpr int64_t Ahead = Stages - 1; // stages loaded ahead
// MMA groups left in flight at the end of an iteration: the buffer refilled
// at iteration it, (it + Ahead) % Stages, was read by the MMAs of
// it + Ahead - Stages, complete once every thread has passed iteration
// it-1's wait (the barrier): Ahead + MmaInFlight <= Stages - 1.
constexpr int64_t MmaInFlight = Stages - 1 - Ahead;
static_assert(Ahead >= 1 && MmaInFlight >= 0, "the ring's schedule");
constexpr int64_t Threads = 128;                  // one warpgroup
constexpr int64_t TileABytes = TileM * TileK * 2; // 16384
constexpr int64_t TileBBytes = TileK * TileN * 2; // 16384
constexpr int64_t StageBytes = TileABytes + TileBBytes;
// The ring and 1 KiB of slack to start it on a 1 KiB boundary (swizzle atoms).
constexpr int64_t SmemBytes = Stages * StageBytes + 1024; // 99328
constexpr int64_t LBO = 8192;          // next 64 MN values (MN-major, swizzled)
constexpr int64_t SBO = 1024;          // next 8 rows (one swizzle atom)
constexpr int64_t AccRegs = TileN / 2; // f32 per thread per MMA half
/// The registers a CTA of `threads` threads holds, which setmaxnreg moves
/// between its warpgroups (an increase past the pool waits forever): every
/// thread starts with 64K / threads rounded down to a multiple of 8 (168 at
/// 384 threads: 64512, not 65536).
constexpr int64_t registerPool(int64_t threads) {
  return 65536 / threads / 8 * 8 * threads;
}

/// What the Hopper wgmma emitters share: global and shared addresses,
} // namespace hopper

/// cp.async copies, shared-memory matrix descriptors, the accumulator type.
struct HopperBuilder : KernelBuilder {
  /// Descriptor of byte 0 of the dynamic shared memory (set by setUp()).
  Value descBase{};
  /// One m64nNk16 f32 accumulator: N/2 f32 per thread (set by setUp()).
  LLVM::LLVMStructType accType{};

  /// A shared pointer to byte `byteOffset` (index) of the dynamic memory.
  /// cp.async of 16 bytes; with `srcBytes` (i32), only that many are read
  /// and the rest of the 16 are zero-filled.
  void copy16(Value dstOffset, Value srcBase, Value srcOffset,
              Value srcBytes = Value()) {
    NVVM::CpAsyncOp::create(b, loc, sharedPtrAt(dstOffset),
                            globalPtr(srcBase, srcOffset), 16,
                            NVVM::LoadCacheModifierKind::CG, srcBytes);
  }
  /// Byte offset of 16-byte chunk `c` of 128-byte row `row` of a tile at
  /// `tileBase`, in the 128-byte swizzled layout (see "Hopper (sm_90a): bf16
  /// grouped GEMM").
  Value swizzledChunk(Value tileBase, Value row, Value c) {
    return add(tileBase, add(mul(row, idx(128)),
                             mul(arith::XOrIOp::create(b, loc, c, rem(row, 8)),
                                 idx(16))));
  }
  /// Copies a K-major 128 x 64 bf16 tile (128 rows of 128 bytes) into the
  /// swizzled layout at `tileBase`: thread `tid` copies chunk tid % 8 of rows
  /// tid / 8 + 16 i. `source(row, k)` is the global byte offset (from
  /// `global`) of the row's 8 values from tile column k.
  void copyKMajorTile(Value tid, Value tileBase, Value global,
                      function_ref<Value(Value, Value)> source) {
    Value c = rem(tid, 8), k = mul(c, idx(8));
    for (int64_t i = 0; i < hopper::TileM * hopper::TileK / 8 / hopper::Threads;
         ++i) {
      Value r = add(div(tid, 8), idx(16 * i));
      copy16(swizzledChunk(tileBase, r, c), global, source(r, k));
    }
  }
  /// Copies an MN-major 64 x 128 bf16 tile (64 rows along the contraction,
  /// 128 MN values each) into the swizzled layout at `tileBase`: columns
  /// [64 q, 64 q + 64) are 64 rows of 128 bytes at 8192 q. Thread `tid`
  /// copies chunk tid % 16 of rows tid / 16 + 8 i. `source(row, column)`
  /// is the global byte offset of the row's 8 values from tile column
  /// `column` and the bytes to read (the rest of the 16 zero-filled; null:
  /// all 16).
  void
  copyMNMajorTile(Value tid, Value tileBase, Value global,
                  function_ref<std::pair<Value, Value>(Value, Value)> source) {
    Value cc = rem(tid, 16);
    Value half = add(tileBase, mul(div(cc, 8), idx(8192)));
    for (int64_t i = 0; i < hopper::TileK / 8; ++i) {
      Value r = add(div(tid, 16), idx(8 * i));
      auto [offset, bytes] = source(r, mul(cc, idx(8)));
      copy16(swizzledChunk(half, r, rem(cc, 8)), global, offset, bytes);
    }
  }
  /// Descriptor of the matrix at byte `offset` of ring buffer `slotUnits`
  /// (the slot's byte offset >> 4, i64).
  Value descriptor(Value slotUnits, int64_t offset) {
    return arith::AddIOp::create(
        b, loc, descBase,
        arith::AddIOp::create(b, loc, slotUnits, int64(offset >> 4)));
  }
  /// The m64nNk16 bf16 MMA on shared-memory descriptors `aDesc`, `bDesc`
  /// (N from accType), accumulating into `d` (or, with `accumulate` false,
  /// overwriting it: `d`'s values are not read).
  Value bf16Mma(Value d, Value aDesc, Value bDesc, NVVM::MMALayout layoutA,
                NVVM::MMALayout layoutB, bool accumulate = true) {
    MLIRContext *ctx = b.getContext();
    int64_t n = 2 * int64_t(accType.getBody().size());
    auto bf16 = NVVM::WGMMATypesAttr::get(ctx, NVVM::WGMMATypes::bf16);
    auto scaleIn = NVVM::WGMMAScaleInAttr::get(ctx, NVVM::WGMMAScaleIn::one);
    return NVVM::WgmmaMmaAsyncOp::create(
        b, loc, accType, d, aDesc, bDesc,
        NVVM::MMAShapeAttr::get(ctx, hopper::MmaM, n, hopper::MmaK), bf16, bf16,
        NVVM::WGMMATypesAttr::get(ctx, NVVM::WGMMATypes::f32),
        NVVM::WGMMAScaleOutAttr::get(ctx, accumulate
                                              ? NVVM::WGMMAScaleOut::one
                                              : NVVM::WGMMAScaleOut::zero),
        scaleIn, scaleIn, NVVM::MMALayoutAttr::get(ctx, layoutA),
        NVVM::MMALayoutAttr::get(ctx, layoutB),
        /*satfinite=*/NVVM::MMAIntOverflowAttr());
  }
  /// The m64nNk16 bf16 MMA with A in registers: `a` is this thread's four
  /// 32-bit registers of the 64 x 16 A fragment (two bf16 each, the lower
  /// column in the low half: thread 32 w + l holds rows 16 w + l / 4 (a[0],
  /// a[2]) and 8 below (a[1], a[3]), columns 2 (l % 4) + {0, 1} (a[0],
  /// a[1]) and 8 further (a[2], a[3])), B at the shared-memory descriptor
  /// `bDesc`; N from `d`'s type. An m64n16 accumulator's fragment, rounded,
  /// is this fragment (fragmentA), so a product computed in registers feeds
  /// the next MMA without a trip through shared memory. NVVM's wgmma op
  /// reads A by descriptor only: this one is PTX inline.
  Value bf16MmaRegA(Value d, ArrayRef<Value> a, Value bDesc,
                    NVVM::MMALayout layoutB, bool accumulate = true) {
    auto type = cast<LLVM::LLVMStructType>(d.getType());
    int64_t m = int64_t(type.getBody().size()); // accumulator registers
    std::string text = llvm::formatv("{{\n.reg .pred p;\nsetp.ne.b32 p, {0}, "
                                     "0;\nwgmma.mma_async.sync.aligned."
                                     "m64n{1}k16.f32.bf16.bf16 {{",
                                     accumulate ? 1 : 0, 2 * m)
                           .str();
    std::string constraints;
    for (int64_t i = 0; i < m; ++i) {
      text += llvm::formatv("{0}${1}", i ? ", " : "", i).str();
      constraints += llvm::formatv("{0}=f", i ? "," : "").str();
    }
    SmallVector<Value> operands;
    if (accumulate)
      for (int64_t i = 0; i < m; ++i) {
        operands.push_back(LLVM::ExtractValueOp::create(b, loc, d, i));
        constraints += llvm::formatv(",{0}", i).str();
      }
    int64_t first = m + int64_t(operands.size());
    text +=
        llvm::formatv("}, {{${0}, ${1}, ${2}, ${3}}, ${4}, p, 1, 1, {5};\n}",
                      first, first + 1, first + 2, first + 3, first + 4,
                      layoutB == NVVM::MMALayout::col ? 0 : 1)
            .str();
    llvm::append_range(operands, a);
    operands.push_back(bDesc);
    constraints += ",r,r,r,r,l";
    return LLVM::InlineAsmOp::create(
               b, loc, type, operands, text, constraints,
               /*has_side_effects=*/true, /*is_align_stack=*/false,
               LLVM::tailcallkind::TailCallKind::None,
               LLVM::AsmDialectAttr::get(b.getContext(),
                                         LLVM::AsmDialect::AD_ATT),
               /*operand_attrs=*/ArrayAttr())
        .getResult(0);
  }
  /// The A fragment (bf16MmaRegA) of the 64 x 16 columns of each contraction
  /// step from an m64nN accumulator's values `v` (f32, rounded to bf16):
  /// step k's four registers are the pairs of v[8 k .. 8 k + 7].
  SmallVector<Value> fragmentA(ArrayRef<Value> v) {
    SmallVector<Value> regs;
    for (size_t i = 0; i + 1 < v.size(); i += 2)
      regs.push_back(LLVM::BitcastOp::create(
          b, loc, b.getI32Type(), pairOf(v[i], v[i + 1], b.getBF16Type())));
    return regs;
  }
  /// The m64nNk32 FP8 MMA (`aElt`, `bElt`: E4M3 or E5M2) on K-major
  /// shared-memory descriptors `aDesc`, `bDesc` (the only layout FP8 wgmma
  /// reads: A `row`, B `col`), accumulating into `d` or, without
  /// `accumulate`, overwriting it.
  Value f8Mma(Value d, Value aDesc, Value bDesc, Type aElt, Type bElt,
              bool accumulate) {
    MLIRContext *ctx = b.getContext();
    int64_t n = 2 * int64_t(accType.getBody().size());
    auto type = [&](Type t) {
      return NVVM::WGMMATypesAttr::get(ctx, isa<Float8E5M2Type>(t)
                                                ? NVVM::WGMMATypes::e5m2
                                                : NVVM::WGMMATypes::e4m3);
    };
    auto scaleIn = NVVM::WGMMAScaleInAttr::get(ctx, NVVM::WGMMAScaleIn::one);
    return NVVM::WgmmaMmaAsyncOp::create(
        b, loc, accType, d, aDesc, bDesc,
        NVVM::MMAShapeAttr::get(ctx, hopper::MmaM, n, hopper::F8MmaK),
        type(aElt), type(bElt),
        NVVM::WGMMATypesAttr::get(ctx, NVVM::WGMMATypes::f32),
        NVVM::WGMMAScaleOutAttr::get(ctx, accumulate
                                              ? NVVM::WGMMAScaleOut::one
                                              : NVVM::WGMMAScaleOut::zero),
        scaleIn, scaleIn, NVVM::MMALayoutAttr::get(ctx, NVVM::MMALayout::row),
        NVVM::MMALayoutAttr::get(ctx, NVVM::MMALayout::col),
        /*satfinite=*/NVVM::MMAIntOverflowAttr());
  }
  /// The bf16 MMA main loop over `nk` (index) stages of 64 reduction
  /// values through the 3-buffer ring (see "Hopper (sm_90a): bf16 grouped
  /// GEMM" for the schedule): `load(kt, slot)` issues stage kt's cp.asyncs
  /// into ring buffer `slot` (A tile first, then B at hopper::TileABytes, both
  /// in the 128-byte swizzled layouts: setUp(hopper::LBO, hopper::SBO, true));
  /// `layoutA` is `row` for a K-major A tile, `col` for an MN-major one;
  /// `layoutB` `col` for a K-major B tile, `row` for an MN-major one.
  /// Returns the two m64n128 accumulators (zeros when nk is 0).
  SmallVector<Value> pipelinedMma(Value nk,
                                  function_ref<void(Value, Value)> load,
                                  NVVM::MMALayout layoutA,
                                  NVVM::MMALayout layoutB) {
    for (int64_t p = 0; p < hopper::Ahead; ++p) {
      ifThen(cmp(P::slt, idx(p), nk), [&] { load(idx(p), idx(p)); });
      NVVM::CpAsyncCommitGroupOp::create(b, loc);
    }
    Value zero = LLVM::ZeroOp::create(b, loc, accType);
    SmallVector<Value> acc = forLoop(
        0, nk, {zero, zero},
        [&](Value it, ValueRange carried) -> SmallVector<Value> {
          NVVM::CpAsyncWaitGroupOp::create(b, loc, hopper::Ahead - 1);
          fenceForAsyncProxy();
          NVVM::Barrier0Op::create(b, loc);
          Value next = add(it, idx(hopper::Ahead));
          ifThen(cmp(P::slt, next, nk),
                 [&] { load(next, rem(next, hopper::Stages)); });
          NVVM::CpAsyncCommitGroupOp::create(b, loc);

          Value slotUnits =
              toI64(mul(rem(it, hopper::Stages), idx(hopper::StageBytes >> 4)));
          SmallVector<Value> d(carried.begin(), carried.end());
          NVVM::WgmmaFenceAlignedOp::create(b, loc);
          for (int64_t j = 0; j < hopper::TileK / hopper::MmaK; ++j) {
            // MMA j's K rows start 32 bytes into each 128-byte row
            // (K-major) or two 8-row atoms further (MN-major).
            int64_t bAt = hopper::TileABytes +
                          (layoutB == NVVM::MMALayout::row ? 2048 * j : 32 * j);
            Value bDesc = descriptor(slotUnits, bAt);
            for (int64_t h = 0; h < hopper::TileM / hopper::MmaM; ++h) {
              // Half h's rows: 64 K-major rows (8 KiB) further, or the
              // next 64-column block of an MN-major A.
              int64_t aAt = layoutA == NVVM::MMALayout::row
                                ? h * hopper::MmaM * 128 + 32 * j
                                : h * 8192 + 2048 * j;
              d[h] = bf16Mma(d[h], descriptor(slotUnits, aAt), bDesc, layoutA,
                             layoutB);
            }
          }
          NVVM::WgmmaGroupSyncAlignedOp::create(b, loc);
          NVVM::WgmmaWaitGroupSyncOp::create(b, loc, hopper::MmaInFlight);
          return d;
        });
    NVVM::WgmmaWaitGroupSyncOp::create(b, loc, 0);
    return acc;
  }
  Value i32Of(Value index) {
    return arith::IndexCastOp::create(b, loc, i32(), index);
  }
  /// Waits for the phase of parity `parity` (index 0/1) of barrier `bar`.
  void wait(Value bar, Value parity) {
    NVVM::MBarrierTryWaitParityOp::create(b, loc, bar, i32Of(parity),
                                          int32(WaitTicks));
  }
  /// A bulk tensor copy (TMA) of the box at (`x`, `y`) of the tensor map at
  /// device address `map` (i64) into shared memory `dst`, completing on
  /// mbarrier `bar`.
  void tmaLoad(Value dst, Value map, Value x, Value y, Value bar) {
    tmaLoad(dst, map, {x, y}, bar);
  }
  /// The same at coordinates `at` (index values, innermost first: column,
  /// row[, plane]).
  void tmaLoad(Value dst, Value map, ArrayRef<Value> at, Value bar) {
    SmallVector<Value> coords;
    for (Value v : at)
      coords.push_back(i32Of(v));
    Value desc = LLVM::IntToPtrOp::create(
        b, loc, LLVM::LLVMPointerType::get(b.getContext()), map);
    // The CTA's own shared memory, addressed as shared::cluster.
    dst = LLVM::AddrSpaceCastOp::create(
        b, loc, LLVM::LLVMPointerType::get(b.getContext(), 7), dst);
    NVVM::CpAsyncBulkTensorGlobalToSharedClusterOp::create(
        b, loc, dst, desc, coords, bar, ValueRange{}, Value(), Value(),
        NVVM::TMALoadMode::TILE, /*isCTAOnly=*/false, NVVM::CTAGroupKindAttr(),
        Value());
  }

  /// Register `i` of an accumulator (the NVVM op's struct of f32).
  Value accAt(Value acc, int64_t i) {
    return LLVM::ExtractValueOp::create(b, loc, acc, ArrayRef<int64_t>{i});
  }
  /// Two f32 values as a vector<2 x elt> (rounded to `elt`).
  Value pairOf(Value x, Value y, Type elt) {
    if (!elt.isF32()) {
      x = arith::TruncFOp::create(b, loc, elt, x);
      y = arith::TruncFOp::create(b, loc, elt, y);
    }
    return vectorOf({x, y});
  }
  /// Stores two f32 values as a pair of `elt` at element `at` (index) of
  /// the row-major buffer whose base address is `base`.
  void storePair(Value base, Value at, Value x, Value y, Type elt) {
    int64_t bytes = 2 * elt.getIntOrFloatBitWidth() / 8;
    LLVM::StoreOp::create(b, loc, pairOf(x, y, elt),
                          globalPtr(base, mul(at, idx(bytes / 2))), bytes);
  }
  /// The epilogue of the tile-per-CTA wgmma kernels for one expert: this
  /// thread's accumulator rows `rows` (rows[q]: half q / 2 of the two
  /// m64nNk16 accumulators `acc`, fragment row q % 2) that lie in [lo, hi)
  /// are stored to `out` at columns colBase + 8 j + c. Returns, per row,
  /// whether a group covered it (`covered[q]`, or this one).
  SmallVector<Value> storeRowsInGroup(ArrayRef<Value> acc, ArrayRef<Value> rows,
                                      Value lo, Value hi, Value out,
                                      Value colBase, ValueRange covered) {
    int64_t columns = 2 * int64_t(accType.getBody().size());
    SmallVector<Value> result;
    for (int64_t q = 0; q < int64_t(rows.size()); ++q) {
      Value r = rows[q];
      Value inGroup = land(cmp(P::sle, lo, r), cmp(P::slt, r, hi));
      int64_t hf = q / 2, h = q % 2;
      ifThen(inGroup, [&] {
        for (int64_t j = 0; j < columns / 8; ++j)
          for (int64_t c = 0; c < 2; ++c) {
            Value v = accAt(acc[hf], 4 * j + 2 * h + c);
            memref::StoreOp::create(
                b, loc, v, out, ValueRange{r, add(colBase, idx(8 * j + c))});
          }
      });
      result.push_back(lor(covered[q], inGroup));
    }
    return result;
  }
  /// Stores `zero` to the rows of `rows` (as storeRowsInGroup's) that no
  /// group covered and that lie before `end`.
  void zeroUncoveredRows(Value zero, ArrayRef<Value> rows, ValueRange covered,
                         Value end, Value out, Value colBase) {
    int64_t columns = 2 * int64_t(accType.getBody().size());
    for (int64_t q = 0; q < int64_t(rows.size()); ++q) {
      Value uncovered =
          land(arith::XOrIOp::create(b, loc, covered[q], boolean(true)),
               cmp(P::slt, rows[q], end));
      ifThen(uncovered, [&] {
        for (int64_t j = 0; j < columns / 8; ++j)
          for (int64_t c = 0; c < 2; ++c)
            memref::StoreOp::create(
                b, loc, zero, out,
                ValueRange{rows[q], add(colBase, idx(8 * j + c))});
      });
    }
  }
  /// The expert walk of a tile-per-CTA wgmma kernel whose CTA owns rows
  /// [m0, m0 + 128) of the grouped result `out` ([rowCount, N]; this
  /// thread's accumulator rows `rows`, its first column `colBase`): for each
  /// expert meeting the tile, `kLoop(e)` (the two m64 accumulators), its
  /// group's rows stored and a barrier (the next expert's loads overwrite
  /// the ring); then the tile's rows in no group are zeroed (only those
  /// before offsets[E] with `liveRowsOnly`, LiveRows.h).
  void walkGroupedTile(int64_t experts, Value offsets, int64_t rowCount,
                       Value m0, ArrayRef<Value> rows, Value out, Value colBase,
                       bool liveRowsOnly,
                       function_ref<SmallVector<Value>(Value)> kLoop) {
    Value rowsEnd = idx(rowCount);
    Value tileEnd = add(m0, idx(hopper::TileM));
    SmallVector<Value> noneCovered(rows.size(), boolean(false));
    SmallVector<Value> covered = forEachExpertMeetingTile(
        idx(experts), noneCovered, offsets, rowCount, m0, tileEnd,
        [&](Value e, Value lo, Value hi,
            ValueRange carried) -> SmallVector<Value> {
          SmallVector<Value> acc = kLoop(e);
          SmallVector<Value> result =
              storeRowsInGroup(acc, rows, lo, hi, out, colBase, carried);
          NVVM::Barrier0Op::create(b, loc);
          return result;
        });
    Value zero = arith::ConstantOp::create(b, loc, b.getF32FloatAttr(0.0));
    Value zeroEnd = liveRowsOnly ? groupsEnd(offsets, rowCount) : rowsEnd;
    zeroUncoveredRows(zero, rows, covered, zeroEnd, out, colBase);
  }
  /// The dynamic shared memory, the descriptor base for leading / stride
  /// byte offsets `lbo` / `sbo`, and the m64n128 accumulator type.
  void setUp(int64_t lbo, int64_t sbo, bool swizzled = false,
             int64_t accRegs = hopper::AccRegs) {
    setUpSharedMemory();
    // The swizzle pattern is a function of the address bits: its 1024-byte
    // atoms start on 1024-byte boundaries (the launch asks for 1 KiB more).
    if (swizzled)
      smemBase = arith::AndIOp::create(
          b, loc, arith::AddIOp::create(b, loc, smemBase, int64(1023)),
          int64(~int64_t(1023)));
    // Start address >> 4 (the dynamic shared memory lies below 256 KiB, so it
    // fits the 14-bit field and adding offsets >> 4 never carries out),
    // LBO >> 4 at bit 16, SBO >> 4 at bit 32, layout type at bits 62-63
    // (0: interleaved, no swizzle; 1: 128-byte swizzle), base offset 0.
    descBase = arith::OrIOp::create(
        b, loc, arith::ShRUIOp::create(b, loc, smemBase, int64(4)),
        int64((lbo >> 4) << 16 | (sbo >> 4) << 32 |
              int64_t(swizzled ? 1 : 0) << 62));
    accType = LLVM::LLVMStructType::getLiteral(
        b.getContext(), SmallVector<Type>(accRegs, b.getF32Type()));
  }
};

/// Whether `v` can feed a Hopper bf16 kernel: bf16 already, MX with its
/// blocks along `axis` (the contraction), or blockwise FP8 with power-of-two
/// scales, which dequantize exactly (a value q * 2^e of an E4M3 or E5M2 q has
/// at most 4 significant bits; bf16 holds it unless it lies below 2^-133,
/// which only a tile whose largest magnitude is below 2^-115 (E4M3) or
/// 2^-102 (E5M2) can give); if not, says why, naming the operand `name`.
bool bf16OrMXAlong(Value v, unsigned axis, StringRef name, WhyNot why);

/// `d` rounded up to a multiple of 8: bf16 rows of a multiple of 16 bytes,
/// which the copy engine reads.
inline int64_t rowsOf16Bytes(int64_t d) { return (d + 7) / 8 * 8; }

/// `v` (a static tensor) padded with zeros at the end of each dim to
/// `shape`; `v` itself when it has that shape. The ops made are added to
/// `created`.
Value padWithZeros(OpBuilder &b, Location loc, Value v, ArrayRef<int64_t> shape,
                   SmallVectorImpl<Operation *> &created);

/// The leading `shape` of `v` (a static tensor); `v` itself when it has that
/// shape.
Value leadingPart(OpBuilder &b, Location loc, Value v, ArrayRef<int64_t> shape);

/// `v` as bf16: block-scaled operands dequantized (the new op is added to
/// `created`), bf16 ones as they are.
Value toBF16(OpBuilder &b, Location loc, Value v,
             SmallVectorImpl<Operation *> &created);

/// The operand types of a grouped GEMM a Hopper bf16 kernel can take: static
/// bf16 lhs (rank 2) and rhs (rank `rhsRank`), an f32 result of rank
/// `resultRank`, integer offsets; outside moe.experts regions.
struct Bf16GemmTypes {
  RankedTensorType lhs, rhs, offsets, result;
};
std::optional<Bf16GemmTypes> bf16GemmTypes(Operation *op, Value lhsValue,
                                           Value rhsValue, Value offsetsValue,
                                           int64_t rhsRank, int64_t resultRank,
                                           WhyNot why);

/// The declaration of libmoert's moertTensorMap2D (moert/Gpu.h), which the
/// TMA kernels' host code calls to encode their tensor maps.
func::FuncOp getOrCreateTensorMapDecl(ModuleOp module, SymbolTable &symbols);

/// The declaration of libmoert's moertTensorMap3D (moert/Gpu.h): the maps
/// of [E][rows][columns] arrays whose boxes stay within one plane.
func::FuncOp getOrCreateTensorMap3DDecl(ModuleOp module, SymbolTable &symbols);

} // namespace mlir::moe::kernels

#endif
