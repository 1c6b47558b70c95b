//===- Tcgen05BlockScaledGemm.cpp - Blackwell block-scaled GEMM -----------===//
//
// Blackwell (sm_100a): moe.grouped_matmul with MXFP8 operands,
//   lhs !moe.mx<R x K x f8, axis = 1>, rhs !moe.mx<E x K x N x f8, axis = 1>
//   (f8 = f8E4M3FN or f8E5M2, blocks of 32), f32 result, no transpose_rhs,
//   static shapes, K and N multiples of 128 (R arbitrary), on the native
//   block-scaled MMA: tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale
//   with E8M0 scales and one scale per 32 values along K (scale_vec::1X).
//
// ------------------------------------
// Grid (ceil(R/128), N/128), 128 threads (4 warps). CTA (bx, by) owns output
// rows [m0, m0+128) and columns [n0, n0+128), m0 = 128 bx, n0 = 128 by.
//
// Groups: rows of different experts never share an accumulation. The CTA
// walks the experts e = 0..E-1 in order; for every expert whose clamped row
// range [lo, hi) (clamped as the reference does) meets the tile it runs a
// full K loop into a fresh accumulator (first MMA with enable_input_d =
// false) and each thread stores its row only if lo <= row < hi. Rows of
// other experts in the tile also go through the MMA (with expert e's
// weights), but an MMA row depends only on its own A row, so they change
// nothing stored; their results are discarded. Later experts overwrite
// earlier ones, as in the reference (which matters only for malformed,
// overlapping offsets). Rows in no group (rows at or beyond offsets[E], or
// before offsets[0]) are written as zeros at the end. A tile is computed
// once per expert it meets: with the sorted, dispatched rows of an MoE layer
// that is at most E + ceil(R/128) passes over the whole grid.
//
// K loop: stages of 128 K values. Per stage all 128 threads copy
//   - A: 128 rows x 128 bytes, B: 128 columns x 128 bytes (transposed to
//     K-major while copying), into shared memory (layout below);
//   - A's scales (128 rows x 4 blocks) and B's (128 columns x 4 blocks) into
//     shared memory in the layout tcgen05.cp expects (below);
// then fence.proxy.async (generic-proxy writes -> async proxy), bar.sync;
// thread 0 issues tcgen05.cp (scales -> TMEM), four tcgen05.mma (K = 32
// each, scale byte j of the 32-bit scale column for the j-th), and
// tcgen05.commit to an mbarrier; every thread waits on the mbarrier phase
// before the shared memory is overwritten. No pipelining: one stage in
// flight (simple, correct first; TMA and a multi-stage ring come later).
//
// Epilogue: the accumulator (f32, 128 lanes x 128 columns of TMEM) is read
// with tcgen05.ld.32x32b.x32 (warp w reads lanes 32w..32w+31, thread l of
// warp w gets row 32w+l, 32 consecutive columns per load) and stored.
//
// Layouts. They are those of the PTX ISA sections "Shared memory descriptor"
// (canonical layouts), "Instruction descriptor" and "Scale factor A/B
// layout" for .scale_vec::1X; the ISA pages themselves were not at hand, so
// they were taken from code that encodes them: CUTLASS's descriptor bit
// fields and canonical-layout comments (cute/arch/mma_sm100_desc.hpp,
// cute/atom/mma_traits_sm100.hpp), JAX Mosaic GPU's tcgen05 support
// (jax/experimental/mosaic/gpu/tcgen05.py: scaled instruction descriptor,
// scale copies) and MLIR's NVVM op definitions. Where two sources overlap
// they agree (e.g. M >> 4 in bits 24-28 vs M >> 7 in bits 27-28 for M = 128).
//
//   Operands, K-major, no swizzle ("interleaved"): the canonical layout, in
//   elements, is ((8,m),(T,2)) : ((1T,SBO),(1,LBO)), T = 16 bytes of
//   elements: a core matrix is 8 rows x 16 bytes stored contiguously (128
//   bytes); LBO is the byte distance between core matrices adjacent along K,
//   SBO between core matrices adjacent along M (N). Here a tile row r, byte
//   k of the 128-byte K slice lives at
//       (r / 8) * 1024 + (k / 16) * 128 + (r % 8) * 16 + (k % 16)
//   so LBO = 128 and SBO = 1024. The MMA with K = 32 (32 bytes = 2 core
//   matrices along K) number j of a stage starts at byte 256 j. Descriptor
//   fields hold byte values >> 4; bits 46-48 = 0b001 (tcgen05); base offset
//   0; swizzle mode 0. A (128 rows) and B (128 rows = N columns) use the
//   same layout; both are K-major (transpose bits 0), which avoids relying on
//   MN-major FP8 operands.
//
//   Scales: for M = 128 and scale_vec::1X the MMA reads A's scale of row
//   32q + l from TMEM lane l (of each 32-lane quarter), 32-bit column
//   (sfa + q), byte "scale factor A id" (instruction descriptor bits 29-30);
//   B's likewise for column 32q + l (column sfb + q, byte = bits 4-5). One
//   column therefore holds 4 K blocks = 128 K values: the stage size. The
//   copy tcgen05.cp.cta_group::1.32x128b.warpx4 takes 32 rows of 16 bytes
//   (shared memory descriptor: no swizzle, SBO = 128 = one 8-row core
//   matrix, LBO unused) to lanes 0-31 and replicates them to the other three
//   lane quarters; row l, byte 4q + j is column q, byte j. So shared memory
//   holds scale(row 32q + l, block j) at byte 16 l + 4 q + j. This is the
//   layout CUTLASS calls the block-scaled basic chunk and JAX documents as
//   scales.reshape(-1, 4, 32, 4).swapaxes(1, 2) for a (MN, 4) scale tile.
//
//   Instruction descriptor (kind::mxf8f6f4.block_scale): bits 4-5 B scale
//   id, 7-9 A format, 10-12 B format (E4M3 = 0, E5M2 = 1), 15/16 transpose
//   A/B (0: K-major), 17-22 N >> 3, 23 scale type (1: UE8M0), 24-28 M >> 4,
//   29-30 A scale id, 31 K size (0: K = 32 dense); the rest 0.
//
//   Accumulator: M = 128, cta_group::1: row i of D is TMEM lane i, column j
//   is column acc + j (f32).
//
// TMEM: 256 columns (power of two >= 32): accumulator 0..127, A scales
// 128..131, B scales 132..135. Shared memory (dynamic, 33808 bytes): A tile
// at 0, B tile at 16384, A scales at 32768, B scales at 33280, the mbarrier
// at 33792, the TMEM address written by tcgen05.alloc at 33800.
//
// Numerics: the MMA computes sum_k (a_k 2^sa)(b_k 2^sb) with the products of
// dequantized values accumulated in f32, as the op defines; the tensor core
// adds the 32 products of a block and the partial sums in its own order (not
// the reference's k-ascending f32 chain), so results match the reference to
// f32 rounding, not bit for bit.
//
// PTX: the MMA is printed without a scale-vector qualifier, which for
// kind::mxf8f6f4 means one scale per 32 values (.scale_vec::1X); CUDA 13's
// ptxas reads it as `.block32` and wants PTX ISA 8.8 (the GPU pipeline
// targets +ptx88 on Blackwell). ptxas notes a "potential out of bound
// access" of `__dynamic_shmem__0`: MLIR declares the dynamic shared memory
// symbol with size 0; the accesses are within the 33808 dynamic bytes the
// launch requests.
//
// Not verified (no Blackwell GPU here): the kernel has never run. ptxas
// accepts it for sm_100a and the PTX was read against the layouts above;
// whether the hardware agrees with the sources named was not checked, nor
// its treatment of the E8M0 NaN scale (0xFF) and of dequantized values
// below the f32 normal range (flushed?), nor the in-order execution of
//
//===----------------------------------------------------------------------===//

#include "KernelBuilder.h"
#include "Kernels.h"

using namespace mlir;
using namespace mlir::moe;

namespace mlir::moe::kernels {

namespace tcgen05 {
// Tile sizes and the fixed shared / tensor memory plan (see the header).
constexpr int64_t TileM = 128;     // rows per CTA = MMA M = TMEM lanes
constexpr int64_t TileN = 128;     // columns per CTA = MMA N
constexpr int64_t TileK = 128;     // K per stage = 4 scale blocks = 4 MMAs
constexpr int64_t MmaK = 32;       // K of one kind::mxf8f6f4 MMA
constexpr int64_t Threads = 128;   // 4 warps: one per 32-lane TMEM quarter
constexpr int64_t CoreBytes = 128; // 8 rows x 16 bytes
constexpr int64_t LBO = CoreBytes; // next core matrix along K
constexpr int64_t SBO = TileK / 16 * CoreBytes; // next 8 rows: 1024
constexpr int64_t SmemA = 0;
constexpr int64_t SmemB = SmemA + TileM * TileK;     // 16384
constexpr int64_t SmemSFA = SmemB + TileN * TileK;   // 32768
constexpr int64_t SmemSFB = SmemSFA + TileM * 4;     // 33280
constexpr int64_t SmemBarrier = SmemSFB + TileN * 4; // 33792 (8-aligned)
constexpr int64_t SmemTmemSlot = SmemBarrier + 8;    // 33800
constexpr int64_t SmemBytes = SmemTmemSlot + 8;      // 33808
constexpr int64_t TmemAcc = 0;
constexpr int64_t TmemSFA = TileN;       // 128
constexpr int64_t TmemSFB = TmemSFA + 4; // 132
constexpr int64_t TmemCols = 256;

} // namespace tcgen05

using namespace tcgen05;

namespace {

/// Emits the body of the block-scaled grouped GEMM's gpu.launch.
struct BlockScaledGemmEmitter : KernelBuilder {
  const BlockScaledGemm &g;
  // Buffers: A data [R, K], A scales [R, K/32], B data [E, K, N], B scales
  // [E, K/32, N], offsets [E+1], result [R, N].
  Value a, aScales, w, wScales, offsets, out;

  // Per-thread values set by emit().
  Value tid{}, m0{}, n0{}, row{}, tmemBase{}, laneBase{};

  /// A tensor memory address: `lane` (i32, shifted into bits 16-31; null for
  /// lane 0) and column `col` relative to the allocation.
  Value tmemPtr(Value lane, int64_t col) {
    Value addr = add(tmemBase, int32(col));
    if (lane)
      addr = add(addr, lane);
    return LLVM::IntToPtrOp::create(
        b, loc, LLVM::LLVMPointerType::get(b.getContext(), 6), addr);
  }
  /// A shared memory matrix descriptor (no swizzle) for the matrix at byte
  /// `offset`; LBO and SBO in bytes.
  Value smemDescriptor(int64_t offset, int64_t lbo, int64_t sbo) {
    Value addr = arith::TruncIOp::create(b, loc, i32(), sharedAddress(offset));
    Value start = arith::ShRUIOp::create(b, loc, addr, int32(4));
    return NVVM::Tcgen05MmaSmemDescOp::create(
        b, loc, i64(), start, int32(lbo >> 4), int32(sbo >> 4), int8(0),
        boolean(false), /*swizzle none*/ int8(0));
  }
  /// The instruction descriptor of the MMA using scale byte `j` of A's and
  /// B's scale columns (layout in the header).
  Value instrDescriptor(uint32_t j) {
    uint32_t d = (j << 4) | (BlockScaledGemm::format(g.lhsElt) << 7) |
                 (BlockScaledGemm::format(g.rhsElt) << 10) |
                 uint32_t(TileN >> 3) << 17 | 1u << 23 |
                 uint32_t(TileM >> 4) << 24 | (j << 29);
    return arith::ConstantIntOp::create(b, loc, int64_t(d), 32);
  }

  // -- one K stage into shared memory ----------------------------------------
  /// Row `r` (of 128), byte `k` (of 128) of a K-major tile at `base`.
  Value tileOffset(int64_t base, Value r, Value k) {
    Value off = add(mul(div(r, 8), idx(SBO)), mul(div(k, 16), idx(LBO)));
    off = add(off, add(mul(rem(r, 8), idx(16)), rem(k, 16)));
    return add(off, idx(base));
  }

  void loadStage(Value expert, Value stage) {
    Value k0 = mul(stage, idx(TileK));
    Value rowsLast = idx(g.rows - 1);
    Value zero8 = int8(0);
    // A: thread t copies byte k0 + t of every row (coalesced); rows past R
    // read as zeros.
    forLoop(0, TileM, [&](Value r) {
      Value grow = add(m0, r);
      Value bits = loadBits(a, {minS(grow, rowsLast), add(k0, tid)});
      bits = select(cmp(P::slt, grow, idx(g.rows)), bits, zero8);
      storeShared(tileOffset(SmemA, r, tid), bits);
    });
    // B: thread t copies column n0 + t (row t of the K-major tile) for every
    // k; consecutive threads read consecutive bytes of a row of B.
    forLoop(0, TileK, [&](Value k) {
      Value bits = loadBits(w, {expert, add(k0, k), add(n0, tid)});
      storeShared(tileOffset(SmemB, tid, k), bits);
    });
    // Scales: thread t copies A's scales of row m0 + t and B's of column
    // n0 + t, blocks 4 stage .. 4 stage + 3, to byte 16 l + 4 q + j
    // (t = 32 q + l).
    Value sfOffset = add(mul(rem(tid, 32), idx(16)), mul(div(tid, 32), idx(4)));
    Value rowValid = cmp(P::slt, row, idx(g.rows));
    Value safeRow = minS(row, rowsLast);
    for (int64_t j = 0; j < TileK / MXBlock; ++j) {
      Value block = add(mul(stage, idx(TileK / MXBlock)), idx(j));
      Value sa = select(rowValid, loadBits(aScales, {safeRow, block}), zero8);
      storeShared(add(sfOffset, idx(SmemSFA + j)), sa);
      Value sb = loadBits(wScales, {expert, block, add(n0, tid)});
      storeShared(add(sfOffset, idx(SmemSFB + j)), sb);
    }
  }

  /// Thread 0: scales to TMEM, the stage's four MMAs, commit to the mbarrier.
  void issueStage(Value stage) {
    NVVM::Tcgen05FenceOp::create(b, loc,
                                 NVVM::Tcgen05FenceKind::AFTER_THREAD_SYNC);
    auto copyScales = [&](int64_t smemOffset, int64_t tmemCol) {
      NVVM::Tcgen05CpOp::create(
          b, loc, NVVM::Tcgen05CpShape::SHAPE_32x128b,
          NVVM::CTAGroupKind::CTA_1, NVVM::Tcgen05CpMulticast::WARPX4,
          /*srcFormat=*/nullptr, tmemPtr(nullptr, tmemCol),
          smemDescriptor(smemOffset, /*lbo=*/0, /*sbo=*/CoreBytes));
    };
    copyScales(SmemSFA, TmemSFA);
    copyScales(SmemSFB, TmemSFB);
    // tcgen05.cp and tcgen05.mma issued by one thread execute in order: the
    // MMAs see the copied scales without further synchronization.
    Value notFirstStage = cmp(P::ne, stage, idx(0));
    for (int64_t j = 0; j < TileK / MmaK; ++j) {
      int64_t kBytes = j * MmaK; // 2 core matrices along K per MMA
      Value aDesc = smemDescriptor(SmemA + kBytes / 16 * LBO, LBO, SBO);
      Value bDesc = smemDescriptor(SmemB + kBytes / 16 * LBO, LBO, SBO);
      Value accumulate = j == 0 ? notFirstStage : boolean(true);
      NVVM::Tcgen05MMABlockScaleOp::create(
          b, loc, NVVM::MMABlockScaleKind::MXF8F6F4, NVVM::CTAGroupKind::CTA_1,
          NVVM::Tcgen05MMABlockScale::DEFAULT,
          NVVM::Tcgen05MMACollectorOp::DISCARD, tmemPtr(nullptr, TmemAcc),
          aDesc, bDesc, instrDescriptor(j), accumulate,
          tmemPtr(nullptr, TmemSFA), tmemPtr(nullptr, TmemSFB));
    }
    NVVM::Tcgen05CommitOp::create(b, loc, sharedPtr(SmemBarrier),
                                  /*multicastMask=*/Value());
  }

  /// Every thread: its row of the accumulator, stored if it is in the group.
  void storeRow(Value inGroup) {
    NVVM::Tcgen05FenceOp::create(b, loc,
                                 NVVM::Tcgen05FenceKind::AFTER_THREAD_SYNC);
    auto vecType = VectorType::get({32}, i32());
    for (int64_t j = 0; j < TileN / 32; ++j) {
      Value v = NVVM::Tcgen05LdOp::create(
          b, loc, vecType, /*pack=*/false, NVVM::Tcgen05LdStShape::SHAPE_32X32B,
          tmemPtr(laneBase, TmemAcc + 32 * j), /*offset=*/Value());
      NVVM::Tcgen05WaitOp::create(b, loc, NVVM::Tcgen05WaitKind::LOAD);
      ifThen(inGroup, [&] {
        for (int64_t i = 0; i < 32; ++i) {
          Value bits = LLVM::ExtractElementOp::create(b, loc, v, int32(i));
          Value f = arith::BitcastOp::create(b, loc, b.getF32Type(), bits);
          memref::StoreOp::create(b, loc, f, out,
                                  ValueRange{row, add(n0, idx(32 * j + i))});
        }
      });
    }
    // The next expert's first MMA overwrites the accumulator: order these
    // loads before the barrier that precedes it.
    NVVM::Tcgen05FenceOp::create(b, loc,
                                 NVVM::Tcgen05FenceKind::BEFORE_THREAD_SYNC);
  }

  void emit(gpu::LaunchOp launch) {
    tid = launch.getThreadIds().x;
    m0 = mul(launch.getBlockIds().x, idx(TileM));
    n0 = mul(launch.getBlockIds().y, idx(TileN));
    row = add(m0, tid);
    setUpSharedMemory();
    Value isWarp0 = cmp(P::ult, tid, idx(32));
    Value isLeader = cmp(P::eq, tid, idx(0));

    // Tensor memory (one warp allocates and frees it) and the mbarrier.
    ifThen(isWarp0, [&] {
      NVVM::Tcgen05AllocOp::create(b, loc, sharedPtr(SmemTmemSlot),
                                   int32(TmemCols));
      NVVM::Tcgen05RelinquishAllocPermitOp::create(b, loc);
    });
    ifThen(isLeader, [&] {
      NVVM::MBarrierInitOp::create(b, loc, sharedPtr(SmemBarrier), int32(1),
                                   /*predicate=*/Value());
    });
    NVVM::Tcgen05FenceOp::create(b, loc,
                                 NVVM::Tcgen05FenceKind::BEFORE_THREAD_SYNC);
    NVVM::Barrier0Op::create(b, loc);
    NVVM::Tcgen05FenceOp::create(b, loc,
                                 NVVM::Tcgen05FenceKind::AFTER_THREAD_SYNC);
    tmemBase = LLVM::LoadOp::create(b, loc, i32(), sharedPtr(SmemTmemSlot));
    // This warp's TMEM lane quarter, in the lane field (bits 16-31).
    laneBase = arith::ShLIOp::create(
        b, loc,
        arith::IndexCastOp::create(b, loc, i32(), mul(div(tid, 32), idx(32))),
        int32(16));

    Value rowsEnd = idx(g.rows);
    Value tileEnd = add(m0, idx(TileM));
    SmallVector<Value> state = forEachExpertMeetingTile(
        idx(g.experts), {int32(0), boolean(false)}, offsets, g.rows, m0,
        tileEnd,
        [&](Value e, Value lo, Value hi,
            ValueRange carried) -> SmallVector<Value> {
          Value phase = forLoop(
              0, idx(g.k / TileK), {carried[0]},
              [&](Value stage, ValueRange ph) -> SmallVector<Value> {
                loadStage(e, stage);
                fenceForAsyncProxy();
                NVVM::Barrier0Op::create(b, loc);
                ifThen(isLeader, [&] { issueStage(stage); });
                // The MMAs have read shared memory and written
                // the accumulator once this phase completes.
                NVVM::MBarrierTryWaitParityOp::create(
                    b, loc, sharedPtr(SmemBarrier), ph[0], int32(WaitTicks));
                return {arith::XOrIOp::create(b, loc, ph[0], int32(1))};
              })[0];
          Value inGroup = land(cmp(P::sle, lo, row), cmp(P::slt, row, hi));
          storeRow(inGroup);
          return {phase, lor(carried[1], inGroup)};
        });

    // Rows of the tile in no group are zero.
    Value uncovered =
        land(arith::XOrIOp::create(b, loc, state[1], boolean(true)),
             cmp(P::slt, row, rowsEnd));
    ifThen(uncovered, [&] {
      Value zero = arith::ConstantOp::create(b, loc, b.getF32FloatAttr(0.0));
      forLoop(0, TileN, [&](Value c) {
        memref::StoreOp::create(b, loc, zero, out, ValueRange{row, add(n0, c)});
      });
    });

    // Free the tensor memory once every warp is done with it.
    NVVM::Tcgen05FenceOp::create(b, loc,
                                 NVVM::Tcgen05FenceKind::BEFORE_THREAD_SYNC);
    NVVM::Barrier0Op::create(b, loc);
    ifThen(isWarp0, [&] {
      NVVM::Tcgen05FenceOp::create(b, loc,
                                   NVVM::Tcgen05FenceKind::AFTER_THREAD_SYNC);
      NVVM::Tcgen05DeallocOp::create(b, loc, tmemPtr(nullptr, 0),
                                     int32(TmemCols));
    });
  }
};

/// A kernel's launch: grid, threads per block (along x), dynamic shared

} // namespace

/// The shape of `op` if the block-scaled kernel computes it exactly as the op
/// defines; nothing otherwise.
std::optional<BlockScaledGemm> matchBlockScaledGemm(GroupedMatmulOp op,
                                                    WhyNot why) {
  if (op->getParentOfType<ExpertsOp>())
    return noKernel(why, "inside a moe.experts region (not grouped)");
  if (op.getTransposeRhs())
    return noKernel(why, "transpose_rhs (the block-scaled kernel reads the "
                         "rhs [E, K, N])");
  auto lhs = dyn_cast<MXTensorType>(op.getLhs().getType());
  auto rhs = dyn_cast<MXTensorType>(op.getRhs().getType());
  auto offsets = cast<RankedTensorType>(op.getOffsets().getType());
  RankedTensorType result = op.getType();
  if (!lhs || !rhs || lhs.getRank() != 2 || rhs.getRank() != 3 ||
      lhs.getAxis() != 1 || rhs.getAxis() != 1 ||
      lhs.getBlockSize() != MXBlock || rhs.getBlockSize() != MXBlock ||
      !isMXFP8(lhs.getElementType()) || !isMXFP8(rhs.getElementType()) ||
      !result.getElementType().isF32())
    return noKernel(why, "the operands are not MXFP8 with blocks of 32 along "
                         "K (the block-scaled kernel's only form)");
  if (!result.hasStaticShape() || !offsets.hasStaticShape() ||
      ShapedType::isDynamicShape(lhs.getShape()) ||
      ShapedType::isDynamicShape(rhs.getShape()))
    return noKernel(why, "a dynamic shape (the kernels are generated for "
                         "static shapes)");
  int64_t rows = lhs.getShape()[0], k = lhs.getShape()[1];
  int64_t experts = rhs.getShape()[0], n = rhs.getShape()[2];
  if (rows < 1 || experts < 1)
    return noKernel(why, "no rows or no experts");
  if (k < TileK || k % TileK)
    return noKernel(why, "K = {0} is not a multiple of {1}", k, TileK);
  if (n < TileN || n % TileN)
    return noKernel(why, "N = {0} is not a multiple of {1}", n, TileN);
  return BlockScaledGemm{rows,
                         k,
                         n,
                         experts,
                         lhs.getElementType(),
                         rhs.getElementType(),
                         offsets.getElementType()};
}

/// The private function computing one grouped GEMM shape (see the header):
/// (A data, A scales, B data, B scales, offsets) -> result.
func::FuncOp getOrCreateBlockScaledGemmFunction(
    ModuleOp module, SymbolTable &symbols, const BlockScaledGemm &g,
    ArrayRef<Type> argTypes, RankedTensorType resultType, Location loc) {
  return withGroupedArgs(
      getOrCreateKernelCall(
          module, symbols, g.name(), "tcgen05.mma.block_scale mxf8f6f4",
          argTypes, resultType, loc,
          {tilesOf(g.rows, TileM), g.n / TileN, 1, Threads, SmemBytes},
          [&](OpBuilder &b, gpu::LaunchOp launch, ArrayRef<Value> buf,
              Value out) {
            BlockScaledGemmEmitter k{{b, loc}, g,      buf[0], buf[1],
                                     buf[2],   buf[3], buf[4], out};
            k.emit(launch);
          }),
      {0, 1}, 4);
}

void lowerBlockScaledGemm(GroupedMatmulOp op, const BlockScaledGemm &g,
                          ModuleOp module, SymbolTable &symbols) {
  SmallVector<Type> argTypes = mxGemmArgTypes(op);
  func::FuncOp kernel = getOrCreateBlockScaledGemmFunction(
      module, symbols, g, argTypes, op.getType(), op.getLoc());
  replaceByMXGemmCall(op, kernel);
}

} // namespace mlir::moe::kernels
