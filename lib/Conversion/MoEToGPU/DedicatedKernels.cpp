//===- DedicatedKernels.cpp - hand-scheduled GPU kernels for moe ops ------===//
//
// -moe-gpu-dedicated-kernels{chip=...} runs on tensors, before
// -convert-moe-to-linalg. Every op it has a kernel for (for the chip) becomes
// a call to a generated private function
//
//   func.func private @moe_bs_gmm_<shape>(tensors...) -> tensor<...> {
//     bufferization.to_buffer (read-only) of every input
//     memref.alloc of the result
//     gpu.launch { the kernel: gpu, memref, arith, scf, llvm and nvvm ops }
//     return bufferization.to_tensor of the result
//   }
//
// so the rest of the GPU pipeline (bufferization, -moe-gpu-map-loops, which
// leaves gpu.launch bodies alone, -moe-gpu-device-buffers, outlining, NVVM)
// carries it to PTX with the generic kernels. The GPU pipeline inlines these
// functions into their callers after -convert-moe-to-linalg (the launch
// carries `module(@<name>_kernel) function(@<name>_kernel)`, so outlining
// keeps the kernel's name): a program's launches then share one stream.
// A function whose host code needs values computed before the launch (the
// TMA kernels' tensor maps, encoded by libmoert's moertTensorMap2D, a
// `moe.host_only` function) builds them in front of it. Ops without a kernel are left
// exactly as they are (no diagnostic): they take the generic data-parallel
// path of -convert-moe-to-linalg=parallel=true.
//
// Kernels today
// -------------
// Blackwell (sm_100a): moe.grouped_matmul with MXFP8 operands,
//   lhs !moe.mx<R x K x f8, axis = 1>, rhs !moe.mx<E x K x N x f8, axis = 1>
//   (f8 = f8E4M3FN or f8E5M2, blocks of 32), f32 result, no transpose_rhs,
//   static shapes, K and N multiples of 128 (R arbitrary), on the native
//   block-scaled MMA: tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale
//   with E8M0 scales and one scale per 32 values along K (scale_vec::1X).
// Hopper (sm_90a): moe.grouped_matmul with bf16 lhs [R, K] and rhs
//   [E, K, N] (or [E, N, K] with transpose_rhs), f32 result, static shapes,
//   K a multiple of 64 and N of 128 (R arbitrary), on warpgroup MMA
//   (wgmma.mma_async bf16 -> f32). N a multiple of 256: a warp-specialized
//   kernel, TMA loads into an mbarrier ring, two consumer warpgroups of
//   m64n256k16, a persistent grid over every expert's tiles; see "bf16
//   grouped GEMM, TMA and warp-specialized wgmma". Otherwise a 3-buffer
//   cp.async ring of 128-byte swizzled tiles; see "Hopper" below for its
//   tiles, layouts and accumulator fragment. moe.grouped_matmul_wgrad
//   (weight gradients) likewise, on the same two kernels. MX operands blocked
//   along K are dequantized to bf16 first (exact). f32 linalg.matmul on a
//   CUDA-core tiled kernel (split K for few tiles over a long K).
// Hopper (sm_90a): moe.grouped_matmul with MXFP8 operands (as for
//   Blackwell, K a multiple of 64, N of 128): FP8 wgmma m64n128k32 per
//   32-wide K slice into a fresh accumulator, promoted into the f32 result
//   with both operands' scales (exact up to f32 rounding); see "Hopper
//   (sm_90a): MXFP8" below.
// Both chips: moe.dequantize of a moe.quantize (the MX rounding of a
//   tensor, as floats) in one pass over the input; see "MX round trip".
//   Other moe.dequantize ops in one pass over data and scales; see "MX
//   dequantize".
//
// The block-scaled grouped GEMM kernel
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
// tcgen05.cp before tcgen05.mma from one thread (which JAX relies on too).
//
//===----------------------------------------------------------------------===//

#include "moe/Conversion/MoEToGPU/DedicatedKernels.h"
#include "moe/Conversion/MoEToLinalg/MoEToLinalg.h"
#include "moe/Conversion/Passes.h"
#include "moe/Dialect/MoE/IR/MoEDialect.h"
#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Dialect/MoE/Utils/Activations.h"
#include "moe/Dialect/MoE/Utils/LiveRows.h"
#include "moe/Dialect/MoE/Utils/TensorLiveness.h"
#include "moe/Dialect/MoE/Utils/MXNumerics.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Bufferization/IR/Bufferization.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/Support/FormatVariadic.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEGPUDEDICATEDKERNELS
#define GEN_PASS_DEF_MOEGPUFUSEROWGATHERS
#include "moe/Conversion/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;
using P = arith::CmpIPredicate;

bool mlir::moe::hasDedicatedGPUKernels(llvm::StringRef chip) {
  // The tcgen05 ops need an arch-specific data-center Blackwell target, and
  // MLIR 22's NVVM accepts all of those the kernel uses for sm_100a only
  // (tcgen05.alloc: sm_100a/sm_101a; tcgen05.mma.block_scale: sm_100a/
  // sm_110a). Consumer Blackwell (sm_120) has no tensor memory.
  // Hopper: warpgroup MMA (wgmma) needs the arch-specific sm_90a target.
  return chip == "sm_100a" || chip == "sm_90a";
}

namespace {

//===----------------------------------------------------------------------===//
// Memory effects of the NVVM ops the kernels use
//===----------------------------------------------------------------------===//

// Upstream NVVM declares no memory effects for the tcgen05, mbarrier, fence
// and barrier ops. The ownership-based buffer deallocation, which runs over
// the generated functions (gpu.launch and all), rejects ops with unknown
// effects; these models declare what the ops do (they read and write shared
// or tensor memory; the descriptor and conversion ops compute values only). Attached
// through this pass's dependent-dialect registry, only where upstream has no
// interface of its own.
template <typename OpTy>
struct ReadsAndWritesMemory
    : MemoryEffectOpInterface::ExternalModel<ReadsAndWritesMemory<OpTy>, OpTy> {
  void
  getEffects(Operation *,
             SmallVectorImpl<SideEffects::EffectInstance<MemoryEffects::Effect>>
                 &effects) const {
    effects.emplace_back(MemoryEffects::Read::get());
    effects.emplace_back(MemoryEffects::Write::get());
  }
};

template <typename OpTy>
struct NoMemoryEffects
    : MemoryEffectOpInterface::ExternalModel<NoMemoryEffects<OpTy>, OpTy> {
  void
  getEffects(Operation *,
             SmallVectorImpl<SideEffects::EffectInstance<MemoryEffects::Effect>>
                 &) const {}
};

template <template <typename> class Model, typename... Ops>
void attachWhereMissing(MLIRContext *ctx) {
  auto attach = [&](auto tag) {
    using OpTy = typename decltype(tag)::type;
    std::optional<RegisteredOperationName> name =
        RegisteredOperationName::lookup(TypeID::get<OpTy>(), ctx);
    if (name && !name->hasInterface<MemoryEffectOpInterface>())
      OpTy::template attachInterface<Model<OpTy>>(*ctx);
  };
  (attach(llvm::type_identity<Ops>{}), ...);
}

void declareNVVMMemoryEffects(MLIRContext *ctx, NVVM::NVVMDialect *) {
  attachWhereMissing<
      ReadsAndWritesMemory, NVVM::Tcgen05AllocOp, NVVM::Tcgen05DeallocOp,
      NVVM::Tcgen05RelinquishAllocPermitOp, NVVM::Tcgen05FenceOp,
      NVVM::Tcgen05WaitOp, NVVM::Tcgen05CommitOp, NVVM::Tcgen05CpOp,
      NVVM::Tcgen05LdOp, NVVM::Tcgen05MMABlockScaleOp, NVVM::MBarrierInitOp,
      NVVM::MBarrierTryWaitParityOp, NVVM::Barrier0Op, NVVM::FenceProxyOp,
      NVVM::CpAsyncOp, NVVM::CpAsyncCommitGroupOp, NVVM::CpAsyncWaitGroupOp,
      NVVM::WgmmaFenceAlignedOp, NVVM::WgmmaGroupSyncAlignedOp,
      NVVM::WgmmaWaitGroupSyncOp, NVVM::WgmmaMmaAsyncOp,
      NVVM::MBarrierArriveOp, NVVM::MBarrierArriveExpectTxOp,
      NVVM::CpAsyncBulkTensorGlobalToSharedClusterOp,
      NVVM::CpAsyncBulkTensorSharedCTAToGlobalOp,
      NVVM::CpAsyncBulkCommitGroupOp, NVVM::CpAsyncBulkWaitGroupOp,
      NVVM::BarrierOp,
      NVVM::SetMaxRegisterOp, NVVM::SyncWarpOp>(ctx);
  attachWhereMissing<NoMemoryEffects, NVVM::Tcgen05MmaSmemDescOp,
                     NVVM::ConvertF32x2ToF8x2Op, NVVM::ConvertF8x2ToF16x2Op>(
      ctx);
}

//===----------------------------------------------------------------------===//
// Which ops the block-scaled kernel handles
//===----------------------------------------------------------------------===//

// Tile sizes and the fixed shared / tensor memory plan (see the header).
constexpr int64_t kTileM = 128;      // rows per CTA = MMA M = TMEM lanes
constexpr int64_t kTileN = 128;      // columns per CTA = MMA N
constexpr int64_t kTileK = 128;      // K per stage = 4 scale blocks = 4 MMAs
constexpr int64_t kMmaK = 32;        // K of one kind::mxf8f6f4 MMA
constexpr int64_t kBlock = 32;       // MX block = scale vector size (1X)
constexpr int64_t kThreads = 128;    // 4 warps: one per 32-lane TMEM quarter
constexpr int64_t kCoreBytes = 128;  // 8 rows x 16 bytes
constexpr int64_t kLBO = kCoreBytes; // next core matrix along K
constexpr int64_t kSBO = kTileK / 16 * kCoreBytes; // next 8 rows: 1024
constexpr int64_t kSmemA = 0;
constexpr int64_t kSmemB = kSmemA + kTileM * kTileK;    // 16384
constexpr int64_t kSmemSFA = kSmemB + kTileN * kTileK;  // 32768
constexpr int64_t kSmemSFB = kSmemSFA + kTileM * 4;     // 33280
constexpr int64_t kSmemBarrier = kSmemSFB + kTileN * 4; // 33792 (8-aligned)
constexpr int64_t kSmemTmemSlot = kSmemBarrier + 8;     // 33800
constexpr int64_t kSmemBytes = kSmemTmemSlot + 8;       // 33808
constexpr int64_t kTmemAcc = 0;
constexpr int64_t kTmemSFA = kTileN;       // 128
constexpr int64_t kTmemSFB = kTmemSFA + 4; // 132
constexpr int64_t kTmemCols = 256;
constexpr int64_t kWaitTicks = 0x989680; // mbarrier try_wait suspend hint

/// One block-scaled grouped GEMM shape the kernel handles.
struct BlockScaledGemm {
  int64_t rows, k, n, experts;
  Type lhsElt, rhsElt, offsetElt;

  static std::string eltName(Type t) {
    if (isa<Float8E4M3FNType>(t))
      return "e4m3";
    if (isa<Float8E5M2Type>(t))
      return "e5m2";
    std::string s;
    llvm::raw_string_ostream os(s);
    t.print(os);
    return s;
  }
  std::string name() const {
    return llvm::formatv("moe_bs_gmm_{0}x{1}x{2}_e{3}_{4}_{5}_{6}", rows, k, n,
                         experts, eltName(lhsElt), eltName(rhsElt),
                         eltName(offsetElt))
        .str();
  }
  /// The MMA's element format code (instruction descriptor bits 7-9/10-12).
  static uint32_t format(Type t) { return isa<Float8E5M2Type>(t) ? 1 : 0; }
};

bool isMXFP8(Type t) { return isa<Float8E4M3FNType, Float8E5M2Type>(t); }

/// The shape of `op` if the block-scaled kernel computes it exactly as the op
/// defines; nothing otherwise.
std::optional<BlockScaledGemm> matchBlockScaledGemm(GroupedMatmulOp op) {
  if (op.getTransposeRhs() || op->getParentOfType<ExpertsOp>())
    return std::nullopt;
  auto lhs = dyn_cast<MXTensorType>(op.getLhs().getType());
  auto rhs = dyn_cast<MXTensorType>(op.getRhs().getType());
  auto offsets = cast<RankedTensorType>(op.getOffsets().getType());
  RankedTensorType result = op.getType();
  if (!lhs || !rhs || lhs.getRank() != 2 || rhs.getRank() != 3 ||
      lhs.getAxis() != 1 || rhs.getAxis() != 1 ||
      lhs.getBlockSize() != kBlock || rhs.getBlockSize() != kBlock ||
      !isMXFP8(lhs.getElementType()) || !isMXFP8(rhs.getElementType()) ||
      !result.getElementType().isF32() || !result.hasStaticShape() ||
      !offsets.hasStaticShape() || ShapedType::isDynamicShape(lhs.getShape()) ||
      ShapedType::isDynamicShape(rhs.getShape()))
    return std::nullopt;
  int64_t rows = lhs.getShape()[0], k = lhs.getShape()[1];
  int64_t experts = rhs.getShape()[0], n = rhs.getShape()[2];
  if (rows < 1 || k < kTileK || k % kTileK || n < kTileN || n % kTileN ||
      experts < 1 || rhs.getShape()[1] != k ||
      offsets.getDimSize(0) != experts + 1 || result.getDimSize(0) != rows ||
      result.getDimSize(1) != n)
    return std::nullopt;
  return BlockScaledGemm{rows,
                         k,
                         n,
                         experts,
                         lhs.getElementType(),
                         rhs.getElementType(),
                         offsets.getElementType()};
}

//===----------------------------------------------------------------------===//
// The kernel
//===----------------------------------------------------------------------===//

/// Builders shared by the kernels: arithmetic, control flow, shared memory.
struct EmitterBase {
  OpBuilder &b;
  Location loc;
  // The dynamic shared memory and its shared::cta address (set by emit()).
  Value smem{}, smemBase{};

  // -- small helpers ---------------------------------------------------------
  Type i1() { return b.getI1Type(); }
  Type i8() { return b.getI8Type(); }
  Type i32() { return b.getI32Type(); }
  Type i64() { return b.getI64Type(); }
  Value idx(int64_t v) { return arith::ConstantIndexOp::create(b, loc, v); }
  Value int32(int64_t v) { return arith::ConstantIntOp::create(b, loc, v, 32); }
  Value int8(int64_t v) { return arith::ConstantIntOp::create(b, loc, v, 8); }
  Value boolean(bool v) { return arith::ConstantIntOp::create(b, loc, v, 1); }
  Value add(Value x, Value y) { return arith::AddIOp::create(b, loc, x, y); }
  Value mul(Value x, Value y) { return arith::MulIOp::create(b, loc, x, y); }
  Value div(Value x, int64_t y) {
    return arith::DivUIOp::create(b, loc, x, idx(y));
  }
  Value rem(Value x, int64_t y) {
    return arith::RemUIOp::create(b, loc, x, idx(y));
  }
  Value cmp(P p, Value x, Value y) {
    return arith::CmpIOp::create(b, loc, p, x, y);
  }
  Value select(Value c, Value x, Value y) {
    return arith::SelectOp::create(b, loc, c, x, y);
  }
  Value minS(Value x, Value y) { return arith::MinSIOp::create(b, loc, x, y); }
  Value maxS(Value x, Value y) { return arith::MaxSIOp::create(b, loc, x, y); }
  Value land(Value x, Value y) { return arith::AndIOp::create(b, loc, x, y); }
  Value lor(Value x, Value y) { return arith::OrIOp::create(b, loc, x, y); }
  Value toIndex(Value v) {
    return arith::IndexCastOp::create(b, loc, b.getIndexType(), v);
  }
  Value toI64(Value index) {
    return arith::IndexCastOp::create(b, loc, i64(), index);
  }
  Value int64(int64_t v) { return arith::ConstantIntOp::create(b, loc, v, 64); }
  /// A view of a static buffer as one dimension.
  Value flat(Value buffer) {
    auto type = cast<MemRefType>(buffer.getType());
    SmallVector<ReassociationIndices> all(1);
    for (int64_t d = 0; d < type.getRank(); ++d)
      all[0].push_back(d);
    return memref::CollapseShapeOp::create(b, loc, buffer, all);
  }
  /// The address of a buffer's first element, as an i64.
  Value baseAddress(Value memref) {
    return toI64(memref::ExtractAlignedPointerAsIndexOp::create(b, loc, memref));
  }
  /// A global pointer `byteOffset` (index) bytes past `base` (i64).
  Value globalPtr(Value base, Value byteOffset) {
    Value addr = arith::AddIOp::create(b, loc, base, toI64(byteOffset));
    return LLVM::IntToPtrOp::create(
        b, loc, LLVM::LLVMPointerType::get(b.getContext(), 1), addr);
  }
  /// `n` consecutive elements of type `elt` at `ptr` (global or shared),
  /// loaded as one vector aligned to `alignment` bytes.
  SmallVector<Value> loadVector(Type elt, int64_t n, Value ptr,
                                unsigned alignment) {
    Value v = LLVM::LoadOp::create(b, loc, VectorType::get({n}, elt), ptr,
                                   alignment);
    SmallVector<Value> values;
    for (int64_t i = 0; i < n; ++i)
      values.push_back(LLVM::ExtractElementOp::create(b, loc, v, int32(i)));
    return values;
  }
  /// An 8-bit element (f8 data, E8M0 scale) loaded as its bits.
  Value loadBits(Value memref, ValueRange at) {
    Value v = memref::LoadOp::create(b, loc, memref, at);
    return arith::BitcastOp::create(b, loc, i8(), v);
  }
  /// `values` (of one type) as a vector.
  Value vectorOf(ArrayRef<Value> values) {
    Value v = LLVM::PoisonOp::create(
        b, loc, VectorType::get({int64_t(values.size())}, values[0].getType()));
    for (auto [i, value] : llvm::enumerate(values))
      v = LLVM::InsertElementOp::create(b, loc, v, value, int32(i));
    return v;
  }
  /// Orders this thread's shared-memory writes before the async proxy's
  /// reads of them (wgmma, bulk copies).
  void fenceForAsyncProxy() {
    NVVM::FenceProxyOp::create(
        b, loc, NVVM::ProxyKind::async_shared,
        NVVM::SharedSpaceAttr::get(b.getContext(),
                                   NVVM::SharedSpace::shared_cta));
  }
  void storeShared(Value byteOffset, Value bits) {
    memref::StoreOp::create(b, loc, bits, smem, byteOffset);
  }

  void ifThen(Value cond, function_ref<void()> body) {
    auto op = scf::IfOp::create(b, loc, cond, /*withElseRegion=*/false);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPoint(op.thenBlock()->getTerminator());
    body();
  }
  void ifElseVoid(Value cond, function_ref<void()> thenBody,
                  function_ref<void()> elseBody) {
    auto op = scf::IfOp::create(b, loc, cond, /*withElseRegion=*/true);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPoint(op.thenBlock()->getTerminator());
    thenBody();
    b.setInsertionPoint(op.elseBlock()->getTerminator());
    elseBody();
  }
  SmallVector<Value> ifElse(TypeRange types, Value cond,
                            function_ref<SmallVector<Value>()> thenBody,
                            function_ref<SmallVector<Value>()> elseBody) {
    auto op = scf::IfOp::create(b, loc, types, cond, /*withElseRegion=*/true);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(op.thenBlock());
    scf::YieldOp::create(b, loc, thenBody());
    b.setInsertionPointToStart(op.elseBlock());
    scf::YieldOp::create(b, loc, elseBody());
    return SmallVector<Value>(op.getResults());
  }
  SmallVector<Value>
  forLoop(int64_t lb, Value ub, ValueRange inits,
          function_ref<SmallVector<Value>(Value, ValueRange)> body) {
    auto op = scf::ForOp::create(b, loc, idx(lb), ub, idx(1), inits);
    OpBuilder::InsertionGuard guard(b);
    if (inits.empty())
      b.setInsertionPoint(op.getBody()->getTerminator());
    else
      b.setInsertionPointToStart(op.getBody());
    SmallVector<Value> yielded =
        body(op.getInductionVar(), op.getRegionIterArgs());
    if (!inits.empty())
      scf::YieldOp::create(b, loc, yielded);
    return SmallVector<Value>(op.getResults());
  }
  void forLoop(int64_t lb, int64_t ub, function_ref<void(Value)> body) {
    forLoop(lb, idx(ub), {}, [&](Value iv, ValueRange) {
      body(iv);
      return SmallVector<Value>{};
    });
  }
  /// for (i = first; i < end; i += step) body(i): a thread's share of a
  /// grid-stride loop.
  void strideLoop(Value first, Value end, Value step,
                  function_ref<void(Value)> body) {
    auto op = scf::ForOp::create(b, loc, first, end, step);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPoint(op.getBody()->getTerminator());
    body(op.getInductionVar());
  }
  void strideLoop(Value first, Value end, int64_t step,
                  function_ref<void(Value)> body) {
    strideLoop(first, end, idx(step), body);
  }
  /// Entry `i` (index) of a groups' `offsets` buffer, clamped to [0, rows].
  Value clampedOffset(Value offsets, Value i, int64_t rows) {
    Value v = toIndex(memref::LoadOp::create(b, loc, offsets, i));
    return minS(maxS(v, idx(0)), idx(rows));
  }
  /// The last entry of a groups' `offsets` buffer (the end of the last
  /// group: the rows that matter, LiveRows.h), clamped to [0, rows].
  Value groupsEnd(Value offsets, int64_t rows) {
    int64_t last = cast<MemRefType>(offsets.getType()).getDimSize(0) - 1;
    return clampedOffset(offsets, idx(last), rows);
  }
  /// Group e's rows [lo, hi), clamped as the reference does: lo to [0, rows],
  /// hi to [lo, rows].
  std::pair<Value, Value> groupRows(Value offsets, Value e, int64_t rows) {
    Value lo = toIndex(memref::LoadOp::create(b, loc, offsets, e));
    Value hi = toIndex(memref::LoadOp::create(b, loc, offsets, add(e, idx(1))));
    lo = minS(maxS(lo, idx(0)), idx(rows));
    hi = minS(maxS(hi, lo), idx(rows));
    return {lo, hi};
  }
  /// Stores `values` (of one element type) to consecutive elements of the
  /// flat buffer `flatBuffer` from element `first`: vector stores of up to
  /// 16 bytes when `aligned` (the run's address; `base` is the buffer's),
  /// else one store an element.
  void storeRun(Value flatBuffer, Value base, Value first,
                ArrayRef<Value> values, Value aligned) {
    Type elt = values.front().getType();
    int64_t bytes = elt.getIntOrFloatBitWidth() / 8;
    int64_t per = std::min<int64_t>(int64_t(values.size()), 16 / bytes);
    auto store = scf::IfOp::create(b, loc, aligned, /*withElseRegion=*/true);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPoint(store.thenBlock()->getTerminator());
    for (int64_t s0 = 0; s0 < int64_t(values.size()); s0 += per) {
      Value v = vectorOf(values.slice(s0, per));
      LLVM::StoreOp::create(
          b, loc, v, globalPtr(base, mul(add(first, idx(s0)), idx(bytes))),
          per * bytes);
    }
    b.setInsertionPoint(store.elseBlock()->getTerminator());
    for (int64_t j = 0; j < int64_t(values.size()); ++j)
      memref::StoreOp::create(b, loc, values[j], flatBuffer,
                              ValueRange{add(first, idx(j))});
  }
  /// Two MX elements (`pair`, vector<2xi8>: element 0 first) of format `f8`
  /// as `outElt`: the hardware's exact f8x2 -> f16x2 conversion, times
  /// `scales[j]` (f32) in f32, rounded once to `outElt`.
  SmallVector<Value> decodeF8Pair(Value pair, Type f8,
                                  std::array<Value, 2> scales, Type outElt) {
    Value f16 = NVVM::ConvertF8x2ToF16x2Op::create(
        b, loc, VectorType::get({2}, b.getF16Type()), pair, /*relu=*/false,
        f8);
    SmallVector<Value> result;
    for (int64_t j = 0; j < 2; ++j) {
      Value half = LLVM::ExtractElementOp::create(b, loc, f16, int32(j));
      Value q = arith::ExtFOp::create(b, loc, b.getF32Type(), half);
      Value v = arith::MulFOp::create(b, loc, q, scales[j]);
      result.push_back(outElt.isF32()
                           ? v
                           : arith::TruncFOp::create(b, loc, outElt, v)
                                 .getResult());
    }
    return result;
  }

  /// The values of one MX block (f32, an even number) rounded through the MX
  /// format `f8` with scale rule `mode`, as `outElt`, given the block's amax.
  /// The scale is MXNumerics.h's; the elements go through the hardware's
  /// conversions, two at a time: cvt.rn.satfinite.{e4m3,e5m2}x2.f32 rounds to
  /// nearest even and saturates finite values to +-max (buildEncode's rule),
  /// and the f8 -> f16 cvt is exact (every E4M3 / E5M2 value is an f16). A
  /// NaN or an infinity gives the block the NaN scale, which makes every
  /// value NaN whatever its element. About 5 instructions a value instead of
  /// buildEncode's and buildDecode's ~70.
  SmallVector<Value> mxRoundTrip(ArrayRef<Value> values, Value amax, Type f8,
                                 ScaleMode mode, Type outElt) {
    auto [byte, pairs] = mxEncode(values, amax, f8, mode);
    Value scale = buildScaleValue(b, loc, byte);
    SmallVector<Value> result;
    for (Value pair : pairs)
      llvm::append_range(result,
                         decodeF8Pair(pair, f8, {scale, scale}, outElt));
    return result;
  }
  /// The MX encoding of one block (f32 `values`, an even number, and their
  /// amax) as mxRoundTrip computes it: the E8M0 scale byte (i8) and the
  /// elements, two at a time (vector<2xi8>, element 0 first).
  std::pair<Value, SmallVector<Value>> mxEncode(ArrayRef<Value> values,
                                                Value amax, Type f8,
                                                ScaleMode mode) {
    MXFormat fmt = MXFormat::get(f8);
    Value byte = buildScaleByte(b, loc, amax, fmt, mode);
    Value inverse = buildInverseScale(b, loc, byte);
    auto pairI8 = VectorType::get({2}, b.getI8Type());
    SmallVector<Value> pairs;
    for (size_t i = 0; i + 1 < values.size(); i += 2)
      // The i16 holds `a` in its upper byte: element 0 of the pair is `b`.
      pairs.push_back(NVVM::ConvertF32x2ToF8x2Op::create(
          b, loc, pairI8,
          arith::MulFOp::create(b, loc, values[i + 1], inverse),
          arith::MulFOp::create(b, loc, values[i], inverse),
          NVVM::FPRoundingMode::RN, NVVM::SaturationMode::SATFINITE,
          /*relu=*/false, f8));
    return {byte, pairs};
  }
  /// max(amax, |v|), NaN propagating.
  Value magnitudeMax(Value amax, Value v) {
    return arith::MaximumFOp::create(b, loc, amax,
                                     math::AbsFOp::create(b, loc, v));
  }
  /// The amax of f32 `values` (max of 0 and every |v| in order).
  Value amaxOf(ArrayRef<Value> values) {
    Value amax = arith::ConstantFloatOp::create(
        b, loc, cast<FloatType>(b.getF32Type()), APFloat(0.0f));
    for (Value v : values)
      amax = magnitudeMax(amax, v);
    return amax;
  }
  /// `v` (a float) as f32.
  Value toF32(Value v) {
    return v.getType().isF32()
               ? v
               : arith::ExtFOp::create(b, loc, b.getF32Type(), v).getResult();
  }
  /// `v` (f32) reduced with max over the lanes whose index differs from this
  /// lane's in the bits of `lanes` (xor shuffles; every lane of the warp
  /// takes part).
  Value warpMax(Value v, ArrayRef<int64_t> lanes) {
    for (int64_t d : lanes)
      v = arith::MaximumFOp::create(
          b, loc, v,
          gpu::ShuffleOp::create(b, loc, v, int32(d), int32(32),
                                 gpu::ShuffleMode::XOR)
              .getShuffleResult());
    return v;
  }

  // -- shared and tensor memory addresses ------------------------------------
  /// Sets smem (the dynamic shared memory, i8) and smemBase (its address).
  void setUpSharedMemory() {
    smem = gpu::DynamicSharedMemoryOp::create(
        b, loc,
        MemRefType::get({ShapedType::kDynamic}, i8(), AffineMap(),
                        gpu::AddressSpaceAttr::get(
                            b.getContext(), gpu::AddressSpace::Workgroup)));
    smemBase = arith::IndexCastOp::create(
        b, loc, i64(),
        memref::ExtractAlignedPointerAsIndexOp::create(b, loc, smem));
  }
  /// A shared-memory pointer `byteOffset` (index) bytes past smemBase.
  Value sharedPtrAt(Value byteOffset) {
    Value addr = arith::AddIOp::create(b, loc, smemBase, toI64(byteOffset));
    return LLVM::IntToPtrOp::create(
        b, loc, LLVM::LLVMPointerType::get(b.getContext(), 3), addr);
  }
  /// The shared::cta address of byte `offset` of the dynamic shared memory.
  Value sharedAddress(int64_t offset) {
    return arith::AddIOp::create(
        b, loc, smemBase, arith::ConstantIntOp::create(b, loc, offset, 64));
  }
  Value sharedPtr(int64_t offset) {
    return LLVM::IntToPtrOp::create(
        b, loc, LLVM::LLVMPointerType::get(b.getContext(), 3),
        sharedAddress(offset));
  }
};

/// Emits the body of the block-scaled grouped GEMM's gpu.launch.
struct KernelEmitter : EmitterBase {
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
                 uint32_t(kTileN >> 3) << 17 | 1u << 23 |
                 uint32_t(kTileM >> 4) << 24 | (j << 29);
    return arith::ConstantIntOp::create(b, loc, int64_t(d), 32);
  }

  // -- one K stage into shared memory ----------------------------------------
  /// Row `r` (of 128), byte `k` (of 128) of a K-major tile at `base`.
  Value tileOffset(int64_t base, Value r, Value k) {
    Value off = add(mul(div(r, 8), idx(kSBO)), mul(div(k, 16), idx(kLBO)));
    off = add(off, add(mul(rem(r, 8), idx(16)), rem(k, 16)));
    return add(off, idx(base));
  }

  void loadStage(Value expert, Value stage) {
    Value k0 = mul(stage, idx(kTileK));
    Value rowsLast = idx(g.rows - 1);
    Value zero8 = int8(0);
    // A: thread t copies byte k0 + t of every row (coalesced); rows past R
    // read as zeros.
    forLoop(0, kTileM, [&](Value r) {
      Value grow = add(m0, r);
      Value bits = loadBits(a, {minS(grow, rowsLast), add(k0, tid)});
      bits = select(cmp(P::slt, grow, idx(g.rows)), bits, zero8);
      storeShared(tileOffset(kSmemA, r, tid), bits);
    });
    // B: thread t copies column n0 + t (row t of the K-major tile) for every
    // k; consecutive threads read consecutive bytes of a row of B.
    forLoop(0, kTileK, [&](Value k) {
      Value bits = loadBits(w, {expert, add(k0, k), add(n0, tid)});
      storeShared(tileOffset(kSmemB, tid, k), bits);
    });
    // Scales: thread t copies A's scales of row m0 + t and B's of column
    // n0 + t, blocks 4 stage .. 4 stage + 3, to byte 16 l + 4 q + j
    // (t = 32 q + l).
    Value sfOffset = add(mul(rem(tid, 32), idx(16)), mul(div(tid, 32), idx(4)));
    Value rowValid = cmp(P::slt, row, idx(g.rows));
    Value safeRow = minS(row, rowsLast);
    for (int64_t j = 0; j < kTileK / kBlock; ++j) {
      Value block = add(mul(stage, idx(kTileK / kBlock)), idx(j));
      Value sa = select(rowValid, loadBits(aScales, {safeRow, block}), zero8);
      storeShared(add(sfOffset, idx(kSmemSFA + j)), sa);
      Value sb = loadBits(wScales, {expert, block, add(n0, tid)});
      storeShared(add(sfOffset, idx(kSmemSFB + j)), sb);
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
          smemDescriptor(smemOffset, /*lbo=*/0, /*sbo=*/kCoreBytes));
    };
    copyScales(kSmemSFA, kTmemSFA);
    copyScales(kSmemSFB, kTmemSFB);
    // tcgen05.cp and tcgen05.mma issued by one thread execute in order: the
    // MMAs see the copied scales without further synchronization.
    Value notFirstStage = cmp(P::ne, stage, idx(0));
    for (int64_t j = 0; j < kTileK / kMmaK; ++j) {
      int64_t kBytes = j * kMmaK; // 2 core matrices along K per MMA
      Value aDesc = smemDescriptor(kSmemA + kBytes / 16 * kLBO, kLBO, kSBO);
      Value bDesc = smemDescriptor(kSmemB + kBytes / 16 * kLBO, kLBO, kSBO);
      Value accumulate = j == 0 ? notFirstStage : boolean(true);
      NVVM::Tcgen05MMABlockScaleOp::create(
          b, loc, NVVM::MMABlockScaleKind::MXF8F6F4, NVVM::CTAGroupKind::CTA_1,
          NVVM::Tcgen05MMABlockScale::DEFAULT,
          NVVM::Tcgen05MMACollectorOp::DISCARD, tmemPtr(nullptr, kTmemAcc),
          aDesc, bDesc, instrDescriptor(j), accumulate,
          tmemPtr(nullptr, kTmemSFA), tmemPtr(nullptr, kTmemSFB));
    }
    NVVM::Tcgen05CommitOp::create(b, loc, sharedPtr(kSmemBarrier),
                                  /*multicastMask=*/Value());
  }

  /// Every thread: its row of the accumulator, stored if it is in the group.
  void storeRow(Value inGroup) {
    NVVM::Tcgen05FenceOp::create(b, loc,
                                 NVVM::Tcgen05FenceKind::AFTER_THREAD_SYNC);
    auto vecType = VectorType::get({32}, i32());
    for (int64_t j = 0; j < kTileN / 32; ++j) {
      Value v = NVVM::Tcgen05LdOp::create(
          b, loc, vecType, /*pack=*/false, NVVM::Tcgen05LdStShape::SHAPE_32X32B,
          tmemPtr(laneBase, kTmemAcc + 32 * j), /*offset=*/Value());
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
    m0 = mul(launch.getBlockIds().x, idx(kTileM));
    n0 = mul(launch.getBlockIds().y, idx(kTileN));
    row = add(m0, tid);
    setUpSharedMemory();
    Value isWarp0 = cmp(P::ult, tid, idx(32));
    Value isLeader = cmp(P::eq, tid, idx(0));

    // Tensor memory (one warp allocates and frees it) and the mbarrier.
    ifThen(isWarp0, [&] {
      NVVM::Tcgen05AllocOp::create(b, loc, sharedPtr(kSmemTmemSlot),
                                   int32(kTmemCols));
      NVVM::Tcgen05RelinquishAllocPermitOp::create(b, loc);
    });
    ifThen(isLeader, [&] {
      NVVM::MBarrierInitOp::create(b, loc, sharedPtr(kSmemBarrier), int32(1),
                                   /*predicate=*/Value());
    });
    NVVM::Tcgen05FenceOp::create(b, loc,
                                 NVVM::Tcgen05FenceKind::BEFORE_THREAD_SYNC);
    NVVM::Barrier0Op::create(b, loc);
    NVVM::Tcgen05FenceOp::create(b, loc,
                                 NVVM::Tcgen05FenceKind::AFTER_THREAD_SYNC);
    tmemBase = LLVM::LoadOp::create(b, loc, i32(), sharedPtr(kSmemTmemSlot));
    // This warp's TMEM lane quarter, in the lane field (bits 16-31).
    laneBase = arith::ShLIOp::create(
        b, loc,
        arith::IndexCastOp::create(b, loc, i32(), mul(div(tid, 32), idx(32))),
        int32(16));

    Value rowsEnd = idx(g.rows);
    Value tileEnd = add(m0, idx(kTileM));
    SmallVector<Value> state = forLoop(
        0, idx(g.experts), {int32(0), boolean(false)},
        [&](Value e, ValueRange carried) -> SmallVector<Value> {
          // Clamped group bounds, as the reference computes them.
          Value lo, hi;
          std::tie(lo, hi) = groupRows(offsets, e, g.rows);
          Value meets =
              cmp(P::slt, maxS(lo, m0), minS(hi, tileEnd)); // CTA-uniform
          return ifElse(
              TypeRange{i32(), i1()}, meets,
              [&]() -> SmallVector<Value> {
                Value phase = forLoop(
                    0, idx(g.k / kTileK), {carried[0]},
                    [&](Value stage, ValueRange ph) -> SmallVector<Value> {
                      loadStage(e, stage);
                      fenceForAsyncProxy();
                      NVVM::Barrier0Op::create(b, loc);
                      ifThen(isLeader, [&] { issueStage(stage); });
                      // The MMAs have read shared memory and written
                      // the accumulator once this phase completes.
                      NVVM::MBarrierTryWaitParityOp::create(
                          b, loc, sharedPtr(kSmemBarrier), ph[0],
                          int32(kWaitTicks));
                      return {arith::XOrIOp::create(b, loc, ph[0], int32(1))};
                    })[0];
                Value inGroup =
                    land(cmp(P::sle, lo, row), cmp(P::slt, row, hi));
                storeRow(inGroup);
                return {phase, lor(carried[1], inGroup)};
              },
              [&]() -> SmallVector<Value> {
                return {carried[0], carried[1]};
              });
        });

    // Rows of the tile in no group are zero.
    Value uncovered =
        land(arith::XOrIOp::create(b, loc, state[1], boolean(true)),
             cmp(P::slt, row, rowsEnd));
    ifThen(uncovered, [&] {
      Value zero = arith::ConstantOp::create(b, loc, b.getF32FloatAttr(0.0));
      forLoop(0, kTileN, [&](Value c) {
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
                                     int32(kTmemCols));
    });
  }
};

/// A kernel's launch: grid, threads per block (along x), dynamic shared
/// memory in bytes.
struct LaunchShape {
  int64_t gridX, gridY, gridZ, threads, smemBytes;
};

/// Tiles of `tile` covering `n`.
int64_t tilesOf(int64_t n, int64_t tile) { return (n + tile - 1) / tile; }

/// A gpu.launch of `shape` (its body empty but for the terminator) that
/// outlining turns into the kernel `name` wherever the function holding it
/// is inlined.
gpu::LaunchOp createNamedLaunch(OpBuilder &b, Location loc,
                                const LaunchShape &shape, StringRef name) {
  auto c = [&](int64_t v) { return arith::ConstantIndexOp::create(b, loc, v); };
  Value one = c(1);
  auto launch = gpu::LaunchOp::create(
      b, loc, c(shape.gridX), c(shape.gridY), c(shape.gridZ), c(shape.threads),
      one, one, arith::ConstantIntOp::create(b, loc, shape.smemBytes, 32));
  auto kernelName = FlatSymbolRefAttr::get(b.getContext(), name);
  launch.setModuleAttr(kernelName);
  launch.setFunctionAttr(kernelName);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(&launch.getBody().front());
  gpu::TerminatorOp::create(b, loc);
  return launch;
}

/// The private function `name`: (tensors `argTypes`) -> `resultType`, whose
/// body takes its arguments as buffers (read only), allocates the result,
/// runs `host(b, buffers, outs)` (host code before the launch, optional), then
/// one gpu.launch of `shape` whose body `emit(b, launch, buffers, out)`
/// writes, and returns the result; marked `moe.dedicated_kernel = what`.
/// An existing function of that name and type is reused.
func::FuncOp getOrCreateKernelCall(
    ModuleOp module, SymbolTable &symbols, StringRef name, StringRef what,
    ArrayRef<Type> argTypes, ArrayRef<RankedTensorType> resultTypes,
    Location loc, LaunchShape shape,
    function_ref<void(OpBuilder &, gpu::LaunchOp, ArrayRef<Value>,
                      ArrayRef<Value>)>
        emit,
    function_ref<void(OpBuilder &, ArrayRef<Value>, ArrayRef<Value>)> host =
        nullptr) {
  MLIRContext *ctx = module.getContext();
  SmallVector<Type> results(resultTypes.begin(), resultTypes.end());
  auto type = FunctionType::get(ctx, argTypes, results);
  if (auto existing = symbols.lookup<func::FuncOp>(name))
    if (existing.getFunctionType() == type &&
        existing->hasAttr("moe.dedicated_kernel"))
      return existing;

  auto func = func::FuncOp::create(loc, name, type);
  func.setPrivate();
  func->setAttr("moe.dedicated_kernel", StringAttr::get(ctx, what));
  symbols.insert(func); // renamed if the name is taken
  OpBuilder b = OpBuilder::atBlockBegin(func.addEntryBlock());
  SmallVector<Value> buffers;
  for (BlockArgument arg : func.getArguments()) {
    auto t = cast<RankedTensorType>(arg.getType());
    buffers.push_back(bufferization::ToBufferOp::create(
        b, loc, MemRefType::get(t.getShape(), t.getElementType()), arg,
        /*read_only=*/true));
  }
  SmallVector<Value> outs;
  for (RankedTensorType t : resultTypes)
    outs.push_back(memref::AllocOp::create(
        b, loc, MemRefType::get(t.getShape(), t.getElementType())));
  if (host)
    host(b, buffers, outs);
  auto launch =
      createNamedLaunch(b, loc, shape, (name + "_kernel").str());
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPoint(launch.getBody().front().getTerminator());
    emit(b, launch, buffers, outs);
  }
  SmallVector<Value> tensors;
  for (auto [t, out] : llvm::zip(resultTypes, outs))
    tensors.push_back(bufferization::ToTensorOp::create(
        b, loc, t, out, /*restrict=*/true, /*writable=*/true));
  func::ReturnOp::create(b, loc, tensors);
  return func;
}

/// getOrCreateKernelCall for a kernel with one result.
func::FuncOp getOrCreateKernelCall(
    ModuleOp module, SymbolTable &symbols, StringRef name, StringRef what,
    ArrayRef<Type> argTypes, RankedTensorType resultType, Location loc,
    LaunchShape shape,
    function_ref<void(OpBuilder &, gpu::LaunchOp, ArrayRef<Value>, Value)>
        emit,
    function_ref<void(OpBuilder &, ArrayRef<Value>, ArrayRef<Value>)> host =
        nullptr) {
  return getOrCreateKernelCall(
      module, symbols, name, what, argTypes, ArrayRef(resultType), loc, shape,
      [&](OpBuilder &b, gpu::LaunchOp launch, ArrayRef<Value> buffers,
          ArrayRef<Value> outs) { emit(b, launch, buffers, outs[0]); },
      host);
}

/// Declares which arguments of a grouped kernel are rows read only inside the
/// groups of the offsets argument (see LiveRows.h): lets the rows past the
/// last group stay unspecified where they are computed.
func::FuncOp withGroupedArgs(func::FuncOp kernel, ArrayRef<unsigned> rows,
                             unsigned offsets) {
  UnitAttr unit = UnitAttr::get(kernel.getContext());
  for (unsigned a : rows)
    kernel.setArgAttr(a, kGroupRowsAttr, unit);
  kernel.setArgAttr(offsets, kGroupOffsetsAttr, unit);
  return kernel;
}

/// The private function computing one grouped GEMM shape (see the header):
/// (A data, A scales, B data, B scales, offsets) -> result.
func::FuncOp getOrCreateKernelFunction(ModuleOp module, SymbolTable &symbols,
                                       const BlockScaledGemm &g,
                                       ArrayRef<Type> argTypes,
                                       RankedTensorType resultType,
                                       Location loc) {
  return withGroupedArgs(getOrCreateKernelCall(
      module, symbols, g.name(), "tcgen05.mma.block_scale mxf8f6f4", argTypes,
      resultType, loc,
      {tilesOf(g.rows, kTileM), g.n / kTileN, 1, kThreads, kSmemBytes},
      [&](OpBuilder &b, gpu::LaunchOp launch, ArrayRef<Value> buf, Value out) {
        KernelEmitter k{{b, loc}, g, buf[0], buf[1], buf[2], buf[3], buf[4],
                        out};
        k.emit(launch);
      }),
                         {0, 1}, 4);
}

//===----------------------------------------------------------------------===//
// Hopper (sm_90a): bf16 grouped GEMM on warpgroup MMA (wgmma)
//===----------------------------------------------------------------------===//
//
// Handles moe.grouped_matmul with bf16 lhs [R, K] and rhs [E, K, N] (or,
// with transpose_rhs, [E, N, K]), f32 result, static shapes, K % 64 == 0,
// N % 128 == 0 (R arbitrary). Anything else keeps the generic path. Shapes
// with N % 256 == 0 and R >= 128 take the TMA kernel below instead (same
// operands and results, the same layouts in shared memory).
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
// (kHStages, kHAhead and kHMmaInFlight below; measured on the H200 at the
// Qwen3 GEMM1 shape: 3/2/0 at 0.64 ms, 3/1/1 0.75, 4/2/1 0.81, 4/3/0 0.84).
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

constexpr int64_t kHTileM = 128;     // rows per CTA: two m64 MMAs
constexpr int64_t kHTileN = 128;     // columns per CTA = MMA N
constexpr int64_t kHTileK = 64;      // K per stage
constexpr int64_t kHMmaM = 64, kHMmaK = 16;
constexpr int64_t kHStages = 3;      // shared-memory ring (2 CTAs an SM)
constexpr int64_t kHAhead = kHStages - 1; // stages loaded ahead
// MMA groups left in flight at the end of an iteration: the buffer refilled
// at iteration it, (it + kHAhead) % kHStages, was read by the MMAs of
// it + kHAhead - kHStages, complete once every thread has passed iteration
// it-1's wait (the barrier): kHAhead + kHMmaInFlight <= kHStages - 1.
constexpr int64_t kHMmaInFlight = kHStages - 1 - kHAhead;
static_assert(kHAhead >= 1 && kHMmaInFlight >= 0, "the ring's schedule");
constexpr int64_t kHThreads = 128;   // one warpgroup
constexpr int64_t kHTileABytes = kHTileM * kHTileK * 2;  // 16384
constexpr int64_t kHTileBBytes = kHTileK * kHTileN * 2;  // 16384
constexpr int64_t kHStageBytes = kHTileABytes + kHTileBBytes;
// The ring and 1 KiB of slack to start it on a 1 KiB boundary (swizzle atoms).
constexpr int64_t kHSmemBytes = kHStages * kHStageBytes + 1024; // 99328
constexpr int64_t kHLBO = 8192; // next 64 MN values (MN-major, swizzled)
constexpr int64_t kHSBO = 1024; // next 8 rows (one swizzle atom)
constexpr int64_t kHAccRegs = kHTileN / 2;     // f32 per thread per MMA half

/// What the Hopper wgmma emitters share: global and shared addresses,
/// cp.async copies, shared-memory matrix descriptors, the accumulator type.
struct HopperEmitterBase : EmitterBase {
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
    return add(tileBase,
               add(mul(row, idx(128)),
                   mul(arith::XOrIOp::create(b, loc, c, rem(row, 8)), idx(16))));
  }
  /// Copies a K-major 128 x 64 bf16 tile (128 rows of 128 bytes) into the
  /// swizzled layout at `tileBase`: thread `tid` copies chunk tid % 8 of rows
  /// tid / 8 + 16 i. `source(row, k)` is the global byte offset (from
  /// `global`) of the row's 8 values from tile column k.
  void copyKMajorTile(Value tid, Value tileBase, Value global,
                      function_ref<Value(Value, Value)> source) {
    Value c = rem(tid, 8), k = mul(c, idx(8));
    for (int64_t i = 0; i < kHTileM * kHTileK / 8 / kHThreads; ++i) {
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
  void copyMNMajorTile(
      Value tid, Value tileBase, Value global,
      function_ref<std::pair<Value, Value>(Value, Value)> source) {
    Value cc = rem(tid, 16);
    Value half = add(tileBase, mul(div(cc, 8), idx(8192)));
    for (int64_t i = 0; i < kHTileK / 8; ++i) {
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
  /// (N from accType), accumulating into `d`.
  Value bf16Mma(Value d, Value aDesc, Value bDesc, NVVM::MMALayout layoutA,
                NVVM::MMALayout layoutB) {
    MLIRContext *ctx = b.getContext();
    int64_t n = 2 * int64_t(accType.getBody().size());
    auto bf16 = NVVM::WGMMATypesAttr::get(ctx, NVVM::WGMMATypes::bf16);
    auto scaleIn = NVVM::WGMMAScaleInAttr::get(ctx, NVVM::WGMMAScaleIn::one);
    return NVVM::WgmmaMmaAsyncOp::create(
        b, loc, accType, d, aDesc, bDesc,
        NVVM::MMAShapeAttr::get(ctx, kHMmaM, n, kHMmaK), bf16, bf16,
        NVVM::WGMMATypesAttr::get(ctx, NVVM::WGMMATypes::f32),
        NVVM::WGMMAScaleOutAttr::get(ctx, NVVM::WGMMAScaleOut::one), scaleIn,
        scaleIn, NVVM::MMALayoutAttr::get(ctx, layoutA),
        NVVM::MMALayoutAttr::get(ctx, layoutB),
        /*satfinite=*/NVVM::MMAIntOverflowAttr());
  }
  /// The bf16 MMA main loop over `nk` (index) stages of 64 reduction
  /// values through the 3-buffer ring (see "Hopper (sm_90a): bf16 grouped
  /// GEMM" for the schedule): `load(kt, slot)` issues stage kt's cp.asyncs
  /// into ring buffer `slot` (A tile first, then B at kHTileABytes, both in
  /// the 128-byte swizzled layouts: setUp(kHLBO, kHSBO, true));
  /// `layoutA` is `row` for a K-major A tile, `col` for an MN-major one;
  /// `layoutB` `col` for a K-major B tile, `row` for an MN-major one.
  /// Returns the two m64n128 accumulators (zeros when nk is 0).
  SmallVector<Value> pipelinedMma(Value nk,
                                  function_ref<void(Value, Value)> load,
                                  NVVM::MMALayout layoutA,
                                  NVVM::MMALayout layoutB) {
    for (int64_t p = 0; p < kHAhead; ++p) {
      ifThen(cmp(P::slt, idx(p), nk), [&] { load(idx(p), idx(p)); });
      NVVM::CpAsyncCommitGroupOp::create(b, loc);
    }
    Value zero = LLVM::ZeroOp::create(b, loc, accType);
    SmallVector<Value> acc = forLoop(
        0, nk, {zero, zero},
        [&](Value it, ValueRange carried) -> SmallVector<Value> {
          NVVM::CpAsyncWaitGroupOp::create(b, loc, kHAhead - 1);
          fenceForAsyncProxy();
          NVVM::Barrier0Op::create(b, loc);
          Value next = add(it, idx(kHAhead));
          ifThen(cmp(P::slt, next, nk),
                 [&] { load(next, rem(next, kHStages)); });
          NVVM::CpAsyncCommitGroupOp::create(b, loc);

          Value slotUnits =
              toI64(mul(rem(it, kHStages), idx(kHStageBytes >> 4)));
          SmallVector<Value> d(carried.begin(), carried.end());
          NVVM::WgmmaFenceAlignedOp::create(b, loc);
          for (int64_t j = 0; j < kHTileK / kHMmaK; ++j) {
            // MMA j's K rows start 32 bytes into each 128-byte row
            // (K-major) or two 8-row atoms further (MN-major).
            int64_t bAt = kHTileABytes +
                          (layoutB == NVVM::MMALayout::row ? 2048 * j : 32 * j);
            Value bDesc = descriptor(slotUnits, bAt);
            for (int64_t h = 0; h < kHTileM / kHMmaM; ++h) {
              // Half h's rows: 64 K-major rows (8 KiB) further, or the
              // next 64-column block of an MN-major A.
              int64_t aAt = layoutA == NVVM::MMALayout::row
                                ? h * kHMmaM * 128 + 32 * j
                                : h * 8192 + 2048 * j;
              d[h] = bf16Mma(d[h], descriptor(slotUnits, aAt), bDesc,
                             layoutA, layoutB);
            }
          }
          NVVM::WgmmaGroupSyncAlignedOp::create(b, loc);
          NVVM::WgmmaWaitGroupSyncOp::create(b, loc, kHMmaInFlight);
          return d;
        });
    NVVM::WgmmaWaitGroupSyncOp::create(b, loc, 0);
    return acc;
  }
  /// The dynamic shared memory, the descriptor base for leading / stride
  /// byte offsets `lbo` / `sbo`, and the m64n128 accumulator type.
  void setUp(int64_t lbo, int64_t sbo, bool swizzled = false,
             int64_t accRegs = kHAccRegs) {
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

/// One bf16 grouped GEMM shape the wgmma kernel handles.
struct WgmmaGemm {
  int64_t rows, k, n, experts;
  Type offsetElt;
  /// The rhs is stored [E, N, K] (transpose_rhs: a data gradient's weights).
  bool rhsTransposed = false;
  /// Nothing reads the result's rows at or past offsets[E] (LiveRows.h): they
  /// are left unwritten instead of zeroed.
  bool liveRowsOnly = false;
  /// The TMA, warp-specialized kernel (N % 256 == 0, R >= 128), else the
  /// cp.async one.
  bool tma = false;
  std::string name() const {
    return llvm::formatv("moe_wgmma_gmm_{0}x{1}x{2}_e{3}_bf16{5}_{4}{6}{7}",
                         rows, k, n, experts,
                         BlockScaledGemm::eltName(offsetElt),
                         rhsTransposed ? "_rhsT" : "",
                         liveRowsOnly ? "_live" : "", tma ? "_tma" : "")
        .str();
  }
};

std::optional<WgmmaGemm> matchWgmmaGemm(GroupedMatmulOp op);

/// Whether `v` can feed a Hopper bf16 kernel: bf16 already, or MX with its
/// blocks along `axis` (the contraction), which dequantizes exactly.
bool bf16OrMXAlong(Value v, unsigned axis) {
  if (auto mx = dyn_cast<MXTensorType>(v.getType()))
    return mx.getAxis() == axis;
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t && t.getElementType().isBF16();
}

/// `v` as bf16: MX operands dequantized (the new op is added to `created`),
/// bf16 ones as they are.
Value toBF16(OpBuilder &b, Location loc, Value v,
             SmallVectorImpl<Operation *> &created) {
  auto mx = dyn_cast<MXTensorType>(v.getType());
  if (!mx)
    return v;
  auto dq = DequantizeOp::create(
      b, loc, RankedTensorType::get(mx.getShape(), b.getBF16Type()), v);
  created.push_back(dq);
  return dq;
}

/// Brings a grouped GEMM to the form the bf16 wgmma kernel takes (bf16
/// operands, rhs [E, K, N]):
/// - Hopper has no block-scaled MMA: an MX operand whose blocks run along K
///   (lhs `axis = 1`; rhs `axis = 1`, or `axis = 2` with `transpose_rhs`)
///   becomes `moe.dequantize` to bf16. The dequantization is exact: an
///   E4M3/E5M2 element has at most 4 significant bits and its scale is a
///   power of two, so `q * 2^e` is a bf16 value (down to bf16's smallest
///   subnormal, 2^-133: scales of 2^-124 (E4M3) / 2^-117 (E5M2) and above,
///   beneath which elements are far below anything a GEMM sums); bf16
///   products are exact in the f32 accumulator.
/// - `transpose_rhs` (the data gradient's rhs [E, N, K]) stays: the kernel
///   reads such an rhs K-major, as wgmma's untransposed B.
/// Only when the resulting GEMM fits the kernel; returns the new op, or
/// nullopt (nothing changed).
std::optional<GroupedMatmulOp> rewriteForWgmma(GroupedMatmulOp op) {
  bool transposed = op.getTransposeRhs();
  bool anyMX = isa<MXTensorType>(op.getLhs().getType()) ||
               isa<MXTensorType>(op.getRhs().getType());
  if (!anyMX || op->getParentOfType<ExpertsOp>())
    return std::nullopt;
  // Each operand: MX with blocks along K (dequantized), or already bf16.
  if (!bf16OrMXAlong(op.getLhs(), 1) ||
      !bf16OrMXAlong(op.getRhs(), transposed ? 2 : 1))
    return std::nullopt;
  OpBuilder b(op);
  Location loc = op.getLoc();
  SmallVector<Operation *> created;
  Value a = toBF16(b, loc, op.getLhs(), created),
        w = toBF16(b, loc, op.getRhs(), created);
  auto gemm = GroupedMatmulOp::create(b, loc, op.getType(), a, w,
                                      op.getOffsets(), transposed);
  if (!matchWgmmaGemm(gemm)) {
    gemm.erase();
    for (Operation *c : llvm::reverse(created))
      c->erase();
    return std::nullopt;
  }
  op.getResult().replaceAllUsesWith(gemm.getResult());
  op.erase();
  return gemm;
}

/// The operand types of a grouped GEMM a Hopper bf16 kernel can take: static
/// bf16 lhs (rank 2) and rhs (rank `rhsRank`), an f32 result of rank
/// `resultRank`, integer offsets; outside moe.experts regions.
struct Bf16GemmTypes {
  RankedTensorType lhs, rhs, offsets, result;
};
std::optional<Bf16GemmTypes> bf16GemmTypes(Operation *op, Value lhsValue,
                                           Value rhsValue, Value offsetsValue,
                                           int64_t rhsRank,
                                           int64_t resultRank) {
  if (op->getParentOfType<ExpertsOp>())
    return std::nullopt;
  auto lhs = dyn_cast<RankedTensorType>(lhsValue.getType());
  auto rhs = dyn_cast<RankedTensorType>(rhsValue.getType());
  auto offsets = dyn_cast<RankedTensorType>(offsetsValue.getType());
  auto result = dyn_cast<RankedTensorType>(op->getResult(0).getType());
  if (!lhs || !rhs || !offsets || !result || lhs.getRank() != 2 ||
      rhs.getRank() != rhsRank || result.getRank() != resultRank ||
      offsets.getRank() != 1 || !lhs.getElementType().isBF16() ||
      !rhs.getElementType().isBF16() || !result.getElementType().isF32() ||
      !lhs.hasStaticShape() || !rhs.hasStaticShape() ||
      !result.hasStaticShape() || !offsets.hasStaticShape() ||
      !offsets.getElementType().isInteger())
    return std::nullopt;
  return Bf16GemmTypes{lhs, rhs, offsets, result};
}

std::optional<WgmmaGemm> matchWgmmaGemm(GroupedMatmulOp op) {
  bool transposed = op.getTransposeRhs();
  std::optional<Bf16GemmTypes> types = bf16GemmTypes(
      op, op.getLhs(), op.getRhs(), op.getOffsets(), /*rhsRank=*/3,
      /*resultRank=*/2);
  if (!types)
    return std::nullopt;
  auto [lhs, rhs, offsets, result] = *types;
  int64_t rows = lhs.getShape()[0], k = lhs.getShape()[1];
  int64_t experts = rhs.getShape()[0], n = rhs.getShape()[transposed ? 1 : 2];
  if (rows < 1 || k < kHTileK || k % kHTileK || n < kHTileN || n % kHTileN ||
      experts < 1 || rhs.getShape()[transposed ? 2 : 1] != k ||
      offsets.getDimSize(0) != experts + 1 || result.getDimSize(0) != rows ||
      result.getDimSize(1) != n)
    return std::nullopt;
  WgmmaGemm g{rows, k, n, experts, offsets.getElementType(), transposed};
  g.tma = n % 256 == 0 && rows >= 128;
  return g;
}

/// Emits the body of the wgmma grouped GEMM's gpu.launch.
struct WgmmaEmitter : HopperEmitterBase {
  const WgmmaGemm &g;
  // Buffers: A [R, K] bf16, B [E, K, N] bf16, offsets [E+1], result [R, N].
  Value a, w, offsets, out;
  Value tid{}, m0{}, n0{}, aGlobal{}, wGlobal{};


  /// Stage `kt` (K values [64 kt, 64 kt + 64)) of expert `e` into ring
  /// buffer `slot` (layouts in the header of this section).
  void loadStage(Value e, Value kt, Value slot) {
    Value stageBase = mul(slot, idx(kHStageBytes));
    Value bBase = add(stageBase, idx(kHTileABytes));
    Value k0 = mul(kt, idx(kHTileK));
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
      return std::make_pair(
          mul(add(mul(krow, idx(g.n)), add(n0, n)), idx(2)), Value());
    });
  }

  SmallVector<Value> kLoop(Value e) {
    // A K-major; B MN-major (`row`: wgmma's transposed B) or, for a
    // transposed rhs, K-major (`col`).
    return pipelinedMma(
        idx(g.k / kHTileK),
        [&](Value kt, Value slot) { loadStage(e, kt, slot); },
        NVVM::MMALayout::row,
        g.rhsTransposed ? NVVM::MMALayout::col : NVVM::MMALayout::row);
  }

  void emit(gpu::LaunchOp launch) {
    tid = launch.getThreadIds().x;
    n0 = mul(launch.getBlockIds().x, idx(kHTileN));
    m0 = mul(launch.getBlockIds().y, idx(kHTileM));
    setUp(kHLBO, kHSBO, /*swizzled=*/true);
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
        rows.push_back(add(rowBase, idx(kHMmaM * hf + 8 * h)));

    Value rowsEnd = idx(g.rows);
    Value tileEnd = add(m0, idx(kHTileM));
    SmallVector<Value> noneCovered(rows.size(), boolean(false));
    SmallVector<Value> covered = forLoop(
        0, idx(g.experts), noneCovered,
        [&](Value e, ValueRange carried) -> SmallVector<Value> {
          Value lo, hi;
          std::tie(lo, hi) = groupRows(offsets, e, g.rows);
          Value meets = cmp(P::slt, maxS(lo, m0), minS(hi, tileEnd));
          SmallVector<Type> types(rows.size(), i1());
          return ifElse(
              types, meets,
              [&]() -> SmallVector<Value> {
                SmallVector<Value> acc = kLoop(e);
                SmallVector<Value> result;
                for (int64_t q = 0; q < int64_t(rows.size()); ++q) {
                  Value r = rows[q];
                  Value inGroup = land(cmp(P::sle, lo, r), cmp(P::slt, r, hi));
                  int64_t hf = q / 2, h = q % 2;
                  ifThen(inGroup, [&] {
                    for (int64_t j = 0; j < kHTileN / 8; ++j)
                      for (int64_t c = 0; c < 2; ++c) {
                        Value v = LLVM::ExtractValueOp::create(
                            b, loc, acc[hf], ArrayRef<int64_t>{4 * j + 2 * h + c});
                        memref::StoreOp::create(
                            b, loc, v, out,
                            ValueRange{r, add(colBase, idx(8 * j + c))});
                      }
                  });
                  result.push_back(lor(carried[q], inGroup));
                }
                // Every warp is done with the ring before the next expert's
                // loads overwrite it.
                NVVM::Barrier0Op::create(b, loc);
                return result;
              },
              [&]() -> SmallVector<Value> {
                return SmallVector<Value>(carried.begin(), carried.end());
              });
        });

    // Rows of the tile in no group are zero (up to offsets[E] only, when
    // nothing reads the rest).
    Value zero = arith::ConstantOp::create(b, loc, b.getF32FloatAttr(0.0));
    Value zeroEnd = g.liveRowsOnly ? groupsEnd(offsets, g.rows) : rowsEnd;
    for (int64_t q = 0; q < int64_t(rows.size()); ++q) {
      Value uncovered =
          land(arith::XOrIOp::create(b, loc, covered[q], boolean(true)),
               cmp(P::slt, rows[q], zeroEnd));
      ifThen(uncovered, [&] {
        for (int64_t j = 0; j < kHTileN / 8; ++j)
          for (int64_t c = 0; c < 2; ++c)
            memref::StoreOp::create(
                b, loc, zero, out,
                ValueRange{rows[q], add(colBase, idx(8 * j + c))});
      });
    }
  }
};

//===----------------------------------------------------------------------===//
// Hopper (sm_90a): bf16 grouped GEMM, TMA and warp-specialized wgmma
//===----------------------------------------------------------------------===//
//
// The forward kernel's shapes with N % 256 == 0 (the expert MLP's GEMMs and
// their data gradients) take this kernel instead of the cp.async one above.
//
// Tiles: 128 rows x 256 columns, K in stages of 64. Tiles are per expert:
// expert e's clamped rows [lo, hi) give ceil((hi - lo) / 128) row tiles of
// N/256 column tiles, numbered expert after expert, row tile after row tile
// (the column tiles of one row tile run side by side: they share the A rows,
// and the few experts in flight share their B in L2). A tile past hi reads
// rows of the next expert (or zeros past R) and stores none of them.
//
// Persistent grid: min(132, tile bound) CTAs; CTA b takes tiles b, b + grid,
// ... Every warpgroup walks the same tile sequence: the expert of a tile is
// found by advancing (expert, its first tile) from the previous tile's, so
// each CTA reads the offsets once over the whole kernel.
//
// Warp specialization, 384 threads:
// - warpgroup 0, thread 0 (the producer) issues the bulk tensor copies: per
//   stage one 128 x 64 box of A (the lhs [R, K]) and the B tile: four 64 x 64
//   boxes of the rhs [E * K, N] (MN-major), or one 256 x 64 box of the
//   transposed rhs [E * N, K] (K-major). The tensor maps are encoded on the
//   host (libmoert's moertTensorMap2D, 128-byte swizzle, zeros outside the
//   array) and read from device memory.
// - warpgroups 1 and 2 (consumers) each own 64 rows of the tile: m64n256k16
//   MMAs, 128 f32 accumulators a thread, then store their rows of the tile
//   while the producer already loads the next tile. The f32 result of the
//   plain GEMMs and the weight gradients leaves through the copy engine: the warpgroup writes 64 x 32 boxes into
//   two staging buffers in the result tensor map's swizzled layout and one
//   thread issues bulk tensor stores, so the warpgroup starts its next tile
//   while the boxes travel (storeBoxes); rows of a warpgroup that crosses
//   its group's end, and the other epilogue results, are stored directly
//   (8-byte vector stores).
// Ring: 4 stages of 48 KiB (A 16 KiB, B 32 KiB) in the 128-byte swizzled
// layouts of the cp.async kernel (the copy engine writes the same pattern:
// it swizzles by address bits, every tile starts on 1 KiB), and two
// mbarriers a stage: `full` (one arrival, the producer's expect-tx of the
// stage's 49152 bytes, then the copies' completion) and `empty` (256
// arrivals: every consumer thread, once the MMAs that read the stage are
// complete). Iteration g of a warpgroup's running count uses stage g % 4 in
// phase (g / 4) % 2; the producer first waits for `empty` in the other
// parity, which a fresh barrier passes at once. Consumers keep one MMA group
// in flight (wgmma.wait_group 1) and release the stage before it.
//
// An MX lhs (TmaGemm::lhsF8, `_<f8>_lhs`: 8-bit elements and E8M0 scales
// with blocks of 32 along K): the producer's box of A is the stage's 128 x 64
// elements (8 KiB, unswizzled 64-byte rows) into the first half of the A
// slot, on a third barrier a stage (`elements`); warps 1-3 of warpgroup 0
// expand them in place into the bf16 tile (see converter()) and arrive on
// `full` (then 97 arrivals: theirs and the producer's expect-tx of the B
// bytes). The consumers are unchanged.
//
// Rows outside [offsets[0], offsets[E]) (clamped) are zeroed first by all
// threads (up to offsets[E] only in the `_live` variant). Offsets are a
// dispatch's: nondecreasing; rows where decreasing offsets make groups
// overlap are written by each of them, in no set order.
//
// Numerics: the forward kernel's (bf16 products, f32 accumulation in the
// tensor core's order).

constexpr int64_t kTTileM = 128;  // two consumer warpgroups of m64
constexpr int64_t kTTileN = 256;  // MMA N
constexpr int64_t kTTileK = 64;   // one 128-byte swizzle row of bf16
constexpr int64_t kTStages = 4;
constexpr int64_t kTThreads = 384; // producer warpgroup + two consumers
constexpr int64_t kTConsumerThreads = 256;
constexpr int64_t kTTileABytes = kTTileM * kTTileK * 2; // 16384
constexpr int64_t kTTileBBytes = kTTileK * kTTileN * 2; // 32768
constexpr int64_t kTStageBytes = kTTileABytes + kTTileBBytes;
constexpr int64_t kTBarriers = kTStages * kTStageBytes; // 8-byte mbarriers
constexpr int64_t kTSmemBytes = kTBarriers + 2 * kTStages * 8 + 1024;
// The f32 result's staging buffers (kernels without a SwiGLU epilogue; see
// storeBoxes): per consumer warpgroup two boxes of 64 rows x 32 columns
// (8 KiB, the 128-byte swizzled layout of the result's tensor map), 1 KiB
// aligned after the barriers. 231424 bytes in all with the alignment slack,
// within the 232448 (227 KiB) a CTA may have.
constexpr int64_t kTBoxColumns = 32;
constexpr int64_t kTBoxBytes = kHMmaM * kTBoxColumns * 4;
constexpr int64_t kTStagingAt = kTBarriers + 1024;
constexpr int64_t kTStagingBytes = 2 * 2 * kTBoxBytes;
constexpr int64_t kTStoreSmemBytes = kTStagingAt + kTStagingBytes + 1024;
// Named barriers of one consumer warpgroup (0 is __syncthreads, 1 both
// consumers, 2-5 the columnwise epilogue's warp pairs).
constexpr int64_t kTWarpgroupBarrier = 6;
// Within the dynamic shared memory a Hopper CTA may have (227 KiB), and the
// staging boxes clear of the barriers (the SwiGLU kernels' amax slots start
// right after them, but those kernels stage nothing).
static_assert(kTStoreSmemBytes <= 232448, "TMA kernel: shared memory");
static_assert(kTStagingAt >= kTBarriers + 2 * kTStages * 8 &&
                  kTStagingAt % 1024 == 0,
              "TMA kernel: staging boxes after the barriers, 1 KiB aligned");
// An 8-bit lhs (TmaGemm::lhsF8): per stage its 128 x 64 elements (8 KiB,
// unswizzled 64-byte rows) land in the A slot, and warps 1-3 of the
// producer warpgroup expand them there into the bf16 tile (units of 16
// elements: a quarter of a row); a third mbarrier a stage after the other
// two, and a named barrier for the converters.
constexpr int64_t kTTileAF8Bytes = kTTileM * kTTileK;
constexpr int64_t kTConverters = 96;
constexpr int64_t kTConvertUnits = kTTileM * kTTileK / 16;
constexpr int64_t kTConverterBarrier = 8;
// Registers a thread (setmaxnreg; 64K a CTA): the SwiGLU kernels' producer
// warpgroup keeps 40 and its consumers get 232; with an 8-bit lhs the
// producer warpgroup keeps 120 (the converters spill below that) and the
// consumers get 184.
constexpr int64_t kTProducerRegs = 40, kTSwigluConsumerRegs = 232;
constexpr int64_t kTConverterRegs = 120, kTConverterConsumerRegs = 184;
static_assert(128 * kTProducerRegs + 256 * kTSwigluConsumerRegs <= 65536 &&
                  128 * kTConverterRegs + 256 * kTConverterConsumerRegs <=
                      65536,
              "TMA kernel: the register split");
static_assert(kTBarriers + 3 * kTStages * 8 <= kTStagingAt,
              "TMA kernel: the 8-bit lhs's barriers before the staging boxes");
// Persistent CTAs: the SM count of an H100 / H200 SXM (on a GPU with fewer
// SMs the last wave is simply shorter).
constexpr int64_t kTCtas = 132;
// The SwiGLU epilogue's MX blocks: 8 values in each of 4 lanes.
constexpr int64_t kTSwigluBlock = 32;
// The backward epilogue's columnwise MX blocks (see SwigluEpilogue::col):
// each consumer warp's column amaxes of its 16 rows, 64 f32 a block of 8
// columns x 2 halves x 4 lanes, in two slots (blocks alternate), handed to
// the other warp of its 32-row pair.
constexpr int64_t kTColSlotBytes = 64 * 4;
constexpr int64_t kTColAmaxAt = kTBarriers + 2 * kTStages * 8;
constexpr int64_t kTColAmaxBytes = 8 * 2 * kTColSlotBytes;
static_assert(kTSmemBytes + kTColAmaxBytes <= 232448,
              "TMA kernel: shared memory (columnwise epilogue)");

/// A SwiGLU epilogue, forward or backward, for w1's split layout (gate
/// columns [0, F), up columns [F, 2F)); blocks of 32 along the rows, element
/// type `f8`, scale rule `mode`.
/// - Forward, of h = x @ w1 ([R, 2F]): the kernel's first result is the MX
///   rounding of a = swiglu(h) as bf16 [R, F] (the next GEMM's exact
///   operand); optionally also h (f32 [R, 2F], `keepH`) and a (f32 [R, F],
///   `keepF32`), in that order, for other users, then, with `col`, a's
///   columnwise MX rounding as bf16 [R, F] (blocks of 32 rows, the second
///   GEMM's weight-gradient operand; as the backward's below). With `mx`,
///   the first result is instead the MX encoding itself, as two results:
///   its elements [R, F] (type `f8`) and E8M0 scales [R, F / 32], for GEMMs
///   that read the 8-bit operand (TmaGemm::lhsF8); the backward's likewise
///   ([R, 2F], [R, 2F / 32]).
/// - Backward (`grad`), of da = dy @ w2^T ([R, F], transpose_rhs), given h as
///   the kernel's fourth argument: the first result is the MX rounding of
///   dh = swiglu_grad(h, da) as bf16 [R, 2F] (the data gradient's exact
///   operand); optionally also dh (f32, `keepF32`), then dh's MX rounding
///   with blocks of 32 rows (`col`: format `colF8`, rule `colMode`; the
///   weight gradient's exact operand) as bf16 [R, 2F]. The columnwise blocks
///   are the whole array's (rows 32 q .. 32 q + 31), which the tiles hold
///   whole only when every group starts at a multiple of 32: the caller
///   proves that (a dispatch's pad_to).
struct SwigluEpilogue {
  bool grad = false;
  Type f8;
  ScaleMode mode;
  bool keepH = false, keepF32 = false;
  bool mx = false;
  bool col = false;
  Type colF8;
  ScaleMode colMode = ScaleMode::rceil;
  std::string name() const {
    std::string colName =
        col ? llvm::formatv("_col_{0}_{1}", BlockScaledGemm::eltName(colF8),
                            stringifyScaleMode(colMode))
                  .str()
            : "";
    return llvm::formatv("_{0}_{1}_{2}{3}{4}{5}{6}",
                         grad ? "swiglu_grad" : "swiglu",
                         BlockScaledGemm::eltName(f8),
                         stringifyScaleMode(mode), mx ? "_mx" : "",
                         keepH ? "_h" : "",
                         keepF32 ? (grad ? "_dh" : "_a") : "", colName)
        .str();
  }
};

/// What the TMA kernel computes: a grouped GEMM (forward or data gradient)
/// or a grouped weight gradient, and its shape.
struct TmaGemm {
  int64_t rows, k, n, experts;
  bool rhsTransposed = false, liveRowsOnly = false;
  /// result[e] = lhs[lo:hi]^T @ rhs[lo:hi] ([E, K, N], contraction over the
  /// group's rows) instead of result[r] = lhs[r] @ rhs[e].
  bool wgrad = false;
  /// Forward with rhs [E, K, N], or backward with transpose_rhs.
  std::optional<SwigluEpilogue> swiglu;
  /// The lhs is an MX operand with blocks of 32 along K (forward and data
  /// gradient kernels without an epilogue): its elements of this type and
  /// its E8M0 scales, dequantized to bf16 in shared memory (see
  /// WgmmaTmaEmitter::converter); null for a bf16 lhs.
  Type lhsF8{};
  /// The arguments: lhs (elements, scales with lhsF8), rhs, offsets[, h].
  unsigned rhsArg() const { return lhsF8 ? 2 : 1; }
  unsigned offsetsArg() const { return rhsArg() + 1; }
};

/// Whether the kernel stores its f32 result [rows, N] through the copy engine
/// (the staging boxes): the plain GEMMs and weight gradients. (The forward
/// SwiGLU epilogue's h through them measured 3% slower: its other stores
/// stay direct, and the boxes' barriers come on top.)
bool stagesF32(const TmaGemm &g) { return !g.swiglu; }

/// Emits the body of the TMA grouped GEMM's gpu.launch.
struct WgmmaTmaEmitter : HopperEmitterBase {
  const TmaGemm &g;
  // Buffers: offsets [E+1], result; device addresses of the tensor maps of
  // A and B (host values, i64).
  Value offsets, out, mapA, mapB;
  // The SwiGLU epilogue's optional results h and the f32 values it rounds
  // (null if not kept), the backward's columnwise rounding (null if not
  // computed), and the backward's h argument; `out` is then the MX-rounded
  // result.
  Value outH{}, outF32{}, outCol{}, inH{};
  // The 8-bit lhs's scales (TmaGemm::lhsF8), the forward epilogue's MX
  // scales (SwigluEpilogue::mx; `out` holds the elements); else null.
  Value scalesA{}, outScales{};
  // The tensor map (boxes of 64 rows x 32 columns) of the f32 result the
  // copy engine stores (see stagesF32); null if none.
  Value mapOut{};
  Value tid{};

  /// One output tile: expert e with clamped rows [lo, hi); the tile's first
  /// row (forward: of the result; weight gradient: of result[e], a K index)
  /// and column; its K stages of 64.
  struct Tile {
    Value e, lo, hi, m0, n0, stages;
  };

  Value i32Of(Value index) {
    return arith::IndexCastOp::create(b, loc, i32(), index);
  }
  Value fullBarrier(Value s) {
    return sharedPtrAt(add(idx(kTBarriers), mul(s, idx(8))));
  }
  Value emptyBarrier(Value s) {
    return sharedPtrAt(add(idx(kTBarriers + kTStages * 8), mul(s, idx(8))));
  }
  /// With an 8-bit lhs: the stage's A elements have landed (one arrival,
  /// the producer's expect-tx of their 8192 bytes).
  Value elementsBarrier(Value s) {
    return sharedPtrAt(
        add(idx(kTBarriers + 2 * kTStages * 8), mul(s, idx(8))));
  }
  /// Waits for the phase of parity `parity` (index 0/1) of barrier `bar`.
  void wait(Value bar, Value parity) {
    NVVM::MBarrierTryWaitParityOp::create(b, loc, bar, i32Of(parity),
                                          int32(kWaitTicks));
  }
  Value ceilDiv(Value x, int64_t d) { return div(add(x, idx(d - 1)), d); }
  Value columnTiles() { return idx(g.n / kTTileN); }
  /// Forward: expert e's tiles.
  Value tilesOfExpert(Value e) {
    Value lo, hi;
    std::tie(lo, hi) = groupRows(offsets, e, g.rows);
    return mul(ceilDiv(arith::SubIOp::create(b, loc, hi, lo), kTTileM),
               columnTiles());
  }
  /// Forward: the expert of tile `tile` and its first tile, advancing from
  /// (e, base) (an earlier tile's); e == E when `tile` is past the last.
  std::pair<Value, Value> locate(Value tile, Value e, Value base) {
    Type index = b.getIndexType();
    auto w = scf::WhileOp::create(
        b, loc, TypeRange{index, index}, ValueRange{e, base},
        [&](OpBuilder &, Location, ValueRange args) {
          Value inRange = cmp(P::slt, args[0], idx(g.experts));
          Value e1 = minS(args[0], idx(g.experts - 1));
          Value past = cmp(P::sge, tile, add(args[1], tilesOfExpert(e1)));
          scf::ConditionOp::create(b, loc, land(inRange, past), args);
        },
        [&](OpBuilder &, Location, ValueRange args) {
          Value next = add(args[1], tilesOfExpert(args[0]));
          scf::YieldOp::create(b, loc, ValueRange{add(args[0], idx(1)), next});
        });
    return {w.getResult(0), w.getResult(1)};
  }
  /// The persistent tile loop: body(tile, g0) for each of this CTA's tiles,
  /// g0 the running stage count at its start (index); the body returns the
  /// count after it.
  void tileLoop(Value grid, function_ref<Value(const Tile &, Value)> body) {
    Type index = b.getIndexType();
    Value first = gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
    if (g.wgrad) {
      // Tiles e * tilesPerExpert + (K tile) * N/256 + (N tile).
      int64_t perExpert = g.k / kTTileM * (g.n / kTTileN);
      auto loop = scf::ForOp::create(b, loc, first, idx(g.experts * perExpert),
                                     grid, ValueRange{idx(0)});
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(loop.getBody());
      Value tile = loop.getInductionVar();
      Value e = div(tile, perExpert), local = rem(tile, perExpert);
      Value lo, hi;
      std::tie(lo, hi) = groupRows(offsets, e, g.rows);
      Tile t{e,
             lo,
             hi,
             mul(div(local, g.n / kTTileN), idx(kTTileM)),
             mul(rem(local, g.n / kTTileN), idx(kTTileN)),
             ceilDiv(arith::SubIOp::create(b, loc, hi, lo), kTTileK)};
      scf::YieldOp::create(b, loc, body(t, loop.getRegionIterArgs()[0]));
      return;
    }
    scf::WhileOp::create(
        b, loc, TypeRange{index, index, index, index},
        ValueRange{first, idx(0), idx(0), idx(0)},
        [&](OpBuilder &, Location, ValueRange args) {
          auto [e, base] = locate(args[0], args[1], args[2]);
          scf::ConditionOp::create(b, loc, cmp(P::slt, e, idx(g.experts)),
                                   ValueRange{args[0], e, base, args[3]});
        },
        [&](OpBuilder &, Location, ValueRange args) {
          Value tile = args[0], e = args[1], base = args[2];
          Value lo, hi;
          std::tie(lo, hi) = groupRows(offsets, e, g.rows);
          Value local = arith::SubIOp::create(b, loc, tile, base);
          Tile t{e,
                 lo,
                 hi,
                 add(lo, mul(div(local, g.n / kTTileN), idx(kTTileM))),
                 mul(rem(local, g.n / kTTileN), idx(kTTileN)),
                 idx(g.k / kTTileK)};
          Value count = body(t, args[3]);
          scf::YieldOp::create(b, loc,
                               ValueRange{add(tile, grid), e, base, count});
        });
  }
  void tmaLoad(Value dst, Value map, Value x, Value y, Value bar) {
    Value desc = LLVM::IntToPtrOp::create(
        b, loc, LLVM::LLVMPointerType::get(b.getContext()), map);
    // The CTA's own shared memory, addressed as shared::cluster.
    dst = LLVM::AddrSpaceCastOp::create(
        b, loc, LLVM::LLVMPointerType::get(b.getContext(), 7), dst);
    NVVM::CpAsyncBulkTensorGlobalToSharedClusterOp::create(
        b, loc, dst, desc, ValueRange{i32Of(x), i32Of(y)}, bar, ValueRange{},
        Value(), Value(), NVVM::TMALoadMode::TILE, /*isCTAOnly=*/false,
        NVVM::CTAGroupKindAttr(), Value());
  }

  void producer(Value grid) {
    tileLoop(grid, [&](const Tile &t, Value g0) {
      forLoop(0, t.stages, {}, [&](Value kt, ValueRange) {
        Value it = add(g0, kt);
        Value s = rem(it, kTStages);
        wait(emptyBarrier(s), rem(add(div(it, kTStages), idx(1)), 2));
        Value full = fullBarrier(s);
        NVVM::MBarrierArriveExpectTxOp::create(
            b, loc, Type(), full,
            int32(g.lhsF8 ? kTTileBBytes : kTStageBytes),
            NVVM::MemScopeKind::CTA, /*relaxed=*/false, Value());
        Value stage = mul(s, idx(kTStageBytes));
        Value bTile = add(stage, idx(kTTileABytes));
        Value k0 = mul(kt, idx(kTTileK));
        if (g.wgrad) {
          // Rows lo + 64 kt .. + 64 of lhs [R, K] (columns m0 .. + 128, two
          // 64-column blocks) and rhs [R, N] (columns n0 .. + 256, four).
          Value row = add(t.lo, k0);
          for (int64_t q = 0; q < kTTileM / 64; ++q)
            tmaLoad(sharedPtrAt(add(stage, idx(8192 * q))), mapA,
                    add(t.m0, idx(64 * q)), row, full);
          for (int64_t q = 0; q < kTTileN / 64; ++q)
            tmaLoad(sharedPtrAt(add(bTile, idx(8192 * q))), mapB,
                    add(t.n0, idx(64 * q)), row, full);
          return SmallVector<Value>{};
        }
        if (g.lhsF8) {
          // The 128 x 64 elements (8 KiB) into the stage's A slot, where
          // the converters expand them in place.
          Value landed = elementsBarrier(s);
          NVVM::MBarrierArriveExpectTxOp::create(
              b, loc, Type(), landed, int32(kTTileAF8Bytes),
              NVVM::MemScopeKind::CTA, /*relaxed=*/false, Value());
          tmaLoad(sharedPtrAt(stage), mapA, k0, t.m0, landed);
        } else {
          tmaLoad(sharedPtrAt(stage), mapA, k0, t.m0, full);
        }
        if (g.rhsTransposed) {
          // [E * N, K]: rows e * N + n0 .. + 256.
          tmaLoad(sharedPtrAt(bTile), mapB, k0,
                  add(mul(t.e, idx(g.n)), t.n0), full);
        } else {
          // [E * K, N]: four 64-column blocks of K rows e * K + k0 .. + 64.
          // SwiGLU: 128 gate columns (from n0 / 2) then the 128 up columns
          // of the same outputs (F further).
          Value krow = add(mul(t.e, idx(g.k)), k0);
          for (int64_t q = 0; q < kTTileN / 64; ++q) {
            Value column = add(t.n0, idx(64 * q));
            if (g.swiglu && !g.swiglu->grad)
              column = add(div(t.n0, 2),
                           idx(64 * (q % 2) + (q / 2) * (g.n / 2)));
            tmaLoad(sharedPtrAt(add(bTile, idx(8192 * q))), mapB, column,
                    krow, full);
          }
        }
        return SmallVector<Value>{};
      });
      return add(g0, t.stages);
    });
  }

  /// With an 8-bit lhs (g.lhsF8), warps 1-3 of the producer warpgroup: the
  /// copy engine puts each stage's 128 x 64 A elements into the first 8 KiB
  /// of the stage's A slot (64-byte rows, unswizzled), and these 96 threads
  /// expand them in place into the bf16 tile the MMAs read (the bf16 lhs's
  /// 128-byte swizzled layout, 16 KiB): each loads its units (16 elements,
  /// quarter q of row r; unit u = 4 r + q, thread t's are t, t + 96, ...),
  /// the 96 meet (named barrier) so that no write lands on elements still
  /// unread, and each writes its units' 16 bf16 values (chunks 2 q, 2 q + 1
  /// of row r). A value is the dequantize kernel's (decodeF8Pair: exact
  /// f8 -> f16, times the block's scale in f32, rounded once to bf16), so
  /// the MMAs see exactly the bf16 operand this kernel would otherwise read.
  /// A unit's scale (block 2 kt + q / 2 of its row) is loaded from global
  /// memory a stage ahead; rows past R (the copy's zeros) take scale byte
  /// 0. Each thread then fences its writes for the tensor cores
  /// and arrives on the stage's `full` barrier (the producer's expect-tx of
  /// the B bytes and these 96 arrivals).
  void converter(Value grid) {
    Value ct = arith::SubIOp::create(b, loc, tid, idx(32));
    Value sBase = baseAddress(scalesA);
    int64_t blocksPerRow = g.k / kTSwigluBlock;
    int64_t rounds = tilesOf(kTConvertUnits, kTConverters);
    Type bf16 = b.getBF16Type();
    // Thread ct's units (the same in every stage): u = ct + 96 i, row u / 4,
    // quarter u % 4 (the last round's spare threads repeat the last unit,
    // unstored).
    SmallVector<Value> rows, quarters;
    for (int64_t i = 0; i < rounds; ++i) {
      Value u = minS(add(ct, idx(kTConverters * i)), idx(kTConvertUnits - 1));
      rows.push_back(div(u, 4));
      quarters.push_back(rem(u, 4));
    }
    // The units' scale bytes in stage kt of the tile from row m0.
    auto loadScales = [&](Value m0, Value kt) {
      SmallVector<Value> scales;
      for (int64_t i = 0; i < rounds; ++i) {
        Value row = add(m0, rows[i]);
        Value at = add(mul(minS(row, idx(g.rows - 1)), idx(blocksPerRow)),
                       add(mul(kt, idx(kTTileK / kTSwigluBlock)),
                           div(quarters[i], 2)));
        Value byte = LLVM::LoadOp::create(b, loc, i8(), globalPtr(sBase, at));
        scales.push_back(select(cmp(P::slt, row, idx(g.rows)), byte, int8(0)));
      }
      return scales;
    };
    tileLoop(grid, [&](const Tile &t, Value g0) {
      // The next stage's scales are loaded while this one converts.
      forLoop(0, t.stages, loadScales(t.m0, idx(0)),
              [&](Value kt, ValueRange carried) {
        Value it = add(g0, kt);
        Value s = rem(it, kTStages);
        Value stage = mul(s, idx(kTStageBytes));
        SmallVector<Value> scales(carried.begin(), carried.end()), elements;
        SmallVector<Value> next = loadScales(
            t.m0, minS(add(kt, idx(1)), idx(g.k / kTTileK - 1)));
        wait(elementsBarrier(s), rem(div(it, kTStages), 2));
        for (int64_t i = 0; i < rounds; ++i)
          elements.push_back(LLVM::LoadOp::create(
              b, loc, VectorType::get({16}, i8()),
              sharedPtrAt(add(stage, add(mul(rows[i], idx(kTTileK)),
                                         mul(quarters[i], idx(16))))),
              /*alignment=*/16));
        NVVM::BarrierOp::create(b, loc, Type(), int32(kTConverterBarrier),
                                int32(kTConverters),
                                NVVM::BarrierReductionAttr(), Value());
        for (int64_t i = 0; i < rounds; ++i) {
          auto expand = [&] {
            Value scale = buildScaleValue(b, loc, scales[i]);
            SmallVector<Value> values;
            for (int64_t p = 0; p < 8; ++p) {
              Value pair = LLVM::ShuffleVectorOp::create(
                  b, loc, elements[i], elements[i],
                  ArrayRef<int32_t>{int32_t(2 * p), int32_t(2 * p + 1)});
              llvm::append_range(values, decodeF8Pair(pair, g.lhsF8,
                                                      {scale, scale}, bf16));
            }
            for (int64_t h = 0; h < 2; ++h) {
              LLVM::StoreOp::create(
                  b, loc, vectorOf(ArrayRef(values).slice(8 * h, 8)),
                  sharedPtrAt(swizzledChunk(
                      stage, rows[i], add(mul(quarters[i], idx(2)), idx(h)))),
                  /*alignment=*/16);
            }
          };
          if (kTConverters * (i + 1) <= kTConvertUnits)
            expand();
          else
            ifThen(cmp(P::slt, add(ct, idx(kTConverters * i)),
                       idx(kTConvertUnits)),
                   expand);
        }
        fenceForAsyncProxy();
        NVVM::MBarrierArriveOp::create(b, loc, Type(), fullBarrier(s), Value());
        return next;
      });
      return add(g0, t.stages);
    });
  }

  /// Weight gradient: zeros rows [valid, 64) of the stage at byte `stage`
  /// (rows of the next expert, which the copy brought in) in the blocks
  /// consumer `c` reads alone: its A block and half of B's. Then every
  /// consumer thread's writes reach the tensor cores (proxy fence) before
  /// either warpgroup's MMAs (barrier 1, the 256 consumer threads).
  void zeroStageTail(Value stage, Value valid, Value c) {
    Value local = rem(tid, 128);
    Value zero = LLVM::ZeroOp::create(b, loc, VectorType::get({4}, i32()));
    // 16-byte chunks of 64 rows x 128 bytes: chunk u is row u / 8, bytes
    // 16 (u % 8) (whole rows, so the swizzle does not matter).
    for (int64_t blk = 0; blk < 3; ++blk) {
      Value blockAt =
          blk == 0 ? add(stage, mul(c, idx(8192)))
                   : add(stage, add(idx(kTTileABytes + 8192 * (blk - 1)),
                                    mul(c, idx(2 * 8192))));
      strideLoop(add(mul(valid, idx(8)), local), idx(64 * 8), 128,
                 [&](Value u) {
                   LLVM::StoreOp::create(
                       b, loc, zero, sharedPtrAt(add(blockAt, mul(u, idx(16)))),
                       /*alignment=*/16);
                 });
    }
    fenceForAsyncProxy();
    NVVM::BarrierOp::create(b, loc, Type(), int32(1),
                            int32(kTConsumerThreads),
                            NVVM::BarrierReductionAttr(), Value());
  }

  void consumer(Value grid, Value c) {
    Value local = rem(tid, 128);
    Value warp = div(local, 32), lane = rem(local, 32);
    Value outBase = baseAddress(out);
    // A: K-major (forward) or MN-major (weight gradient: the lhs's rows run
    // along the contraction); B: MN-major, or K-major for a transposed rhs.
    auto layoutA = g.wgrad ? NVVM::MMALayout::col : NVVM::MMALayout::row;
    auto layoutB =
        g.rhsTransposed ? NVVM::MMALayout::col : NVVM::MMALayout::row;
    tileLoop(grid, [&](const Tile &t, Value g0) {
      Value zero = LLVM::ZeroOp::create(b, loc, accType);
      SmallVector<Value> acc = forLoop(
          0, t.stages, {zero}, [&](Value kt, ValueRange carried) {
            Value it = add(g0, kt);
            Value s = rem(it, kTStages);
            wait(fullBarrier(s), rem(div(it, kTStages), 2));
            Value stage = mul(s, idx(kTStageBytes));
            if (g.wgrad) {
              Value valid = arith::SubIOp::create(
                  b, loc, t.hi, add(t.lo, mul(kt, idx(kTTileK))));
              ifThen(cmp(P::slt, valid, idx(kTTileK)),
                     [&] { zeroStageTail(stage, valid, c); });
            }
            Value slotUnits = toI64(div(stage, 16));
            // This warpgroup's 64 rows of A: the second 64 (K-major) rows
            // or the second 64-column block (MN-major), 8 KiB further.
            Value aUnits = toI64(mul(c, idx(8192 >> 4)));
            Value d = carried[0];
            NVVM::WgmmaFenceAlignedOp::create(b, loc);
            for (int64_t j = 0; j < kTTileK / kHMmaK; ++j) {
              int64_t aAt = g.wgrad ? 2048 * j : 32 * j;
              Value aDesc = arith::AddIOp::create(
                  b, loc, descriptor(slotUnits, aAt), aUnits);
              int64_t bAt = kTTileABytes +
                            (g.rhsTransposed ? 32 * j : 2048 * j);
              d = bf16Mma(d, aDesc, descriptor(slotUnits, bAt), layoutA,
                          layoutB);
            }
            NVVM::WgmmaGroupSyncAlignedOp::create(b, loc);
            NVVM::WgmmaWaitGroupSyncOp::create(b, loc, 1);
            // The previous stage's MMAs are complete: hand it back.
            ifThen(cmp(P::ugt, kt, idx(0)), [&] {
              NVVM::MBarrierArriveOp::create(
                  b, loc, Type(),
                  emptyBarrier(rem(add(it, idx(kTStages - 1)), kTStages)),
                  Value());
            });
            return SmallVector<Value>{d};
          });
      NVVM::WgmmaWaitGroupSyncOp::create(b, loc, 0);
      ifThen(cmp(P::ugt, t.stages, idx(0)), [&] {
        Value last = add(g0, add(t.stages, idx(-1)));
        NVVM::MBarrierArriveOp::create(
            b, loc, Type(), emptyBarrier(rem(last, kTStages)), Value());
      });

      // Register 4 j + 2 h + c of the m64n256 accumulator: row 16 w + l/4
      // + 8 h of this warpgroup's 64, columns 8 j + 2 (l%4) + c.
      Value rowBase = add(add(t.m0, mul(c, idx(kHMmaM))),
                          add(mul(warp, idx(16)), div(lane, 4)));
      if (g.swiglu) {
        if (g.swiglu->grad)
          storeSwigluGrad(t, acc[0], rowBase, c, warp, lane);
        else
          storeSwiglu(t, acc[0], rowBase, c, warp, lane);
        return add(g0, t.stages);
      }
      // Whole 64-row halves (every half of a weight gradient) go through
      // the copy engine; the half that crosses the group's end stores its
      // rows before it directly.
      Value first = add(t.m0, mul(c, idx(kHMmaM)));
      auto boxes = [&] {
        storeBoxes(
            acc[0], mapOut, g.wgrad ? add(mul(t.e, idx(g.k)), first) : first,
            [&](int64_t q) { return add(t.n0, idx(kTBoxColumns * q)); }, c,
            warp, lane);
      };
      if (g.wgrad) {
        boxes();
        return add(g0, t.stages);
      }
      ifElseVoid(
          cmp(P::sle, add(first, idx(kHMmaM)), t.hi), boxes,
          [&] {
            Value colBase = add(t.n0, mul(rem(lane, 4), idx(2)));
            for (int64_t h = 0; h < 2; ++h) {
              Value row = add(rowBase, idx(8 * h));
              ifThen(cmp(P::slt, row, t.hi), [&] {
                Value rowAt = add(mul(row, idx(g.n)), colBase);
                for (int64_t j = 0; j < kTTileN / 8; ++j)
                  storePair(outBase, add(rowAt, idx(8 * j)),
                            accAt(acc[0], 4 * j + 2 * h),
                            accAt(acc[0], 4 * j + 2 * h + 1), b.getF32Type());
              });
            }
          });
      return add(g0, t.stages);
    });
    // The last boxes' stores are complete before the CTA's shared memory
    // goes.
    if (mapOut)
      ifThen(cmp(P::eq, local, idx(0)), [&] {
        NVVM::CpAsyncBulkWaitGroupOp::create(b, loc, 0, UnitAttr());
      });
  }

  /// Register `i` of an accumulator (the NVVM op's struct of f32).
  Value accAt(Value acc, int64_t i) {
    return LLVM::ExtractValueOp::create(b, loc, acc, ArrayRef<int64_t>{i});
  }

  /// Stores consumer `c`'s 64 x 256 accumulators (its rows from `first`)
  /// through the copy engine into the f32 array of tensor map `map`, rows
  /// from `outRow`, box q (registers 4 j + 2 h + cc, j in [4 q, 4 q + 4)) at
  /// column `column(q)`: 8 boxes of 32 columns, alternating between the
  /// warpgroup's two staging buffers: wait until the store that last read the buffer
  /// (two boxes ago) has read it, write the box (the map's 128-byte swizzle:
  /// 16-byte chunk k of row r at chunk k ^ (r % 8); a warp's 8-byte stores
  /// cover every bank twice), fence the writes for the copy engine, and one
  /// thread issues the store. The warpgroup then moves on to its next tile
  /// while the boxes travel.
  void storeBoxes(Value acc, Value map, Value outRow,
                  function_ref<Value(int64_t)> column, Value c, Value warp,
                  Value lane) {
    Value local = rem(tid, 128);
    Value leader = cmp(P::eq, local, idx(0));
    Value barrier = i32Of(add(c, idx(kTWarpgroupBarrier)));
    auto sync = [&] {
      NVVM::BarrierOp::create(b, loc, Type(), barrier, int32(128),
                              NVVM::BarrierReductionAttr(), Value());
    };
    Value staging = add(idx(kTStagingAt), mul(c, idx(2 * kTBoxBytes)));
    for (int64_t q = 0; q < kTTileN / kTBoxColumns; ++q) {
      Value box = add(staging, idx((q % 2) * kTBoxBytes));
      ifThen(leader, [&] {
        NVVM::CpAsyncBulkWaitGroupOp::create(b, loc, 1,
                                             UnitAttr::get(b.getContext()));
      });
      sync();
      for (int64_t h = 0; h < 2; ++h) {
        // Row r of the box (this thread's row of the accumulator), columns
        // 8 jj + 2 (l%4) + {0, 1}: bytes 32 jj + 8 (l%4), chunk 2 jj +
        // (l%4) / 2.
        Value r = add(add(mul(warp, idx(16)), div(lane, 4)), idx(8 * h));
        Value rowAt = add(box, mul(r, idx(128)));
        for (int64_t jj = 0; jj < kTBoxColumns / 8; ++jj) {
          Value chunk = add(idx(2 * jj), div(rem(lane, 4), 2));
          Value at = add(
              rowAt,
              add(mul(arith::XOrIOp::create(b, loc, chunk, rem(r, 8)), idx(16)),
                  mul(rem(lane, 2), idx(8))));
          int64_t i = 4 * (4 * q + jj) + 2 * h;
          LLVM::StoreOp::create(b, loc,
                                pairOf(accAt(acc, i), accAt(acc, i + 1),
                                       b.getF32Type()),
                                sharedPtrAt(at), /*alignment=*/8);
        }
      }
      fenceForAsyncProxy();
      sync();
      ifThen(leader, [&] {
        Value desc = LLVM::IntToPtrOp::create(
            b, loc, LLVM::LLVMPointerType::get(b.getContext()), map);
        NVVM::CpAsyncBulkTensorSharedCTAToGlobalOp::create(
            b, loc, desc, sharedPtrAt(box),
            ValueRange{i32Of(column(q)), i32Of(outRow)}, Value(),
            NVVM::TMAStoreMode::TILE, Value());
        NVVM::CpAsyncBulkCommitGroupOp::create(b, loc);
      });
    }
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

  /// The SwiGLU epilogue (see SwigluEpilogue). The B tile held 128 gate
  /// columns, then the up columns of the same outputs, so register
  /// 4 j + 2 h + c (j < 16) is the gate and register 4 (j + 16) + 2 h + c the
  /// up of output column n0 / 2 + 8 j + 2 (l%4) + c: this thread's 32
  /// outputs of a row make four MX blocks of 8 values each, the other 24 of
  /// every block in the 3 lanes of the same row (the lanes l ^ 1, l ^ 2,
  /// l ^ 3), which one amax reduction over 2 xor shuffles combines.
  void storeSwiglu(const Tile &t, Value acc, Value rowBase, Value c,
                   Value warp, Value lane) {
    int64_t f = g.n / 2;
    Value c0 = div(t.n0, 2);
    Value col = add(c0, mul(rem(lane, 4), idx(2)));
    Value outBase = baseAddress(out);
    Value hBase = outH ? baseAddress(outH) : Value();
    Value aBase = outF32 ? baseAddress(outF32) : Value();
    Type f32 = b.getF32Type();
    auto rowOf = [&](int64_t h) { return add(rowBase, idx(8 * h)); };
    auto reg = [&](int64_t h, int64_t j, int64_t cc) {
      return accAt(acc, 4 * j + 2 * h + cc);
    };
    if (hBase)
      for (int64_t h = 0; h < 2; ++h) {
        Value row = rowOf(h);
        ifThen(cmp(P::slt, row, t.hi), [&] {
          Value hAt = add(mul(row, idx(g.n)), col);
          for (int64_t j = 0; j < 32; ++j)
            storePair(hBase, add(hAt, idx(8 * (j % 16) + (j / 16) * f)),
                      reg(h, j, 0), reg(h, j, 1), f32);
        });
      }
    // Row h's MX block m (its accumulators die after it): output columns
    // col + 8 j + cc for j in [4 m, 4 m + 4). Returns its activations.
    auto rowBlock = [&](int64_t h, int64_t m) {
      Value row = rowOf(h);
      Value valid = cmp(P::slt, row, t.hi);
      Value rowAt = add(mul(row, idx(f)), col);
      SmallVector<Value> act;
      for (int64_t j = 4 * m; j < 4 * m + 4; ++j)
        for (int64_t cc = 0; cc < 2; ++cc)
          act.push_back(buildSwiglu(b, loc, reg(h, j, cc), reg(h, j + 16, cc)));
      if (g.swiglu->mx) {
        // Block n0 / 64 + m of the row's F / 32.
        auto encoded = encodeRowBlock(act);
        ifThen(valid, [&] {
          storeEncoded(encoded, add(rowAt, idx(32 * m)),
                       add(mul(row, idx(f / kTSwigluBlock)),
                           add(div(c0, kTSwigluBlock), idx(m))),
                       lane);
          if (aBase)
            for (int64_t i = 0; i < 4; ++i)
              storePair(aBase, add(rowAt, idx(8 * (4 * m + i))), act[2 * i],
                        act[2 * i + 1], f32);
        });
        return act;
      }
      SmallVector<Value> rounded = roundRowBlock(act);
      ifThen(valid, [&] {
        for (int64_t i = 0; i < 4; ++i) {
          Value at = add(rowAt, idx(8 * (4 * m + i)));
          storePair(outBase, at, rounded[2 * i], rounded[2 * i + 1],
                    b.getBF16Type());
          if (aBase)
            storePair(aBase, at, act[2 * i], act[2 * i + 1], f32);
        }
      });
      return act;
    };
    if (!outCol) {
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t m = 0; m < 4; ++m)
          (void)rowBlock(h, m);
      return;
    }
    // With the columnwise rounding: blocks m, m + 1 of both rows, then their
    // 16 columns' 32-row blocks (see storeSwigluGrad).
    ColumnExchange x = columnExchange(c, warp);
    for (int64_t m = 0; m < 4; m += 2) {
      SmallVector<Value> first[2], second[2];
      for (int64_t k = 0; k < 2; ++k) {
        first[k] = rowBlock(0, m + k);
        second[k] = rowBlock(1, m + k);
      }
      storeColumnBlock(t, m / 2, f, {32 * m, 32 * (m + 1)},
                       {first[0], first[1]}, {second[0], second[1]}, x,
                       rowBase, col, lane);
    }
  }

  /// The columnwise pass's shared memory (SwigluEpilogue::col): warp w's
  /// slots and its partner's (w ^ 1), and the warp pair's named barrier
  /// (2 + 2 c + w / 2).
  struct ColumnExchange {
    Value own, partner, pairBarrier;
  };
  ColumnExchange columnExchange(Value c, Value warp) {
    Value w = add(mul(c, idx(4)), warp);
    Value other =
        add(mul(c, idx(4)), arith::XOrIOp::create(b, loc, warp, idx(1)));
    return {add(idx(kTColAmaxAt), mul(w, idx(2 * kTColSlotBytes))),
            add(idx(kTColAmaxAt), mul(other, idx(2 * kTColSlotBytes))),
            arith::IndexCastOp::create(
                b, loc, i32(), add(idx(2), add(mul(c, idx(2)), div(warp, 2))))};
  }

  /// The MX rounding of one rowwise block: this thread's 8 values of it
  /// and the other 24 in the lanes l ^ 1, l ^ 2, l ^ 3.
  SmallVector<Value> roundRowBlock(ArrayRef<Value> values) {
    Value amax = warpMax(amaxOf(values), {1, 2});
    return mxRoundTrip(values, amax, g.swiglu->f8, g.swiglu->mode,
                       b.getF32Type());
  }
  /// The MX encoding of that block (SwigluEpilogue::mx): its scale byte and
  /// this thread's element pairs.
  std::pair<Value, SmallVector<Value>> encodeRowBlock(ArrayRef<Value> values) {
    Value amax = warpMax(amaxOf(values), {1, 2});
    return mxEncode(values, amax, g.swiglu->f8, g.swiglu->mode);
  }
  /// Stores an encoded block: this thread's 4 pairs at elements at + 8 i
  /// of `out` (columns 8 j + 2 (l%4) + {0, 1}: `at` is the thread's first),
  /// and the scale byte at `scaleAt` of `outScales` from lane l%4 == 0.
  void storeEncoded(const std::pair<Value, SmallVector<Value>> &encoded,
                    Value at, Value scaleAt, Value lane) {
    Value outBase = baseAddress(out);
    for (int64_t i = 0; i < 4; ++i)
      LLVM::StoreOp::create(b, loc, encoded.second[i],
                            globalPtr(outBase, add(at, idx(8 * i))),
                            /*alignment=*/2);
    ifThen(cmp(P::eq, rem(lane, 4), idx(0)), [&] {
      LLVM::StoreOp::create(b, loc, encoded.first,
                            globalPtr(baseAddress(outScales), scaleAt),
                            /*alignment=*/1);
    });
  }

  /// The backward SwiGLU epilogue (see SwigluEpilogue): register
  /// 4 j + 2 h + c is da at column n0 + 8 j + 2 (l%4) + c; with the gate and
  /// up of h at that column and F further (8-byte loads of h's row, clamped
  /// to the group so rows past it stay in bounds), dh's gate and up halves.
  /// dh's rowwise MX blocks of the gate half and of the up half each have 8
  /// values in this thread (j in [4 m, 4 m + 4)), as in the forward.
  ///
  /// With the columnwise rounding (`outCol`), blocks go m-major (both rows h
  /// of block m, then m + 1): a column's 32-row block is the 16 rows of warp
  /// w (2 rows h in each of the 8 lanes l%4 + 4 i) and the 16 of warp w ^ 1
  /// (warps 2p, 2p + 1 hold rows 32 p .. 32 p + 31 of the warpgroup's 64,
  /// which start at a multiple of 32). Each warp's amaxes go through xor
  /// shuffles over lanes 4, 8, 16, then shared memory (lanes 0-3 write, a
  /// 64-thread named barrier per warp pair, every lane reads the other
  /// warp's), and each column's two values here round with the pair's
  /// amax. A block past the group's end is entirely past it (the group ends
  /// at a multiple of 32 too) and stores nothing.
  void storeSwigluGrad(const Tile &t, Value acc, Value rowBase, Value c,
                       Value warp, Value lane) {
    int64_t f = g.n, twoF = 2 * g.n;
    Value col = add(t.n0, mul(rem(lane, 4), idx(2)));
    Value outBase = baseAddress(out);
    Value hBase = baseAddress(inH);
    Value dhBase = outF32 ? baseAddress(outF32) : Value();
    Type f32 = b.getF32Type();
    Value lastRow = add(t.hi, idx(-1));
    constexpr int64_t blocksPerRow = kTTileN / kTSwigluBlock;
    bool mMajor = bool(outCol);
    auto hOf = [&](int64_t k) {
      return mMajor ? k % 2 : k / blocksPerRow;
    };
    auto mOf = [&](int64_t k) {
      return mMajor ? k / 2 : k % blocksPerRow;
    };
    auto rowOf = [&](int64_t h) { return add(rowBase, idx(8 * h)); };
    // gate and up of h at da's columns 8 j + 2 (l%4) + {0, 1}, j in the block.
    auto loadBlock = [&](int64_t k) {
      int64_t h = hOf(k), m = mOf(k);
      Value hRowAt = add(mul(minS(rowOf(h), lastRow), idx(twoF)), col);
      SmallVector<Value> values; // gate 0, gate 1, up 0, up 1 for each j
      for (int64_t j = 4 * m; j < 4 * m + 4; ++j)
        for (int64_t at : {8 * j, f + 8 * j})
          llvm::append_range(
              values,
              loadVector(f32, 2,
                         globalPtr(hBase, mul(add(hRowAt, idx(at)), idx(4))),
                         8));
      return values;
    };
    ColumnExchange x;
    if (outCol)
      x = columnExchange(c, warp);
    SmallVector<Value> firstGate, firstUp; // row h = 0 of block m (m-major)
    SmallVector<Value> next = loadBlock(0);
    for (int64_t k = 0; k < 2 * blocksPerRow; ++k) {
      int64_t h = hOf(k), m = mOf(k);
      SmallVector<Value> hValues = next;
      SmallVector<Value> dg, du;
      for (int64_t i = 0; i < 4; ++i) {
        int64_t j = 4 * m + i;
        for (int64_t cc = 0; cc < 2; ++cc) {
          Value da = accAt(acc, 4 * j + 2 * h + cc);
          auto [dGate, dUp] = buildSwigluGrad(b, loc, hValues[4 * i + cc],
                                              hValues[4 * i + 2 + cc], da);
          dg.push_back(dGate);
          du.push_back(dUp);
        }
      }
      Value row = rowOf(h);
      Value rowAt = add(mul(row, idx(twoF)), col);
      // The gate's block and the up's, F further: the MX encoding (blocks
      // n0 / 32 + m and F / 32 further of the row's 2F / 32 scales) or the
      // rounding.
      std::pair<Value, SmallVector<Value>> gEncoded, uEncoded;
      SmallVector<Value> gRounded, uRounded;
      if (g.swiglu->mx) {
        gEncoded = encodeRowBlock(dg);
        uEncoded = encodeRowBlock(du);
      } else {
        gRounded = roundRowBlock(dg);
        uRounded = roundRowBlock(du);
      }
      if (k + 1 < 2 * blocksPerRow)
        next = loadBlock(k + 1);
      ifThen(cmp(P::slt, row, t.hi), [&] {
        if (g.swiglu->mx) {
          Value at = add(rowAt, idx(32 * m));
          Value scaleAt = add(mul(row, idx(twoF / kTSwigluBlock)),
                              add(div(t.n0, kTSwigluBlock), idx(m)));
          storeEncoded(gEncoded, at, scaleAt, lane);
          storeEncoded(uEncoded, add(at, idx(f)),
                       add(scaleAt, idx(f / kTSwigluBlock)), lane);
        }
        for (int64_t i = 0; i < 4; ++i) {
          Value at = add(rowAt, idx(8 * (4 * m + i)));
          Value upAt = add(at, idx(f));
          if (!g.swiglu->mx) {
            storePair(outBase, at, gRounded[2 * i], gRounded[2 * i + 1],
                      b.getBF16Type());
            storePair(outBase, upAt, uRounded[2 * i], uRounded[2 * i + 1],
                      b.getBF16Type());
          }
          if (dhBase) {
            storePair(dhBase, at, dg[2 * i], dg[2 * i + 1], f32);
            storePair(dhBase, upAt, du[2 * i], du[2 * i + 1], f32);
          }
        }
      });
      if (!outCol)
        continue;
      if (h == 0) {
        firstGate = dg;
        firstUp = du;
        continue;
      }
      storeColumnBlock(t, m % 2, twoF, {8 * 4 * m, 8 * 4 * m + f},
                       {firstGate, firstUp}, {dg, du}, x, rowBase, col, lane);
    }
  }

  /// The columnwise MX rounding of 16 columns here, two halves of 8
  /// (backward: block m's gate values 2 i + cc, then its up; forward: blocks
  /// m and m + 1), rows h = 0 (`first`) and h = 1 (`second`), through the
  /// warp pair's shared-memory slot `slot` (alternating: see
  /// storeSwigluGrad). Value 2 i + cc of half `half` is stored at column
  /// col + halfAt[half] + 8 i + cc of the bf16 result's rows of `rowStride`.
  void storeColumnBlock(const Tile &t, int64_t slot, int64_t rowStride,
                        std::array<int64_t, 2> halfAt,
                        std::array<ArrayRef<Value>, 2> first,
                        std::array<ArrayRef<Value>, 2> second,
                        const ColumnExchange &x, Value rowBase, Value col,
                        Value lane) {
    Value own = x.own, partner = x.partner, pairBarrier = x.pairBarrier;
    Type f32 = b.getF32Type();
    // Column v: half v / 8 (gate, up), value v % 8 = 2 i + cc.
    SmallVector<Value> amax;
    for (int64_t v = 0; v < 16; ++v)
      amax.push_back(warpMax(amaxOf({first[v / 8][v % 8], second[v / 8][v % 8]}),
                             {4, 8, 16}));
    Value slotAt = idx(kTColSlotBytes * slot);
    Value laneAt = mul(rem(lane, 4), idx(16 * 4));
    ifThen(cmp(P::ult, lane, idx(4)), [&] {
      Value at = add(add(own, slotAt), laneAt);
      for (int64_t q = 0; q < 4; ++q) {
        Value v = vectorOf(ArrayRef(amax).slice(4 * q, 4));
        LLVM::StoreOp::create(b, loc, v,
                              sharedPtrAt(add(at, idx(16 * q))), 16);
      }
    });
    NVVM::BarrierOp::create(b, loc, Type(), pairBarrier, int32(64),
                            NVVM::BarrierReductionAttr(), Value());
    Value at = add(add(partner, slotAt), laneAt);
    for (int64_t q = 0; q < 4; ++q) {
      SmallVector<Value> other =
          loadVector(f32, 4, sharedPtrAt(add(at, idx(16 * q))), 16);
      for (int64_t e = 0; e < 4; ++e)
        amax[4 * q + e] = arith::MaximumFOp::create(b, loc, amax[4 * q + e],
                                                    other[e]);
    }
    // rounded[v] = {row h = 0, row h = 1} of column v.
    SmallVector<SmallVector<Value>> rounded;
    for (int64_t v = 0; v < 16; ++v)
      rounded.push_back(mxRoundTrip({first[v / 8][v % 8], second[v / 8][v % 8]},
                                    amax[v], g.swiglu->colF8,
                                    g.swiglu->colMode, f32));
    Value colOutBase = baseAddress(outCol);
    for (int64_t h = 0; h < 2; ++h) {
      Value row = add(rowBase, idx(8 * h));
      Value rowAt = add(mul(row, idx(rowStride)), col);
      ifThen(cmp(P::slt, row, t.hi), [&] {
        for (int64_t half = 0; half < 2; ++half)
          for (int64_t i = 0; i < 4; ++i) {
            Value at = add(rowAt, idx(halfAt[half] + 8 * i));
            storePair(colOutBase, at, rounded[8 * half + 2 * i][h],
                      rounded[8 * half + 2 * i + 1][h], b.getBF16Type());
          }
      });
    }
  }

  /// Forward: zeros the rows in no group, [0, offsets[0]) and [offsets[E],
  /// end), of every result.
  void zeroUncovered(Value grid) {
    if (!g.swiglu)
      return zeroUncovered(grid, out, g.n * 4);
    // The rounded result (bf16) is [R, F] forward, [R, 2F] backward; the MX
    // encoding's elements [R, F] and scales [R, F / 32] (a zero block's
    // scale byte is 0).
    int64_t columns = g.swiglu->grad ? 2 * g.n : g.n / 2;
    if (g.swiglu->mx) {
      zeroUncovered(grid, out, columns);
      zeroUncovered(grid, outScales, columns / kTSwigluBlock);
    } else {
      zeroUncovered(grid, out, columns * 2);
    }
    if (outH)
      zeroUncovered(grid, outH, g.n * 4);
    if (outF32)
      zeroUncovered(grid, outF32, columns * 4);
    if (outCol)
      zeroUncovered(grid, outCol, columns * 2);
  }
  /// zeroUncovered for the result `buffer` of `rowBytes` bytes a row (16-byte
  /// stores, or byte stores where rows are not whole 16-byte chunks).
  void zeroUncovered(Value grid, Value buffer, int64_t rowBytes) {
    Value start = clampedOffset(offsets, idx(0), g.rows);
    Value end = groupsEnd(offsets, g.rows);
    Value zeroEnd = g.liveRowsOnly ? end : idx(g.rows);
    Value outBase = baseAddress(buffer);
    int64_t width = rowBytes % 16 ? 1 : 16;
    Value zero = width == 1 ? int8(0)
                            : LLVM::ZeroOp::create(
                                  b, loc, VectorType::get({4}, b.getF32Type()))
                                  .getResult();
    Value chunksPerRow = idx(rowBytes / width);
    Value first =
        add(mul(gpu::BlockIdOp::create(b, loc, gpu::Dimension::x),
                idx(kTThreads)),
            tid);
    Value stride = mul(grid, idx(kTThreads));
    auto zeroRows = [&](Value from, Value to) {
      Value chunks = mul(arith::SubIOp::create(b, loc, maxS(to, from), from),
                         chunksPerRow);
      strideLoop(first, chunks, stride, [&](Value chunk) {
        Value at = add(mul(from, chunksPerRow), chunk);
        LLVM::StoreOp::create(b, loc, zero,
                              globalPtr(outBase, mul(at, idx(width))),
                              /*alignment=*/width);
      });
    };
    zeroRows(idx(0), start);
    zeroRows(maxS(end, start), zeroEnd);
  }

  void emit(gpu::LaunchOp launch) {
    tid = launch.getThreadIds().x;
    Value grid = launch.getGridSize().x;
    setUp(kHLBO, kHSBO, /*swizzled=*/true, /*accRegs=*/kTTileN / 2);
    if (!g.wgrad)
      zeroUncovered(grid);
    ifThen(cmp(P::eq, tid, idx(0)), [&] {
      for (int64_t s = 0; s < kTStages; ++s) {
        NVVM::MBarrierInitOp::create(b, loc, fullBarrier(idx(s)),
                                     int32(g.lhsF8 ? 1 + kTConverters : 1),
                                     Value());
        NVVM::MBarrierInitOp::create(b, loc, emptyBarrier(idx(s)),
                                     int32(kTConsumerThreads), Value());
        if (g.lhsF8)
          NVVM::MBarrierInitOp::create(b, loc, elementsBarrier(idx(s)),
                                       int32(1), Value());
      }
    });
    NVVM::Barrier0Op::create(b, loc);
    // The warpgroup index, broadcast from lane 0 so the compiler sees it is
    // warp-uniform (else it serializes the wgmmas of the divergent branch).
    Value wg = toIndex(
        gpu::ShuffleOp::create(b, loc, i32Of(div(tid, 128)), int32(0),
                               int32(32), gpu::ShuffleMode::IDX)
            .getShuffleResult());
    // The SwiGLU epilogue needs more than the 168 registers a thread of 384
    // gets: the producer warpgroup gives most of its registers to the
    // consumers; with an 8-bit lhs it keeps enough for the converters.
    int64_t producerRegs = g.lhsF8 ? kTConverterRegs : kTProducerRegs;
    int64_t consumerRegs =
        g.lhsF8 ? kTConverterConsumerRegs : kTSwigluConsumerRegs;
    auto setMaxRegisters = [&](int64_t count,
                               NVVM::SetMaxRegisterAction action) {
      if (g.swiglu || g.lhsF8)
        NVVM::SetMaxRegisterOp::create(b, loc, count, action);
    };
    ifElseVoid(
        cmp(P::eq, wg, idx(0)),
        [&] {
          setMaxRegisters(producerRegs, NVVM::SetMaxRegisterAction::decrease);
          if (g.lhsF8)
            ifElseVoid(
                cmp(P::ult, tid, idx(32)),
                [&] { ifThen(cmp(P::eq, tid, idx(0)), [&] { producer(grid); }); },
                [&] { converter(grid); });
          else
            ifThen(cmp(P::eq, tid, idx(0)), [&] { producer(grid); });
        },
        [&] {
          setMaxRegisters(consumerRegs, NVVM::SetMaxRegisterAction::increase);
          consumer(grid, add(wg, idx(-1)));
        });
  }
};

/// The declaration of libmoert's moertTensorMap2D (moert/Gpu.h).
func::FuncOp getOrCreateTensorMapDecl(ModuleOp module, SymbolTable &symbols) {
  constexpr StringLiteral name = "moertTensorMap2D";
  if (auto f = symbols.lookup<func::FuncOp>(name))
    return f;
  MLIRContext *ctx = module.getContext();
  auto i64 = IntegerType::get(ctx, 64);
  auto f = func::FuncOp::create(
      UnknownLoc::get(ctx), name,
      FunctionType::get(ctx, SmallVector<Type>(7, i64), {i64}));
  f.setPrivate();
  // Touches no device memory: no host synchronization around its calls
  // (-moe-gpu-elide-host-syncs).
  f->setAttr("moe.host_only", UnitAttr::get(ctx));
  symbols.insert(f);
  return f;
}

/// The TMA kernel computing `t` (see "bf16 grouped GEMM, TMA and
/// warp-specialized wgmma"), named `name`: the host encodes both tensor
/// maps before the launch.
func::FuncOp getOrCreateWgmmaTmaFunction(
    ModuleOp module, SymbolTable &symbols, const TmaGemm &t, StringRef name,
    ArrayRef<Type> argTypes, ArrayRef<RankedTensorType> resultTypes,
    Location loc) {
  func::FuncOp encode = getOrCreateTensorMapDecl(module, symbols);
  int64_t tiles =
      t.wgrad ? t.experts * (t.k / kTTileM) * (t.n / kTTileN)
              : (tilesOf(t.rows, kTTileM) + t.experts) * (t.n / kTTileN);
  Value mapA, mapB, mapOut;
  return withGroupedArgs(
      getOrCreateKernelCall(
          module, symbols, name,
          t.wgrad    ? "cp.async.bulk.tensor + wgmma.mma_async bf16 weight "
                       "gradient"
          : t.swiglu ? "cp.async.bulk.tensor + wgmma.mma_async bf16, SwiGLU "
                       "and MX rounding epilogue"
          : t.lhsF8  ? "cp.async.bulk.tensor + wgmma.mma_async bf16, MX lhs "
                       "dequantized in shared memory"
                     : "cp.async.bulk.tensor + wgmma.mma_async bf16",
          argTypes, resultTypes, loc,
          {std::min(kTCtas, tiles), 1, 1, kTThreads,
           stagesF32(t) ? kTStoreSmemBytes
                        : kTSmemBytes + (t.swiglu->col ? kTColAmaxBytes : 0)},
          [&](OpBuilder &b, gpu::LaunchOp launch, ArrayRef<Value> buf,
              ArrayRef<Value> outs) {
            WgmmaTmaEmitter k{{{b, loc}}, t, buf[t.offsetsArg()], outs[0],
                              mapA, mapB};
            k.mapOut = mapOut;
            if (t.lhsF8)
              k.scalesA = buf[1];
            if (t.swiglu) {
              unsigned next = 1;
              if (t.swiglu->mx)
                k.outScales = outs[next++];
              if (t.swiglu->keepH)
                k.outH = outs[next++];
              if (t.swiglu->keepF32)
                k.outF32 = outs[next++];
              if (t.swiglu->col)
                k.outCol = outs[next++];
              if (t.swiglu->grad)
                k.inH = buf[3];
            }
            k.emit(launch);
          },
          [&](OpBuilder &b, ArrayRef<Value> buf, ArrayRef<Value> outs) {
            EmitterBase h{b, loc};
            // A bf16 [rows, columns] array in boxes of 64 columns (128
            // bytes, one swizzle row) x boxRows; f32 boxes of 32 columns;
            // 8-bit boxes of `boxColumns` (64: one stage, unswizzled).
            auto map = [&](Value array, int64_t columns, int64_t rows,
                           int64_t boxRows, int64_t bytes = 2,
                           int64_t boxColumns = 0) {
              SmallVector<Value> args = {
                  h.baseAddress(array), h.int64(bytes),
                  h.int64(columns),     h.int64(rows),
                  h.int64(bytes * columns),
                  h.int64(boxColumns ? boxColumns : 128 / bytes),
                  h.int64(boxRows)};
              return func::CallOp::create(b, loc, encode, args).getResult(0);
            };
            // The f32 result [R, N] (weight gradient: [E * K, N]), stored
            // in boxes of 64 rows.
            if (stagesF32(t))
              mapOut = map(outs[0], t.n, t.wgrad ? t.experts * t.k : t.rows,
                           kHMmaM, 4);
            if (t.wgrad) {
              // lhs [R, K], rhs [R, N]: 64 rows (one stage) a box.
              mapA = map(buf[0], t.k, t.rows, kTTileK);
              mapB = map(buf[1], t.n, t.rows, kTTileK);
              return;
            }
            mapA = t.lhsF8 ? map(buf[0], t.k, t.rows, kTTileM, 1, kTTileK)
                           : map(buf[0], t.k, t.rows, kTTileM);
            Value rhs = buf[t.rhsArg()];
            mapB = t.rhsTransposed ? map(rhs, t.k, t.experts * t.n, kTTileN)
                                   : map(rhs, t.n, t.experts * t.k, 64);
          }),
      t.wgrad   ? SmallVector<unsigned>{0, 1}
      : t.lhsF8 ? SmallVector<unsigned>{0, 1}
                : SmallVector<unsigned>{0},
      t.offsetsArg());
}

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
  return withGroupedArgs(getOrCreateKernelCall(
      module, symbols, g.name(), "wgmma.mma_async bf16", argTypes, resultType,
      loc,
      {g.n / kHTileN, tilesOf(g.rows, kHTileM), 1, kHThreads,
       kHSmemBytes},
      [&](OpBuilder &b, gpu::LaunchOp launch, ArrayRef<Value> buf, Value out) {
        WgmmaEmitter k{{{b, loc}}, g, buf[0], buf[1], buf[2], out};
        k.emit(launch);
      }),
                         {0}, 2);
}

/// A GEMM followed by SwiGLU (or its gradient) and the MX round trip of the
/// next GEMM's operand, which the TMA kernel's SwiGLU epilogue computes in
/// one pass (see SwigluEpilogue):
/// - forward: h = gemm(x, w1), a = moe.swiglu(h), r = bf16 round trip of a;
/// - backward: da = gemm(dy, w2) transpose_rhs, dh = moe.swiglu_grad(h, da),
///   r = bf16 round trip of dh (da read by nothing else).
/// Split layout, f32 values, rowwise MX blocks of 32.
/// Backward, when every group starts at a multiple of 32: also dh's
/// columnwise round trip (blocks of 32 rows, bf16), if dh has one.
struct SwigluFusion {
  Operation *activation; // moe.swiglu or moe.swiglu_grad
  QuantizeOp quantize;
  SmallVector<DequantizeOp> roundTrips; // the bf16 dequantizes of `quantize`
  SwigluEpilogue epilogue;
  QuantizeOp colQuantize{};                // backward, blocks along the rows
  SmallVector<DequantizeOp> colRoundTrips; // its bf16 dequantizes
};

/// Whether every group of `offsets` provably starts (and ends) at a multiple
/// of `m` rows: the offsets of a moe.dispatch or moe.slot_offsets whose
/// pad_to is a multiple of m.
bool groupsAlignedTo(Value offsets, int64_t m) {
  if (auto d = offsets.getDefiningOp<DispatchOp>())
    return offsets == d.getOffsets() && d.getPadTo() % m == 0;
  if (auto s = offsets.getDefiningOp<SlotOffsetsOp>())
    return s.getPadTo() % m == 0;
  return false;
}

/// The bf16 dequantizes reading `q` when they are all of its users.
SmallVector<DequantizeOp> bf16RoundTripsOf(QuantizeOp q) {
  SmallVector<DequantizeOp> trips;
  for (Operation *user : q->getUsers()) {
    auto dq = dyn_cast<DequantizeOp>(user);
    if (!dq || !dq.getType().getElementType().isBF16())
      return {};
    trips.push_back(dq);
  }
  return trips;
}

bool readFromTokens(Value rows);

/// Whether the backward epilogue's columnwise rounding of dh lowers the
/// block's peak of live tensors. Either way dh's roundings (bf16) live from
/// the kernel on; without it the kernel also writes dh in f32, which the
/// columnwise round trip right after it reads (see lowerRoundTrips): one
/// more f32 [R, 2F] at the kernel. The epilogue's columnwise pass costs
/// time (amaxes over two warps), so it is used only where that f32 would
/// raise the peak.
/// The position of the first of `dqs` in `block` (the dequantizes a fused
/// kernel at position `at` replaces, where they stand now), after `at`.
unsigned firstDequantize(const BlockLiveness &live, Block &block,
                         ArrayRef<DequantizeOp> dqs, unsigned at) {
  unsigned first = std::numeric_limits<unsigned>::max();
  for (DequantizeOp dq : dqs)
    if (Operation *anc = block.findAncestorOpInBlock(*dq))
      first = std::min(first, live.position(anc));
  return first == std::numeric_limits<unsigned>::max()
             ? at + 1
             : std::max(first, at + 1);
}

bool colRoundingLowersPeak(GroupedMatmulOp op, const SwigluFusion &fusion) {
  Operation *act = fusion.activation;
  Value da = op.getResult(), dh = act->getResult(0);
  Block *block = act->getBlock();
  BlockLiveness live(*block, [&](Value v) {
    return v != da && v != dh && !readFromTokens(v);
  });
  unsigned at = live.position(act);
  int64_t rounded = tensorBytes(fusion.roundTrips.front()->getResult(0));
  // From the kernel to the first reader of each rounding (the dequantizes
  // the kernel replaces, where they stand now).
  live.add(at, firstDequantize(live, *block, fusion.roundTrips, at), rounded);
  live.add(at, firstDequantize(live, *block, fusion.colRoundTrips, at),
           rounded);
  return live.at(at) - rounded + tensorBytes(dh) > live.peak();
}

/// Whether a GEMM can read its lhs as MX elements and scales (TmaGemm::lhsF8):
/// a TMA kernel without an epilogue (no SwiGLU reads its result).
bool takesF8Lhs(GroupedMatmulOp op) {
  std::optional<WgmmaGemm> g = matchWgmmaGemm(op);
  return g && g->tma && llvm::none_of(op->getUsers(), [](Operation *u) {
           return isa<SwigluOp, SwigluGradOp>(u);
         });
}

/// The bf16 dequantize a TMA GEMM's lhs is and the moe.mx_pack it reads (an
/// epilogue's MX result, blocks of 32 along K), when the kernel can read
/// the elements and scales instead.
std::optional<std::pair<DequantizeOp, MXPackOp>>
f8LhsOf(GroupedMatmulOp op, const WgmmaGemm &g) {
  auto dq = op.getLhs().getDefiningOp<DequantizeOp>();
  if (!g.tma || !dq)
    return std::nullopt;
  auto pack = dq.getInput().getDefiningOp<MXPackOp>();
  if (!pack)
    return std::nullopt;
  MXTensorType mx = pack.getType();
  if (mx.getAxis() != 1 || mx.getBlockSize() != kTSwigluBlock ||
      !isa<Float8E4M3FNType, Float8E5M2Type>(mx.getElementType()))
    return std::nullopt;
  return std::make_pair(dq, pack);
}

/// Whether the epilogue's MX encoding (SwigluEpilogue::mx) instead of its
/// bf16 rounding lowers the block's peak of live tensors: whether the peak
/// lies where the rounding is live, from the kernel to its last reader. The
/// 8-bit reads cost the GEMMs time (the shared-memory dequantization is
/// traffic on top of the MMAs' own: 10-18% of those kernels measured), so
/// the encoding is kept where it saves memory.
bool mxLowersPeak(GroupedMatmulOp op, const SwigluFusion &fusion) {
  const SwigluEpilogue &e = fusion.epilogue;
  Operation *act = fusion.activation;
  Value result = op.getResult(), values = act->getResult(0);
  Block *block = act->getBlock();
  // The GEMM's result and the activation's exist only where kept (the
  // forward's h, the f32 values).
  BlockLiveness live(*block, [&](Value v) {
    return (v != result || (!e.grad && e.keepH)) &&
           (v != values || e.keepF32) && !readFromTokens(v);
  });
  unsigned at = live.position(e.grad ? act : op.getOperation());
  unsigned end = at + 1;
  for (DequantizeOp dq : fusion.roundTrips)
    for (Operation *user : dq->getUsers())
      if (Operation *anc = block->findAncestorOpInBlock(*user))
        end = std::max(end, live.position(anc) + 1);
  // The rounding from the kernel on (the dequantizes, where they stand now,
  // count from their own positions).
  int64_t rounded = tensorBytes(fusion.roundTrips.front()->getResult(0));
  live.add(at, firstDequantize(live, *block, fusion.roundTrips, at), rounded);
  int64_t elements = rounded / 2;
  int64_t encoded = elements + elements / kTSwigluBlock;
  unsigned size = block->getOperations().size();
  int64_t lowered = std::max({live.peak(0, at), live.peak(end, size),
                              live.peak(at, end) - rounded + encoded});
  return lowered < live.peak();
}

std::optional<SwigluFusion> matchSwigluFusion(GroupedMatmulOp op,
                                              const WgmmaGemm &g,
                                              bool mxAlways) {
  if (!g.tma || g.n % kTTileN)
    return std::nullopt;
  Value result = op.getResult();
  Operation *activation = nullptr;
  for (OpOperand &use : result.getUses()) {
    Operation *user = use.getOwner();
    if (activation)
      break;
    if (auto s = dyn_cast<SwigluOp>(user);
        s && !g.rhsTransposed && s.getLayout() == SwigluLayout::split &&
        s.getType().getElementType().isF32())
      activation = s;
    if (auto s = dyn_cast<SwigluGradOp>(user);
        s && g.rhsTransposed && use.getOperandNumber() == 1 &&
        s.getLayout() == SwigluLayout::split &&
        s.getType().getElementType().isF32() &&
        s.getInput().getType().getElementType().isF32() &&
        result.hasOneUse())
      activation = s;
  }
  if (!activation)
    return std::nullopt;
  SwigluFusion fusion{activation, {}, {}, {}, {}, {}};
  fusion.epilogue.grad = g.rhsTransposed;
  Value values = activation->getResult(0);
  for (Operation *user : values.getUsers()) {
    auto q = dyn_cast<QuantizeOp>(user);
    if (!q || fusion.quantize)
      continue;
    MXTensorType mx = q.getType();
    if (mx.getAxis() != 1 || mx.getBlockSize() != kTSwigluBlock)
      continue;
    for (Operation *qUser : q->getUsers())
      if (auto dq = dyn_cast<DequantizeOp>(qUser))
        if (dq.getType().getElementType().isBF16())
          fusion.roundTrips.push_back(dq);
    if (!fusion.roundTrips.empty())
      fusion.quantize = q;
  }
  if (!fusion.quantize)
    return std::nullopt;
  fusion.epilogue.f8 = fusion.quantize.getType().getElementType();
  fusion.epilogue.mode = fusion.quantize.getScaleMode();
  // Whether the f32 values must stay a result: something besides their
  // rowwise rounding (and `col`, the columnwise one) reads them, or the
  // rowwise quantize is read by more than bf16 dequantizes.
  auto f32Read = [&](Operation *col) {
    return llvm::any_of(values.getUsers(),
                        [&](Operation *u) {
                          return u != fusion.quantize && u != col;
                        }) ||
           !llvm::all_of(fusion.quantize->getUsers(), [&](Operation *u) {
             return llvm::is_contained(fusion.roundTrips, u);
           });
  };
  if (groupsAlignedTo(op.getOffsets(), kTSwigluBlock)) {
    for (Operation *user : values.getUsers()) {
      auto q = dyn_cast<QuantizeOp>(user);
      if (!q || fusion.colQuantize || q.getType().getAxis() != 0 ||
          q.getType().getBlockSize() != kTSwigluBlock)
        continue;
      fusion.colRoundTrips = bf16RoundTripsOf(q);
      if (!fusion.colRoundTrips.empty())
        fusion.colQuantize = q;
    }
    // Only where it takes the f32 values out: forward (a, for the second
    // GEMM's weight gradient) always, backward (dh) where that lowers the
    // peak (the backward's columnwise pass slows its epilogue more than
    // the round trip it saves takes).
    if (fusion.colQuantize && !f32Read(fusion.colQuantize) &&
        (!fusion.epilogue.grad || colRoundingLowersPeak(op, fusion))) {
      fusion.epilogue.col = true;
      fusion.epilogue.colF8 = fusion.colQuantize.getType().getElementType();
      fusion.epilogue.colMode = fusion.colQuantize.getScaleMode();
    } else {
      // Not in the epilogue: the f32 values stay a result for it.
      fusion.colQuantize = {};
      fusion.colRoundTrips.clear();
    }
  }
  // h (forward) and the f32 values stay results for any other user (a
  // train step's backward reads h; the weight gradients quantize a and dh
  // along the rows).
  fusion.epilogue.keepH =
      !fusion.epilogue.grad && llvm::any_of(result.getUsers(), [&](Operation *u) {
        return u != activation;
      });
  fusion.epilogue.keepF32 = f32Read(fusion.colQuantize);
  // The MX encoding itself when only GEMMs read the rowwise rounding, as
  // their lhs, and each can read it 8-bit (half the bytes of the bf16
  // rounding, written and read): where that lowers the peak, or always
  // (`always`).
  fusion.epilogue.mx =
      llvm::all_of(fusion.quantize->getUsers(),
                   [&](Operation *u) {
                     return llvm::is_contained(fusion.roundTrips, u);
                   }) &&
      llvm::all_of(fusion.roundTrips, [](DequantizeOp dq) {
        return llvm::all_of(dq->getUses(), [](OpOperand &use) {
          auto gemm = dyn_cast<GroupedMatmulOp>(use.getOwner());
          return gemm && use.getOperandNumber() == 0 && takesF8Lhs(gemm);
        });
      }) &&
      (mxAlways || mxLowersPeak(op, fusion));
  return fusion;
}

/// Replaces `op` (the GEMM of `fusion`) and the SwiGLU (or its gradient) and
/// round trips after it by one call of the TMA kernel with the SwiGLU
/// epilogue: at the GEMM (forward; h's other users may come before the
/// SwiGLU), or at the gradient (backward: h need not exist at the GEMM).
void lowerSwigluFusion(GroupedMatmulOp op, WgmmaGemm g, SwigluFusion &fusion,
                       ModuleOp module, SymbolTable &symbols) {
  const SwigluEpilogue &e = fusion.epilogue;
  Operation *activation = fusion.activation;
  auto valuesType = cast<RankedTensorType>(activation->getResult(0).getType());
  MXTensorType mxType = fusion.quantize.getType();
  SmallVector<RankedTensorType> resultTypes;
  if (e.mx)
    resultTypes = {cast<RankedTensorType>(mxType.getDataType()),
                   cast<RankedTensorType>(mxType.getScalesType())};
  else
    resultTypes = {RankedTensorType::get(valuesType.getShape(),
                                         BFloat16Type::get(op.getContext()))};
  if (e.keepH)
    resultTypes.push_back(cast<RankedTensorType>(op.getType()));
  if (e.keepF32)
    resultTypes.push_back(valuesType);
  if (e.col)
    resultTypes.push_back(RankedTensorType::get(
        valuesType.getShape(), BFloat16Type::get(op.getContext())));
  TmaGemm t{g.rows,         g.k,
            g.n,            g.experts,
            g.rhsTransposed, g.liveRowsOnly,
            /*wgrad=*/false, e};
  SmallVector<Value> args = {op.getLhs(), op.getRhs(), op.getOffsets()};
  if (e.grad)
    args.push_back(cast<SwigluGradOp>(activation).getInput());
  func::FuncOp kernel = withGroupedArgs(
      getOrCreateWgmmaTmaFunction(
          module, symbols, t, g.name() + e.name(),
          llvm::to_vector(ValueRange(args).getTypes()), resultTypes,
          op.getLoc()),
      e.grad ? SmallVector<unsigned>{0, 3} : SmallVector<unsigned>{0}, 2);
  OpBuilder b(e.grad ? activation : op.getOperation());
  auto call = func::CallOp::create(b, op.getLoc(), kernel, args);
  unsigned next = 1;
  if (e.mx) {
    // The MX value itself: its dequantizes stay, for the GEMMs reading it to
    // take the elements and scales (f8LhsOf).
    auto pack = MXPackOp::create(b, op.getLoc(), mxType, call.getResult(0),
                                 call.getResult(1));
    fusion.quantize.getResult().replaceAllUsesWith(pack.getResult());
    fusion.quantize.erase();
    next = 2;
  } else {
    for (DequantizeOp dq : fusion.roundTrips) {
      dq.getResult().replaceAllUsesWith(call.getResult(0));
      dq.erase();
    }
    if (fusion.quantize->use_empty())
      fusion.quantize.erase();
  }
  if (e.keepH)
    op.getResult().replaceUsesWithIf(call.getResult(next++), [&](OpOperand &u) {
      return u.getOwner() != activation;
    });
  // The columnwise round trips before the f32 values' other users take the
  // kept values (their quantize reads the activation).
  if (e.col) {
    Value colRounded = call.getResult(resultTypes.size() - 1);
    for (DequantizeOp dq : fusion.colRoundTrips) {
      dq.getResult().replaceAllUsesWith(colRounded);
      dq.erase();
    }
    fusion.colQuantize.erase();
  }
  if (e.keepF32)
    activation->getResult(0).replaceAllUsesWith(call.getResult(next++));
  if (activation->use_empty())
    activation->erase();
  if (op->use_empty())
    op.erase();
}

/// Replaces `op`, whose lhs `dq` dequantizes the MX value `pack` (f8LhsOf),
/// by the TMA kernel reading the elements and scales (TmaGemm::lhsF8).
void lowerF8LhsGemm(GroupedMatmulOp op, const WgmmaGemm &g, DequantizeOp dq,
                    MXPackOp pack, ModuleOp module, SymbolTable &symbols) {
  TmaGemm t{g.rows,          g.k,
            g.n,             g.experts,
            g.rhsTransposed, g.liveRowsOnly,
            /*wgrad=*/false, /*swiglu=*/std::nullopt};
  t.lhsF8 = pack.getType().getElementType();
  SmallVector<Value> args = {pack.getData(), pack.getScales(), op.getRhs(),
                             op.getOffsets()};
  func::FuncOp kernel = getOrCreateWgmmaTmaFunction(
      module, symbols, t,
      g.name() + "_" + BlockScaledGemm::eltName(t.lhsF8) + "_lhs",
      llvm::to_vector(ValueRange(args).getTypes()), {op.getType()},
      op.getLoc());
  OpBuilder b(op);
  auto call = func::CallOp::create(b, op.getLoc(), kernel, args);
  op.getResult().replaceAllUsesWith(call.getResult(0));
  op.erase();
  if (dq->use_empty())
    dq.erase();
  if (pack->use_empty())
    pack.erase();
}

//===----------------------------------------------------------------------===//
// Hopper (sm_90a): bf16 grouped weight-gradient GEMM on wgmma
//===----------------------------------------------------------------------===//
//
// Handles moe.grouped_matmul_wgrad with bf16 lhs [R, K] and rhs [R, N], f32
// result [E, K, N], static shapes, K % 128 == 0, N % 128 == 0 (R arbitrary):
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

/// One bf16 grouped weight-gradient shape the wgmma kernel handles.
struct WgmmaWgrad {
  int64_t rows, k, n, experts;
  Type offsetElt;
  /// The TMA, warp-specialized kernel (N % 256 == 0, R >= 64), else the
  /// cp.async one.
  bool tma = false;
  std::string name() const {
    return llvm::formatv("moe_wgmma_wgrad_{0}x{1}x{2}_e{3}_bf16_{4}{5}", rows,
                         k, n, experts, BlockScaledGemm::eltName(offsetElt),
                         tma ? "_tma" : "")
        .str();
  }
};

std::optional<WgmmaWgrad> matchWgmmaWgrad(GroupedMatmulWgradOp op) {
  std::optional<Bf16GemmTypes> types = bf16GemmTypes(
      op, op.getLhs(), op.getRhs(), op.getOffsets(), /*rhsRank=*/2,
      /*resultRank=*/3);
  if (!types)
    return std::nullopt;
  auto [lhs, rhs, offsets, result] = *types;
  int64_t rows = lhs.getDimSize(0), k = lhs.getDimSize(1),
          n = rhs.getDimSize(1), experts = result.getDimSize(0);
  if (rows < 1 || rhs.getDimSize(0) != rows || k < kHTileM || k % kHTileM ||
      n < kHTileN || n % kHTileN || experts < 1 ||
      offsets.getDimSize(0) != experts + 1 || result.getDimSize(1) != k ||
      result.getDimSize(2) != n)
    return std::nullopt;
  return WgmmaWgrad{rows, k, n, experts, offsets.getElementType(),
                    /*tma=*/n % kTTileN == 0 && rows >= kTTileK};
}

/// Emits the body of the wgmma weight-gradient kernel's gpu.launch.
struct WgmmaWgradEmitter : HopperEmitterBase {
  const WgmmaWgrad &g;
  // Buffers: lhs [R, K] bf16, rhs [R, N] bf16, offsets [E+1], result
  // [E, K, N] f32.
  Value x, dy, offsets, out;
  Value tid{}, k0{}, n0{}, xGlobal{}, dyGlobal{};

  /// Stage `st` (rows [lo + 64 st, lo + 64 st + 64), those below `hi`) into
  /// ring buffer `slot`.
  void loadStage(Value lo, Value hi, Value st, Value slot) {
    Value stageBase = mul(slot, idx(kHStageBytes));
    Value rowsLast = idx(g.rows - 1);
    // Row r of both tiles is row lo + 64 st + r; rows at or past hi are
    // zero (read from a clamped address with source size 0).
    auto source = [&](int64_t width, Value col0) {
      return [&, width, col0](Value r, Value col) {
        Value row = add(lo, add(mul(st, idx(kHTileK)), r));
        Value bytes = select(cmp(P::slt, row, hi), int32(16), int32(0));
        Value at = minS(row, rowsLast);
        return std::make_pair(
            mul(add(mul(at, idx(width)), add(col0, col)), idx(2)), bytes);
      };
    };
    copyMNMajorTile(tid, stageBase, xGlobal, source(g.k, k0));
    copyMNMajorTile(tid, add(stageBase, idx(kHTileABytes)), dyGlobal,
                    source(g.n, n0));
  }

  void emit(gpu::LaunchOp launch) {
    tid = launch.getThreadIds().x;
    n0 = mul(launch.getBlockIds().x, idx(kHTileN));
    k0 = mul(launch.getBlockIds().y, idx(kHTileM));
    Value e = launch.getBlockIds().z;
    setUp(kHLBO, kHSBO, /*swizzled=*/true);
    xGlobal = baseAddress(x);
    dyGlobal = baseAddress(dy);

    Value lo, hi;
    std::tie(lo, hi) = groupRows(offsets, e, g.rows);
    Value stages = div(
        add(arith::SubIOp::create(b, loc, hi, lo), idx(kHTileK - 1)), kHTileK);
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
        Value r = add(rowBase, idx(kHMmaM * hf + 8 * h));
        for (int64_t j = 0; j < kHTileN / 8; ++j)
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
func::FuncOp getOrCreateWgmmaWgradFunction(ModuleOp module,
                                           SymbolTable &symbols,
                                           const WgmmaWgrad &g,
                                           ArrayRef<Type> argTypes,
                                           RankedTensorType resultType,
                                           Location loc) {
  if (g.tma)
    return getOrCreateWgmmaTmaFunction(
        module, symbols,
        TmaGemm{g.rows, g.k, g.n, g.experts, /*rhsTransposed=*/false,
                /*liveRowsOnly=*/false, /*wgrad=*/true, /*swiglu=*/std::nullopt},
        g.name(), argTypes, ArrayRef(resultType), loc);
  return withGroupedArgs(getOrCreateKernelCall(
      module, symbols, g.name(), "wgmma.mma_async bf16 weight gradient",
      argTypes, resultType, loc,
      {g.n / kHTileN, g.k / kHTileM, g.experts, kHThreads,
       kHSmemBytes},
      [&](OpBuilder &b, gpu::LaunchOp launch, ArrayRef<Value> buf, Value out) {
        WgmmaWgradEmitter k{{{b, loc}}, g, buf[0], buf[1], buf[2], out};
        k.emit(launch);
      }),
                         {0, 1}, 2);
}

/// A weight gradient in the form the wgmma kernel takes: MX operands whose
/// blocks run along the rows (the contraction; `axis = 0`) dequantized to
/// bf16, exactly as for the forward GEMM (see rewriteForWgmma). Returns the
/// kernel's call, or nullptr (nothing changed).
Operation *lowerWgradToWgmma(GroupedMatmulWgradOp op, ModuleOp module,
                             SymbolTable &symbols) {
  if (!bf16OrMXAlong(op.getLhs(), 0) || !bf16OrMXAlong(op.getRhs(), 0))
    return nullptr;
  OpBuilder b(op);
  Location loc = op.getLoc();
  SmallVector<Operation *> created;
  Value x = toBF16(b, loc, op.getLhs(), created),
        dy = toBF16(b, loc, op.getRhs(), created);
  auto bf16Op = GroupedMatmulWgradOp::create(b, loc, op.getType(), x, dy,
                                             op.getOffsets());
  std::optional<WgmmaWgrad> w = matchWgmmaWgrad(bf16Op);
  if (!w) {
    bf16Op.erase();
    for (Operation *c : llvm::reverse(created))
      c->erase();
    return nullptr;
  }
  SmallVector<Type> argTypes = {x.getType(), dy.getType(),
                                op.getOffsets().getType()};
  func::FuncOp kernel = getOrCreateWgmmaWgradFunction(
      module, symbols, *w, argTypes, op.getType(), loc);
  auto call = func::CallOp::create(b, loc, kernel,
                                   ValueRange{x, dy, op.getOffsets()});
  bf16Op.erase();
  op.getResult().replaceAllUsesWith(call.getResult(0));
  op.erase();
  return call;
}

//===----------------------------------------------------------------------===//
// Hopper (sm_90a): f32 dense matmul on CUDA cores
//===----------------------------------------------------------------------===//
//
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

constexpr int64_t kSTile = 128, kSTileK = 16, kSThreads = 256, kSPer = 4;
// A thread's rows (columns): 2 groups of kSPer, kSHalf apart.
constexpr int64_t kSGroups = 2, kSHalf = kSTile / kSGroups;
constexpr int64_t kSAcc = kSGroups * kSPer * kSGroups * kSPer; // 64
// Per K step a thread loads 2 x 4 elements of A and of B.
constexpr int64_t kSLoads = 2 * kSGroups * kSPer;
constexpr int64_t kSBTileBytes = kSTileK * kSTile * 4; // 8192
// Every element of the 128 x 16 A and 16 x 128 B tiles loaded once a step.
static_assert(kSThreads * kSLoads == 2 * kSTile * kSTileK,
              "f32 matmul: tile loads");

struct SimtMatmul {
  int64_t m, n, k;
  /// K splits (1: none).
  int64_t splits = 1;
  std::string name() const {
    return llvm::formatv("moe_simt_matmul_{0}x{1}x{2}_f32", m, n, k).str();
  }
  int64_t steps() const { return llvm::divideCeil(k, kSTileK); }
  /// K steps of 16 a split takes.
  int64_t stepsPerSplit() const { return llvm::divideCeil(steps(), splits); }
};

/// Few output tiles over a long K (a weight gradient summed over tokens:
/// [2048 x 128] over 8192 tokens is 16 tiles) would leave most of the GPU's
/// 132 SMs idle: K is split so that about two CTAs run per SM, each split
/// at least 64 steps of 16.
int64_t simtSplits(int64_t m, int64_t n, int64_t k) {
  int64_t tiles = tilesOf(m, kSTile) * tilesOf(n, kSTile);
  int64_t steps = llvm::divideCeil(k, kSTileK);
  int64_t splits = 1;
  while (splits < 16 && tiles * splits * 2 <= 264 && steps / (splits * 2) >= 64)
    splits *= 2;
  return splits;
}

std::optional<SimtMatmul> matchSimtMatmul(linalg::MatmulOp op) {
  if (op.hasUserDefinedMaps() || op->getParentOfType<ExpertsOp>() ||
      !op.hasPureTensorSemantics() || op.getInputs().size() != 2 ||
      op.getOutputs().size() != 1)
    return std::nullopt;
  auto a = dyn_cast<RankedTensorType>(op.getInputs()[0].getType());
  auto b = dyn_cast<RankedTensorType>(op.getInputs()[1].getType());
  auto c = dyn_cast<RankedTensorType>(op.getOutputs()[0].getType());
  if (!a || !b || !c || a.getRank() != 2 || b.getRank() != 2 ||
      c.getRank() != 2 || !a.hasStaticShape() || !b.hasStaticShape() ||
      !c.hasStaticShape() || !a.getElementType().isF32() ||
      !b.getElementType().isF32() || !c.getElementType().isF32())
    return std::nullopt;
  int64_t m = a.getDimSize(0), k = a.getDimSize(1), n = b.getDimSize(1);
  if (m < 1 || n < 1 || k < 1 || b.getDimSize(0) != k ||
      c.getDimSize(0) != m || c.getDimSize(1) != n)
    return std::nullopt;
  // Fewer than 1024 outputs (a dot product, a short matrix-vector product):
  // one or two CTAs would do all of K; the generic path splits such
  // reductions over many threads (-moe-gpu-split-reductions).
  if (m * n < 1024)
    return std::nullopt;
  return SimtMatmul{m, n, k, simtSplits(m, n, k)};
}

/// Emits the body of the f32 matmul's gpu.launch.
struct SimtMatmulEmitter : HopperEmitterBase {
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
          b, loc, ValueRange{memref::LoadOp::create(b, loc, memref,
                                                    ValueRange{r, c})});
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
  Value aRow(int64_t r) { return add(div(tid, 4), idx(kSHalf * r)); }
  Value aCol() { return mul(rem(tid, 4), idx(kSPer)); }
  Value bRow(int64_t r) { return add(div(tid, 32), idx(8 * r)); }
  Value bCol() { return mul(rem(tid, 32), idx(kSPer)); }
  /// Loads them (zero outside A or B), A's 8, then B's: each run of 4 as
  /// one 16-byte load where it lies inside its matrix and rows are 16-byte
  /// aligned (`vectorOk`), else one bounds-checked load an element (so a
  /// matrix narrower than the tile takes the slow loads only at its edge).
  SmallVector<Value> loadStep(Value kt, Value vectorOk) {
    Value k0 = mul(kt, idx(kSTileK));
    SmallVector<Value> values;
    auto run = [&](Value m, Value base, Value row, Value col, int64_t rows,
                   int64_t cols) {
      Value inside = land(vectorOk, land(cmp(P::slt, row, idx(rows)),
                                         cmp(P::sle, add(col, idx(kSPer)),
                                             idx(cols))));
      llvm::append_range(
          values,
          ifElse(
              SmallVector<Type>(kSPer, b.getF32Type()), inside,
              [&] {
                Value at = mul(add(mul(row, idx(cols)), col), idx(4));
                return loadVector(b.getF32Type(), kSPer, globalPtr(base, at),
                                  16);
              },
              [&] {
                SmallVector<Value> elements;
                for (int64_t q = 0; q < kSPer; ++q)
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
      for (int64_t q = 0; q < kSPer; ++q)
        storeSharedF32(
            mul(add(mul(add(aCol(), idx(q)), idx(kSTile)), aRow(r)), idx(4)),
            values[kSPer * r + q]);
    for (int64_t r = 0; r < 2; ++r) {
      Value v = vectorOf(ArrayRef(values).slice(2 * kSPer + kSPer * r, kSPer));
      LLVM::StoreOp::create(
          b, loc, v,
          sharedPtrAt(add(idx(kSBTileBytes),
                          mul(add(mul(bRow(r), idx(kSTile)), bCol()), idx(4)))),
          /*alignment=*/16);
    }
  }
  /// 4 consecutive f32 of shared memory from byte `byteOffset` (16-aligned).
  SmallVector<Value> loadShared4(Value byteOffset) {
    return loadVector(b.getF32Type(), kSPer, sharedPtrAt(byteOffset), 16);
  }

  void emit(gpu::LaunchOp launch) {
    tid = launch.getThreadIds().x;
    n0 = mul(launch.getBlockIds().x, idx(kSTile));
    m0 = mul(launch.getBlockIds().y, idx(kSTile));
    setUp(/*lbo=*/0, /*sbo=*/0); // (no MMA descriptors here)
    aBase = baseAddress(a);
    bBase = baseAddress(bm);
    // 16-byte loads need rows of A and B (K and N f32) and both buffers
    // 16-byte aligned.
    Value vectorOk = boolean(g.k % kSPer == 0 && g.n % kSPer == 0);
    vectorOk = land(vectorOk,
                    cmp(P::eq,
                        arith::AndIOp::create(
                            b, loc, arith::OrIOp::create(b, loc, aBase, bBase),
                            int64(15)),
                        int64(0)));
    Value tx = rem(tid, 16), ty = div(tid, 16);
    Value zero = arith::ConstantOp::create(b, loc, b.getF32FloatAttr(0));
    // This CTA's K steps: all, or those of split z.
    Value split = launch.getBlockIds().z;
    Value first = mul(split, idx(g.stepsPerSplit()));
    Value count = minS(idx(g.stepsPerSplit()),
                       maxS(arith::SubIOp::create(b, loc, idx(g.steps()), first),
                            idx(0)));
    // Step kt's tiles are in shared memory while step kt + 1's loads are in
    // flight (in registers, stored after the step's FMAs).
    // Accumulator ii * 8 + jj: row 64 (ii / 4) + 4 ty + ii % 4, column
    // 64 (jj / 4) + 4 tx + jj % 4 of the tile.
    constexpr int64_t side = kSGroups * kSPer;
    auto rowOf = [&](int64_t ii) {
      return add(m0, add(mul(ty, idx(kSPer)),
                         idx(kSHalf * (ii / kSPer) + ii % kSPer)));
    };
    auto colOf = [&](int64_t jj) {
      return add(n0, add(mul(tx, idx(kSPer)),
                         idx(kSHalf * (jj / kSPer) + jj % kSPer)));
    };
    SmallVector<Value> init(kSAcc, zero);
    SmallVector<Value> staged =
        ifElse(SmallVector<Type>(kSLoads, b.getF32Type()),
               cmp(P::sgt, count, idx(0)),
               [&] { return loadStep(first, vectorOk); },
               [&] { return SmallVector<Value>(kSLoads, zero); });
    llvm::append_range(init, staged);
    SmallVector<Value> acc = forLoop(
        0, count, init,
        [&](Value kt, ValueRange carried) -> SmallVector<Value> {
          storeStep(llvm::to_vector(carried.drop_front(kSAcc)));
          NVVM::Barrier0Op::create(b, loc);
          Value next = add(add(first, kt), idx(1));
          SmallVector<Value> prefetched = ifElse(
              SmallVector<Type>(kSLoads, b.getF32Type()),
              cmp(P::slt, add(kt, idx(1)), count),
              [&] { return loadStep(next, vectorOk); },
              [&] { return SmallVector<Value>(kSLoads, zero); });
          SmallVector<Value> d(carried.begin(), carried.begin() + kSAcc);
          for (int64_t kk = 0; kk < kSTileK; ++kk) {
            SmallVector<Value> av, bv;
            for (int64_t p = 0; p < kSGroups; ++p) {
              llvm::append_range(
                  av, loadShared4(mul(add(idx(kk * kSTile + kSHalf * p),
                                          mul(ty, idx(kSPer))),
                                      idx(4))));
              llvm::append_range(
                  bv, loadShared4(add(idx(kSBTileBytes),
                                      mul(add(idx(kk * kSTile + kSHalf * p),
                                              mul(tx, idx(kSPer))),
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
    Value gtid = add(mul(launch.getBlockIds().x, idx(kSThreads)),
                     launch.getThreadIds().x);
    strideLoop(gtid, idx(g.m * g.n), grid * kSThreads, [&](Value e) {
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
func::FuncOp getOrCreateSimtMatmulFunction(ModuleOp module,
                                           SymbolTable &symbols,
                                           const SimtMatmul &g,
                                           ArrayRef<Type> argTypes,
                                           RankedTensorType resultType,
                                           Location loc) {
  return getOrCreateKernelCall(
      module, symbols, g.name(), "f32 matmul, shared-memory tiles", argTypes,
      resultType, loc,
      {tilesOf(g.n, kSTile), tilesOf(g.m, kSTile), g.splits, kSThreads,
       2 * kSBTileBytes},
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
        int64_t grid = std::min<int64_t>(tilesOf(g.m * g.n, kSThreads), 1024);
        auto sum = createNamedLaunch(b, loc, {grid, 1, 1, kSThreads, 0},
                                     g.name() + "_sum_kernel");
        b.setInsertionPoint(sum.getBody().front().getTerminator());
        k.emitSum(sum, grid);
      });
}

//===----------------------------------------------------------------------===//
// Hopper (sm_90a): MXFP8 grouped GEMM on FP8 wgmma with per-block promotion
//===----------------------------------------------------------------------===//
//
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
// wgmma kernel above.
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

constexpr int64_t kXTileK = 64;                // K per stage: 2 MX blocks
constexpr int64_t kXMmaK = 32;                 // one FP8 wgmma = one block
constexpr int64_t kXBlocks = kXTileK / kBlock; // 2
constexpr int64_t kXOffB = kHTileM * kXTileK;  // 8192
constexpr int64_t kXOffSA = kXOffB + kHTileN * kXTileK;        // 16384
constexpr int64_t kXOffSB = kXOffSA + kXBlocks * kHTileM * 4;  // 17408
constexpr int64_t kXStageBytes = kXOffSB + kXBlocks * kHTileN * 4; // 18432
constexpr int64_t kXStages = 4, kXAhead = 2; // ring depth, stages ahead
constexpr int64_t kXSmemBytes = kXStages * kXStageBytes;       // 73728
constexpr int64_t kXLBO = 128;                 // next core matrix along K
constexpr int64_t kXSBO = kXTileK / 16 * 128;  // next 8 rows / columns: 512

/// One MXFP8 grouped GEMM shape the FP8 wgmma kernel handles.
struct WgmmaMxGemm {
  int64_t rows, k, n, experts;
  Type lhsElt, rhsElt, offsetElt;
  std::string name() const {
    return llvm::formatv("moe_wgmma_mx_gmm_{0}x{1}x{2}_e{3}_{4}_{5}_{6}", rows,
                         k, n, experts, BlockScaledGemm::eltName(lhsElt),
                         BlockScaledGemm::eltName(rhsElt),
                         BlockScaledGemm::eltName(offsetElt))
        .str();
  }
  static NVVM::WGMMATypes type(Type t) {
    return isa<Float8E5M2Type>(t) ? NVVM::WGMMATypes::e5m2
                                  : NVVM::WGMMATypes::e4m3;
  }
};

std::optional<WgmmaMxGemm> matchWgmmaMxGemm(GroupedMatmulOp op) {
  if (op.getTransposeRhs() || op->getParentOfType<ExpertsOp>())
    return std::nullopt;
  auto lhs = dyn_cast<MXTensorType>(op.getLhs().getType());
  auto rhs = dyn_cast<MXTensorType>(op.getRhs().getType());
  auto offsets = dyn_cast<RankedTensorType>(op.getOffsets().getType());
  RankedTensorType result = op.getType();
  if (!lhs || !rhs || !offsets || lhs.getRank() != 2 || rhs.getRank() != 3 ||
      result.getRank() != 2 || offsets.getRank() != 1 ||
      lhs.getAxis() != 1 || rhs.getAxis() != 1 ||
      lhs.getBlockSize() != kBlock || rhs.getBlockSize() != kBlock ||
      !isMXFP8(lhs.getElementType()) || !isMXFP8(rhs.getElementType()) ||
      !result.getElementType().isF32() || !result.hasStaticShape() ||
      !offsets.hasStaticShape() || !offsets.getElementType().isInteger() ||
      ShapedType::isDynamicShape(lhs.getShape()) ||
      ShapedType::isDynamicShape(rhs.getShape()))
    return std::nullopt;
  int64_t rows = lhs.getShape()[0], k = lhs.getShape()[1];
  int64_t experts = rhs.getShape()[0], n = rhs.getShape()[2];
  if (rows < 1 || k < kXTileK || k % kXTileK || n < kHTileN || n % kHTileN ||
      experts < 1 || rhs.getShape()[1] != k ||
      offsets.getDimSize(0) != experts + 1 || result.getDimSize(0) != rows ||
      result.getDimSize(1) != n)
    return std::nullopt;
  return WgmmaMxGemm{rows,
                     k,
                     n,
                     experts,
                     lhs.getElementType(),
                     rhs.getElementType(),
                     offsets.getElementType()};
}

/// Emits the body of the MXFP8 wgmma grouped GEMM's gpu.launch.
struct WgmmaMxEmitter : HopperEmitterBase {
  const WgmmaMxGemm &g;
  // Buffers: A data [R, K], A scales [R, K/32], B data [E, K, N], B scales
  // [E, K/32, N], offsets [E+1], result [R, N].
  Value a, aScales, w, wScales, offsets, out;
  Value tid{}, m0{}, n0{}, aGlobal{}, wGlobal{};
  // Per thread: byte offsets (index) of its accumulator rows' scales within
  // a block's A scales ([hf][hh]) and of its columns' within B's ([j][c]).
  SmallVector<Value> rowScaleOff{}, colScaleOff{};

  Value shl(Value x, int64_t s) {
    return arith::ShLIOp::create(b, loc, x, int32(s));
  }
  Value shr(Value x, int64_t s) {
    return arith::ShRUIOp::create(b, loc, x, int32(s));
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

  /// Stage `kt` (K values [64 kt, 64 kt + 64)) of expert `e` into ring
  /// buffer `slot` (layouts in the header of this section).
  void loadStage(Value e, Value kt, Value slot) {
    Value stageBase = mul(slot, idx(kXStageBytes));
    Value k0 = mul(kt, idx(kXTileK));
    Value rowsLast = idx(g.rows - 1);
    Value warp = div(tid, 32), lane = rem(tid, 32);
    // A: chunk (row 8 (4i + t/32) + t%8, K chunk (t/8)%4), cp.async.
    Value lane8 = rem(tid, 8);
    Value aChunk = rem(div(tid, 8), 4);
    Value aDst = add(stageBase, add(mul(warp, idx(kXSBO)),
                                    add(mul(aChunk, idx(kXLBO)),
                                        mul(lane8, idx(16)))));
    Value aCol = add(k0, mul(aChunk, idx(16)));
    for (int64_t i = 0; i < kHTileM * kXTileK / 16 / kHThreads; ++i) {
      Value r = add(lane8, mul(add(warp, idx(4 * i)), idx(8)));
      Value grow = minS(add(m0, r), rowsLast);
      Value src = add(mul(grow, idx(g.k)), aCol);
      copy16(add(aDst, idx(4 * i * kXSBO)), aGlobal, src);
    }
    // B: 4 x 4 byte blocks (K rows 4 (t/32) + 16 i + q, N columns
    // 4 (t%32) + c), transposed in registers.
    Value n = mul(lane, idx(4));
    Value kIn = mul(warp, idx(4)); // k % 16
    Value bDst = add(stageBase,
                     add(idx(kXOffB), add(mul(div(n, 8), idx(kXSBO)),
                                          add(mul(rem(n, 8), idx(16)), kIn))));
    Value bRow0 = add(mul(e, idx(g.k)), add(k0, kIn));
    for (int64_t i = 0; i < kXTileK / 16; ++i) {
      SmallVector<Value> in;
      for (int64_t q = 0; q < 4; ++q) {
        Value krow = add(bRow0, idx(16 * i + q));
        Value src = add(mul(krow, idx(g.n)), add(n0, n));
        in.push_back(LLVM::LoadOp::create(b, loc, i32(), globalPtr(wGlobal, src),
                                          /*alignment=*/4));
      }
      for (int64_t c = 0; c < 4; ++c) {
        Value word;
        for (int64_t q = 0; q < 4; ++q) {
          Value byte = arith::AndIOp::create(b, loc, shr(in[q], 8 * c),
                                             int32(0xff));
          Value placed = q ? shl(byte, 8 * q) : byte;
          word = q ? lor(word, placed) : placed;
        }
        Value dst = add(bDst, idx(i * kXLBO + c * 16));
        LLVM::StoreOp::create(b, loc, word, sharedPtrAt(dst), /*alignment=*/4);
      }
    }
    // Scales: row m0 + t (clamped) and column n0 + t, blocks 2 kt + j.
    Value safeRow = minS(add(m0, tid), rowsLast);
    for (int64_t j = 0; j < kXBlocks; ++j) {
      Value block = add(mul(kt, idx(kXBlocks)), idx(j));
      Value sa = scaleToF32(loadBits(aScales, {safeRow, block}));
      Value sb = scaleToF32(loadBits(wScales, {e, block, add(n0, tid)}));
      Value at = mul(add(idx(j * kHTileM), tid), idx(4));
      LLVM::StoreOp::create(b, loc, sa,
                            sharedPtrAt(add(stageBase, add(idx(kXOffSA), at))),
                            /*alignment=*/4);
      LLVM::StoreOp::create(b, loc, sb,
                            sharedPtrAt(add(stageBase, add(idx(kXOffSB), at))),
                            /*alignment=*/4);
    }
  }

  Value loadF32(Value byteOffset) {
    return LLVM::LoadOp::create(b, loc, b.getF32Type(), sharedPtrAt(byteOffset),
                                /*alignment=*/4);
  }

  SmallVector<Value> kLoop(Value e) {
    int64_t nk = g.k / kXTileK;
    for (int64_t p = 0; p < kXAhead; ++p) {
      if (p < nk)
        loadStage(e, idx(p), idx(p));
      NVVM::CpAsyncCommitGroupOp::create(b, loc);
    }
    Value zero = LLVM::ZeroOp::create(b, loc, accType);
    MLIRContext *ctx = b.getContext();
    auto shape = NVVM::MMAShapeAttr::get(ctx, kHMmaM, kHTileN, kXMmaK);
    auto typeA = NVVM::WGMMATypesAttr::get(ctx, WgmmaMxGemm::type(g.lhsElt));
    auto typeB = NVVM::WGMMATypesAttr::get(ctx, WgmmaMxGemm::type(g.rhsElt));
    auto f32 = NVVM::WGMMATypesAttr::get(ctx, NVVM::WGMMATypes::f32);
    // A fresh accumulator for every slice: the partial to promote.
    auto scaleD = NVVM::WGMMAScaleOutAttr::get(ctx, NVVM::WGMMAScaleOut::zero);
    auto scaleIn = NVVM::WGMMAScaleInAttr::get(ctx, NVVM::WGMMAScaleIn::one);
    // Both operands K-major: A `row`, B `col`.
    auto rowLayout = NVVM::MMALayoutAttr::get(ctx, NVVM::MMALayout::row);
    auto colLayout = NVVM::MMALayoutAttr::get(ctx, NVVM::MMALayout::col);
    SmallVector<Value> acc = forLoop(
        0, idx(nk), {zero, zero},
        [&](Value it, ValueRange carried) -> SmallVector<Value> {
          NVVM::CpAsyncWaitGroupOp::create(b, loc, kXAhead - 1);
          fenceForAsyncProxy();
          NVVM::Barrier0Op::create(b, loc);
          Value next = add(it, idx(kXAhead));
          ifThen(cmp(P::slt, next, idx(nk)),
                 [&] { loadStage(e, next, rem(next, kXStages)); });
          NVVM::CpAsyncCommitGroupOp::create(b, loc);

          Value slot = rem(it, kXStages);
          Value slotBase = mul(slot, idx(kXStageBytes));
          Value slotUnits = toI64(mul(slot, idx(kXStageBytes >> 4)));
          SmallVector<Value> d(carried.begin(), carried.end());
          for (int64_t s = 0; s < kXBlocks; ++s) {
            Value bDesc = descriptor(slotUnits, kXOffB + 256 * s);
            Value sbBase = add(slotBase, idx(kXOffSB + 4 * kHTileN * s));
            Value saBase = add(slotBase, idx(kXOffSA + 4 * kHTileM * s));
            SmallVector<Value> colScale;
            for (Value off : colScaleOff)
              colScale.push_back(loadF32(add(sbBase, off)));
            for (int64_t hf = 0; hf < kHTileM / kHMmaM; ++hf) {
              Value aDesc =
                  descriptor(slotUnits, hf * (kHMmaM / 8) * kXSBO + 256 * s);
              Value fresh = LLVM::UndefOp::create(b, loc, accType);
              NVVM::WgmmaFenceAlignedOp::create(b, loc);
              Value part = NVVM::WgmmaMmaAsyncOp::create(
                  b, loc, accType, fresh, aDesc, bDesc, shape, typeA, typeB,
                  f32, scaleD, scaleIn, scaleIn, rowLayout, colLayout,
                  /*satfinite=*/NVVM::MMAIntOverflowAttr());
              NVVM::WgmmaGroupSyncAlignedOp::create(b, loc);
              NVVM::WgmmaWaitGroupSyncOp::create(b, loc, 0);
              // Promotion: acc += (P * 2^sa(row)) * 2^sb(col).
              Value rowScale[2];
              for (int64_t hh = 0; hh < 2; ++hh)
                rowScale[hh] = loadF32(add(saBase, rowScaleOff[2 * hf + hh]));
              Value x = d[hf];
              for (int64_t j = 0; j < kHTileN / 8; ++j)
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
    n0 = mul(launch.getBlockIds().x, idx(kHTileN));
    m0 = mul(launch.getBlockIds().y, idx(kHTileM));
    setUp(kXLBO, kXSBO);
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
        rows.push_back(add(rowBase, idx(kHMmaM * hf + 8 * h)));
        rowScaleOff.push_back(
            mul(add(rowInHalf, idx(kHMmaM * hf + 8 * h)), idx(4)));
      }
    for (int64_t j = 0; j < kHTileN / 8; ++j)
      for (int64_t c = 0; c < 2; ++c)
        colScaleOff.push_back(mul(add(colInTile, idx(8 * j + c)), idx(4)));

    Value rowsEnd = idx(g.rows);
    Value tileEnd = add(m0, idx(kHTileM));
    SmallVector<Value> noneCovered(rows.size(), boolean(false));
    SmallVector<Value> covered = forLoop(
        0, idx(g.experts), noneCovered,
        [&](Value e, ValueRange carried) -> SmallVector<Value> {
          Value lo, hi;
          std::tie(lo, hi) = groupRows(offsets, e, g.rows);
          Value meets = cmp(P::slt, maxS(lo, m0), minS(hi, tileEnd));
          SmallVector<Type> types(rows.size(), i1());
          return ifElse(
              types, meets,
              [&]() -> SmallVector<Value> {
                SmallVector<Value> acc = kLoop(e);
                SmallVector<Value> result;
                for (int64_t q = 0; q < int64_t(rows.size()); ++q) {
                  Value r = rows[q];
                  Value inGroup = land(cmp(P::sle, lo, r), cmp(P::slt, r, hi));
                  int64_t hf = q / 2, h = q % 2;
                  ifThen(inGroup, [&] {
                    for (int64_t j = 0; j < kHTileN / 8; ++j)
                      for (int64_t c = 0; c < 2; ++c) {
                        Value v = LLVM::ExtractValueOp::create(
                            b, loc, acc[hf],
                            ArrayRef<int64_t>{4 * j + 2 * h + c});
                        memref::StoreOp::create(
                            b, loc, v, out,
                            ValueRange{r, add(colBase, idx(8 * j + c))});
                      }
                  });
                  result.push_back(lor(carried[q], inGroup));
                }
                // Every warp is done with the ring before the next expert's
                // loads overwrite it.
                NVVM::Barrier0Op::create(b, loc);
                return result;
              },
              [&]() -> SmallVector<Value> {
                return SmallVector<Value>(carried.begin(), carried.end());
              });
        });

    Value zero = arith::ConstantOp::create(b, loc, b.getF32FloatAttr(0.0));
    for (int64_t q = 0; q < int64_t(rows.size()); ++q) {
      Value uncovered =
          land(arith::XOrIOp::create(b, loc, covered[q], boolean(true)),
               cmp(P::slt, rows[q], rowsEnd));
      ifThen(uncovered, [&] {
        for (int64_t j = 0; j < kHTileN / 8; ++j)
          for (int64_t c = 0; c < 2; ++c)
            memref::StoreOp::create(
                b, loc, zero, out,
                ValueRange{rows[q], add(colBase, idx(8 * j + c))});
      });
    }
  }
};

/// The private function computing one MXFP8 grouped GEMM shape on FP8
/// wgmma: (A data, A scales, B data, B scales, offsets) -> result.
func::FuncOp getOrCreateWgmmaMxFunction(ModuleOp module, SymbolTable &symbols,
                                        const WgmmaMxGemm &g,
                                        ArrayRef<Type> argTypes,
                                        RankedTensorType resultType,
                                        Location loc) {
  return withGroupedArgs(getOrCreateKernelCall(
      module, symbols, g.name(), "wgmma.mma_async f8 promoted", argTypes,
      resultType, loc,
      {g.n / kHTileN, tilesOf(g.rows, kHTileM), 1, kHThreads,
       kXSmemBytes},
      [&](OpBuilder &b, gpu::LaunchOp launch, ArrayRef<Value> buf, Value out) {
        WgmmaMxEmitter k{{{b, loc}}, g, buf[0], buf[1], buf[2], buf[3], buf[4],
                         out};
        k.emit(launch);
      }),
                         {0, 1}, 4);
}

//===----------------------------------------------------------------------===//
// MX round trip: moe.dequantize(moe.quantize x) in one pass
//===----------------------------------------------------------------------===//
//
// Handles `moe.dequantize (moe.quantize %x)` with f32 / bf16 / f16 input and
// result, static shape, blocks of 32 along an axis whose length is a
// multiple of 32: the MX rounding of x, as floats. Every MXFP8 GEMM operand
// on Hopper takes this path on its way to the bf16 wgmma kernels (weights
// twice a step, once per blocking). The generic path runs it as four kernels
// and reads x twice (zero the amax, block amax, scale bytes, quantize and
// dequantize); this kernel reads x once and writes only the result. The
// 8-bit data and its scales are not stored (the quantize stays where
// anything else uses them). The scales are MXNumerics.h's; the elements are
// rounded by the hardware's f32 -> f8 conversion, whose rule (nearest even,
// saturating) is buildEncode's: the results are bit-identical to the
// generic lowering (test/Integration/GPU/kernels.mlir checks it on the GPU,
// special values included).
//
// Work: one unit per block of 32 values, units in memory order of their
// first element (row-major over the dims, the block axis counted in blocks).
// Grid: at most kRTMaxBlocks CTAs striding over the work, of 256 threads
// (128 where each thread holds a whole block: 136 registers a thread, so
// three CTAs an SM instead of one).
// - Blocks along the innermost dim (contiguous): 8 lanes per block, 4
//   consecutive values per lane (one 16-byte load when the buffers are
//   16-byte aligned, else 4 loads); the block amax is the lane's 4 and then
//   three xor shuffles among the 8 lanes. A warp takes 4 consecutive blocks
//   (512 contiguous bytes of f32) per iteration; every lane of a warp runs
//   the same iterations, so the shuffles see all 32 lanes.
// - Blocks along an outer dim (values `inner` elements apart): one thread
//   per block, its 32 values in registers; consecutive threads take
//   consecutive columns, so every load and store is coalesced.
// Live rows: with the groups' offsets of a dispatch (LiveRows.h: nothing
// reads the result's rows at or past offsets[E]), only the rows before
// offsets[E] are computed.

constexpr int64_t kRTMaxBlocks = 2048;
constexpr int64_t kRTBlock = 32;

/// Elements of an MX tensor.
int64_t mxElements(MXTensorType mx) {
  int64_t n = 1;
  for (int64_t d : mx.getShape())
    n *= d;
  return n;
}
/// Elements between consecutive values of one block of an MX tensor.
int64_t mxInner(MXTensorType mx) {
  int64_t n = 1;
  for (int64_t d : mx.getShape().drop_front(mx.getAxis() + 1))
    n *= d;
  return n;
}
/// An MX tensor's shape and block axis in a kernel name: `4x64x96_a1`.
std::string mxShapeName(MXTensorType mx) {
  std::string dims;
  for (int64_t d : mx.getShape())
    dims += (dims.empty() ? "" : "x") + std::to_string(d);
  return dims + "_a" + std::to_string(mx.getAxis());
}

/// One MX round trip shape the kernel handles.
struct MXRoundTrip {
  MXTensorType mx;
  Type inElt, outElt;
  ScaleMode mode;
  /// The offsets' element type when the kernel computes only the rows before
  /// their last entry; null otherwise.
  Type offsetElt;

  int64_t elements() const { return mxElements(mx); }
  /// Elements between consecutive values of one block.
  int64_t inner() const { return mxInner(mx); }
  std::string name() const {
    return llvm::formatv("moe_mx_round_trip_{0}_{1}_{2}_{3}_to_{4}{5}",
                         mxShapeName(mx),
                         BlockScaledGemm::eltName(mx.getElementType()),
                         stringifyScaleMode(mode),
                         BlockScaledGemm::eltName(inElt),
                         BlockScaledGemm::eltName(outElt),
                         offsetElt ? "_live_" + BlockScaledGemm::eltName(
                                                    offsetElt)
                                   : std::string())
        .str();
  }
  int64_t units() const { return elements() / kRTBlock; }
  /// Threads a CTA.
  int64_t ctaThreads() const { return inner() == 1 ? 256 : 128; }
  /// Threads one pass over all units takes.
  int64_t threads() const { return inner() == 1 ? units() * 8 : units(); }
};

bool isRoundTripFloat(Type t) { return t.isF32() || t.isBF16() || t.isF16(); }

/// The round trip `dq` computes, if the kernel handles it.
std::optional<MXRoundTrip> matchRoundTrip(DequantizeOp dq) {
  auto q = dq.getInput().getDefiningOp<QuantizeOp>();
  if (!q || dq->getParentOfType<ExpertsOp>())
    return std::nullopt;
  auto mx = cast<MXTensorType>(q.getType());
  auto in = dyn_cast<RankedTensorType>(q.getInput().getType());
  RankedTensorType out = dq.getType();
  if (!in || !in.hasStaticShape() || !out.hasStaticShape() ||
      ShapedType::isDynamicShape(mx.getShape()) ||
      !isRoundTripFloat(in.getElementType()) ||
      !isRoundTripFloat(out.getElementType()) ||
      mx.getBlockSize() != kRTBlock ||
      mx.getShape()[mx.getAxis()] % kRTBlock != 0 || in.getNumElements() == 0)
    return std::nullopt;
  return MXRoundTrip{mx, in.getElementType(), out.getElementType(),
                     q.getScaleMode(), Type()};
}

/// Emits the body of the round trip's gpu.launch.
struct RoundTripEmitter : EmitterBase {
  const MXRoundTrip &g;
  int64_t grid;
  Value x, offsets, out; // offsets: null unless g.offsetElt

  /// The block's values rounded through the MX format, as the result type
  /// (the hardware conversions make the kernel memory-bound; buildEncode's
  /// and buildDecode's integer emulation made it ALU-bound).
  SmallVector<Value> roundTrip(ArrayRef<Value> values, Value amax) {
    return mxRoundTrip(values, amax, g.mx.getElementType(), g.mode, g.outElt);
  }

  void emit(gpu::LaunchOp launch) {
    Value tid = launch.getThreadIds().x;
    Value gtid = add(mul(launch.getBlockIds().x, idx(g.ctaThreads())), tid);
    Value xs = flat(x), ys = flat(out);
    // The units to compute: all, or those of the rows before offsets[E].
    Value units = idx(g.units());
    if (offsets) {
      int64_t rows = g.mx.getShape()[0];
      units = mul(groupsEnd(offsets, rows), idx(g.units() / rows));
    }
    if (g.inner() == 1)
      emitContiguous(tid, gtid, units, xs, ys);
    else
      emitStrided(gtid, units, xs, ys);
  }

  /// Blocks along the innermost dim: 8 lanes a block, 4 values a lane.
  void emitContiguous(Value tid, Value gtid, Value units, Value xs, Value ys) {
    unsigned inBytes = g.inElt.getIntOrFloatBitWidth() / 8;
    Value xBase = baseAddress(xs), yBase = baseAddress(ys);
    // 16-byte vector accesses need both buffers 16-byte aligned (device
    // allocations are; a caller's buffer need not be).
    Value aligned =
        cmp(P::eq,
            arith::AndIOp::create(
                b, loc, arith::OrIOp::create(b, loc, xBase, yBase), int64(15)),
            int64(0));
    Value lane = rem(tid, 32);
    Value warps = div(add(units, idx(3)), 4);
    strideLoop(div(gtid, 32), warps, grid * g.ctaThreads() / 32, [&](Value w) {
      Value unit = add(mul(w, idx(4)), div(lane, 8));
      Value first = add(mul(unit, idx(kRTBlock)), mul(rem(lane, 8), idx(4)));
      Value valid = cmp(P::ult, unit, units);
      SmallVector<Type> inTypes(4, g.inElt);
      SmallVector<Value> values = ifElse(
          inTypes, valid,
          [&] {
            return ifElse(
                inTypes, aligned,
                [&] {
                  return loadVector(
                      g.inElt, 4, globalPtr(xBase, mul(first, idx(inBytes))),
                      4 * inBytes);
                },
                [&] {
                  SmallVector<Value> parts;
                  for (int64_t j = 0; j < 4; ++j)
                    parts.push_back(memref::LoadOp::create(
                        b, loc, xs, ValueRange{add(first, idx(j))}));
                  return parts;
                });
          },
          [&] {
            Value zero =
                arith::ConstantOp::create(b, loc, b.getZeroAttr(g.inElt));
            return SmallVector<Value>(4, zero);
          });
      for (Value &v : values)
        v = toF32(v);
      Value amax = warpMax(amaxOf(values), {4, 2, 1});
      SmallVector<Value> results = roundTrip(values, amax);
      ifThen(valid, [&] { storeRun(ys, yBase, first, results, aligned); });
    });
  }

  /// Blocks along an outer dim: a thread a block, 32 values in registers.
  void emitStrided(Value gtid, Value units, Value xs, Value ys) {
    int64_t inner = g.inner();
    strideLoop(gtid, units, grid * g.ctaThreads(), [&](Value u) {
      // Unit u = (block row q, column i): values (32 q + j) * inner + i.
      Value first =
          add(mul(div(u, inner), idx(kRTBlock * inner)), rem(u, inner));
      SmallVector<Value> at, values;
      for (int64_t j = 0; j < kRTBlock; ++j) {
        at.push_back(add(first, idx(j * inner)));
        values.push_back(
            toF32(memref::LoadOp::create(b, loc, xs, ValueRange{at.back()})));
      }
      SmallVector<Value> results = roundTrip(values, amaxOf(values));
      for (int64_t j = 0; j < kRTBlock; ++j)
        memref::StoreOp::create(b, loc, results[j], ys, ValueRange{at[j]});
    });
  }
};

/// The private function computing one round trip: (x[, offsets]) -> result.
func::FuncOp getOrCreateRoundTripFunction(ModuleOp module, SymbolTable &symbols,
                                          const MXRoundTrip &g,
                                          ArrayRef<Type> argTypes,
                                          RankedTensorType resultType,
                                          Location loc) {
  int64_t grid =
      std::min(tilesOf(g.threads(), g.ctaThreads()), kRTMaxBlocks);
  func::FuncOp kernel = getOrCreateKernelCall(
      module, symbols, g.name(), "mx round trip", argTypes, resultType, loc,
      {grid, 1, 1, g.ctaThreads(), 0},
      [&](OpBuilder &b, gpu::LaunchOp launch, ArrayRef<Value> buf, Value out) {
        RoundTripEmitter k{{b, loc}, g, grid, buf[0],
                           g.offsetElt ? buf[1] : Value(), out};
        k.emit(launch);
      });
  return g.offsetElt ? withGroupedArgs(kernel, {0}, 1) : kernel;
}

//===----------------------------------------------------------------------===//
// MX round trips of both blockings of a matrix in one pass
//===----------------------------------------------------------------------===//
//
// A train step rounds each MXFP8 weight [..., K, N] twice: with blocks along
// K for the forward GEMM and along N for the data gradient (transpose_rhs).
// The pair of round trips of the same x (blocks along the last two dims,
// K and N multiples of 32) becomes one kernel that reads x once and writes
// both results (one f32 read and two bf16 writes a value instead of two
// reads and two writes; the K-blocked pass alone also reads 32 rows apart).
//
// Work: tiles of 32 rows x 32 columns of one matrix, a warp a tile, warps
// striding over the tiles (at most kRTMaxBlocks CTAs of 8 warps). Lane l
// loads column l of the tile's 32 rows (every load a coalesced 128-byte row
// of f32): its 32 values are one block of the K-blocked result. The tile
// goes through the warp's shared-memory slab so that lane l then holds row
// l: one block of the N-blocked result, stored as one 32-value run. Each
// lane computes two scales a tile (a block's scale in every lane of the
// warp, by shuffles, made the kernel ALU-bound). Scales and rounding are
// mxRoundTrip's: both results are bit-identical to the single round trips'.

constexpr int64_t kRTPairWarps = 8;               // a CTA
constexpr int64_t kRTPairSlabBytes = 32 * 33 * 4; // a warp's tile

/// One pair of round trips of x: `alongK` with blocks along dim rank - 2,
/// `alongN` along rank - 1.
struct MXRoundTripPair {
  MXRoundTrip alongK, alongN;
  /// Which results the kernel computes (both, unless the pair was split to
  /// hold less memory: see lowerRoundTripPairs).
  bool withK = true, withN = true;
  int64_t matrices() const {
    int64_t n = 1;
    for (int64_t d : alongK.mx.getShape().drop_back(2))
      n *= d;
    return n;
  }
  int64_t rows() const { return alongK.mx.getShape().drop_back().back(); }
  int64_t cols() const { return alongK.mx.getShape().back(); }
  int64_t tiles() const { return matrices() * rows() / 32 * (cols() / 32); }
  std::string name() const {
    std::string shape = mxShapeName(alongK.mx);
    return llvm::formatv(
               "moe_mx_round_trip_pair_{0}_{1}_{2}_{3}_{4}_{5}_to_{6}_{7}",
               shape.substr(0, shape.rfind('_')),
               BlockScaledGemm::eltName(alongK.mx.getElementType()),
               stringifyScaleMode(alongK.mode),
               BlockScaledGemm::eltName(alongN.mx.getElementType()),
               stringifyScaleMode(alongN.mode),
               BlockScaledGemm::eltName(alongK.inElt),
               BlockScaledGemm::eltName(alongK.outElt),
               BlockScaledGemm::eltName(alongN.outElt))
               .str() +
           (withK && withN ? "" : withK ? "_k_only" : "_n_only");
  }
};

/// Emits the body of the round-trip pair's gpu.launch. With `source` (a
/// [rows] index buffer), the pair's row r is gathered row source[r], or
/// zeros where source[r] is outside [0, sourceRows) (a dispatch's gather,
/// fused: see -moe-gpu-fuse-row-gathers): x's row source[r], or with
/// `scale` ([sourceRows] f32) scale[s] * x's row s / perRow (s = source[r];
/// `scaleFirst`: the product's operand order).
struct RoundTripPairEmitter : EmitterBase {
  const MXRoundTripPair &g;
  int64_t grid;
  Value x, outK, outN;

  /// The emitter for a kernel of `g` whose results are `outs` (both, or
  /// the one `g` computes).
  RoundTripPairEmitter(OpBuilder &b, Location loc, const MXRoundTripPair &g,
                       int64_t grid, Value x, ArrayRef<Value> outs)
      : EmitterBase{b, loc}, g(g), grid(grid), x(x),
        outK(g.withK ? outs.front() : Value()),
        outN(g.withN ? outs.back() : Value()) {}
  Value source{}, scale{};
  int64_t sourceRows = 0, perRow = 1;
  bool scaleFirst = true;

  void syncWarp() {
    NVVM::SyncWarpOp::create(b, loc, int32(-1));
  }

  void emit(gpu::LaunchOp launch) {
    Value tid = launch.getThreadIds().x;
    Value lane = rem(tid, 32);
    Value warpInCta = div(tid, 32);
    Value warp = add(mul(launch.getBlockIds().x, idx(kRTPairWarps)), warpInCta);
    setUpSharedMemory();
    // This warp's 32 x 33 f32 (row i at 33 i: column j of every row in
    // bank (i + j) % 32, so both the column writes and the row reads are
    // conflict-free).
    Value slab = mul(warpInCta, idx(kRTPairSlabBytes));
    auto slot = [&](Value i, Value j) {
      return sharedPtrAt(add(slab, mul(add(mul(i, idx(33)), j), idx(4))));
    };
    Value xs = flat(x);
    Value ks = outK ? flat(outK) : Value(), ns = outN ? flat(outN) : Value();
    Value nBase = ns ? baseAddress(ns) : Value();
    Value nAligned =
        ns ? cmp(P::eq, arith::AndIOp::create(b, loc, nBase, int64(15)),
                 int64(0))
           : Value();
    int64_t rows = g.rows(), cols = g.cols();
    int64_t colTiles = cols / 32, rowTiles = rows / 32;
    Type f32 = b.getF32Type();
    strideLoop(warp, idx(g.tiles()), grid * kRTPairWarps, [&](Value tile) {
      // Tile (matrix m, row tile r, column tile c): element (32 r + i,
      // 32 c + j) of matrix m at ((m * rows) + 32 r + i) * cols + 32 c + j.
      Value m = div(tile, rowTiles * colTiles);
      Value rc = rem(tile, rowTiles * colTiles);
      Value corner =
          add(mul(add(mul(m, idx(rows)), mul(div(rc, colTiles), idx(32))),
                  idx(cols)),
              mul(rem(rc, colTiles), idx(32)));
      // Column `lane` (a K block): loads coalesced across the warp.
      SmallVector<Value> at, column;
      // Gathered: lane i reads row i's source, shuffled to every lane.
      Value rowSource, rowScale;
      if (source) {
        Value r = add(mul(div(rc, colTiles), idx(32)), lane);
        Value s = memref::LoadOp::create(b, loc, source, ValueRange{r});
        Value inside = land(cmp(P::sge, s, idx(0)), cmp(P::slt, s, idx(sourceRows)));
        rowSource = arith::IndexCastOp::create(b, loc, i32(),
                                               select(inside, s, idx(-1)));
        if (scale)
          rowScale = memref::LoadOp::create(b, loc, scale,
                                            ValueRange{select(inside, s, idx(0))});
      }
      for (int64_t i = 0; i < 32; ++i) {
        at.push_back(add(corner, add(idx(i * cols), lane)));
        if (!source) {
          column.push_back(toF32(
              memref::LoadOp::create(b, loc, xs, ValueRange{at.back()})));
        } else {
          Value s = gpu::ShuffleOp::create(b, loc, rowSource, int32(i),
                                           int32(32), gpu::ShuffleMode::IDX)
                        .getShuffleResult();
          Value inside = cmp(P::sge, s, int32(0));
          Value row = toIndex(select(inside, s, int32(0)));
          if (scale)
            row = div(row, perRow);
          Value from = add(mul(row, idx(cols)),
                           add(mul(rem(rc, colTiles), idx(32)), lane));
          Value v =
              toF32(memref::LoadOp::create(b, loc, xs, ValueRange{from}));
          if (scale) {
            Value w = gpu::ShuffleOp::create(b, loc, rowScale, int32(i),
                                             int32(32), gpu::ShuffleMode::IDX)
                          .getShuffleResult();
            v = scaleFirst ? arith::MulFOp::create(b, loc, w, v)
                           : arith::MulFOp::create(b, loc, v, w);
          }
          column.push_back(
              select(inside, v,
                     arith::ConstantFloatOp::create(
                         b, loc, cast<FloatType>(b.getF32Type()),
                         APFloat(0.0f))));
        }
        if (ns)
          LLVM::StoreOp::create(b, loc, column.back(), slot(idx(i), lane), 4);
      }
      if (ks) {
        SmallVector<Value> alongK =
            mxRoundTrip(column, amaxOf(column), g.alongK.mx.getElementType(),
                        g.alongK.mode, g.alongK.outElt);
        for (int64_t i = 0; i < 32; ++i)
          memref::StoreOp::create(b, loc, alongK[i], ks, ValueRange{at[i]});
      }
      if (!ns)
        return;
      // Row `lane` (an N block), through shared memory: 32 consecutive
      // results stored as one run.
      syncWarp();
      SmallVector<Value> row;
      for (int64_t j = 0; j < 32; ++j)
        row.push_back(LLVM::LoadOp::create(b, loc, f32, slot(lane, idx(j)), 4));
      syncWarp(); // the slab is free for the next tile
      SmallVector<Value> alongN =
          mxRoundTrip(row, amaxOf(row), g.alongN.mx.getElementType(),
                      g.alongN.mode, g.alongN.outElt);
      storeRun(ns, nBase, add(corner, mul(lane, idx(cols))), alongN, nAligned);
    });
  }
};

/// A pair's round trips, recorded on its function (the MX types, modes and
/// element types), so that -moe-gpu-fuse-row-gathers can emit the same
/// kernel reading gathered rows.
constexpr llvm::StringLiteral kRoundTripPairAttr = "moe.round_trip_pair";

ArrayAttr roundTripPairAttr(MLIRContext *ctx, const MXRoundTripPair &g) {
  SmallVector<Attribute> parts;
  for (const MXRoundTrip &t : {g.alongK, g.alongN})
    parts.append({TypeAttr::get(t.mx), TypeAttr::get(t.inElt),
                  TypeAttr::get(t.outElt),
                  StringAttr::get(ctx, stringifyScaleMode(t.mode))});
  parts.append({BoolAttr::get(ctx, g.withK), BoolAttr::get(ctx, g.withN)});
  return ArrayAttr::get(ctx, parts);
}

std::optional<MXRoundTripPair> roundTripPairOf(func::FuncOp func) {
  auto parts = func->getAttrOfType<ArrayAttr>(kRoundTripPairAttr);
  if (!parts || parts.size() != 10)
    return std::nullopt;
  auto withK = dyn_cast<BoolAttr>(parts[8]), withN = dyn_cast<BoolAttr>(parts[9]);
  if (!withK || !withN)
    return std::nullopt;
  MXRoundTrip trips[2];
  for (int i = 0; i < 2; ++i) {
    auto mx = dyn_cast<TypeAttr>(parts[4 * i]);
    auto in = dyn_cast<TypeAttr>(parts[4 * i + 1]);
    auto out = dyn_cast<TypeAttr>(parts[4 * i + 2]);
    auto mode = dyn_cast<StringAttr>(parts[4 * i + 3]);
    if (!mx || !in || !out || !mode || !isa<MXTensorType>(mx.getValue()))
      return std::nullopt;
    std::optional<ScaleMode> m = symbolizeScaleMode(mode.getValue());
    if (!m)
      return std::nullopt;
    trips[i] = MXRoundTrip{cast<MXTensorType>(mx.getValue()), in.getValue(),
                           out.getValue(), *m, Type()};
  }
  return MXRoundTripPair{trips[0], trips[1], withK.getValue(),
                         withN.getValue()};
}

/// Whether `rows` is never materialized because the paired round trips of a
/// dispatch read the dispatched rows from the tokens
/// (-moe-gpu-fuse-row-gathers): a dispatch's rows read only by quantizes, or
/// the tokens of such a dispatch (through reshapes) that only it reads (the
/// combine gradient's scaled copies, which the pair kernel computes).
bool readFromTokens(Value rows) {
  // Rows of a dispatch, 2-d, read only by round trips (quantizes read only
  // by dequantizes).
  if (auto d = rows.getDefiningOp<DispatchOp>()) {
    auto type = dyn_cast<RankedTensorType>(rows.getType());
    return rows == d.getSorted() && type && type.getRank() == 2 &&
           !rows.use_empty() &&
           llvm::all_of(rows.getUsers(), [](Operation *u) {
             return isa<QuantizeOp>(u) &&
                    llvm::all_of(u->getUsers(), [](Operation *v) {
                      return isa<DequantizeOp>(v);
                    });
           });
  }
  // The tokens of such a dispatch, through reshapes, computed by a
  // linalg.generic (the scaled copies the pair kernel computes itself).
  if (!rows.hasOneUse())
    return false;
  Operation *user = *rows.getUsers().begin();
  if (auto d = dyn_cast<DispatchOp>(user))
    return d.getTokens() == rows &&
           rows.getDefiningOp<linalg::GenericOp>() &&
           readFromTokens(d.getSorted());
  if (isa<tensor::CollapseShapeOp, tensor::ExpandShapeOp>(user) &&
      (rows.getDefiningOp<linalg::GenericOp>() ||
       isa_and_nonnull<tensor::CollapseShapeOp, tensor::ExpandShapeOp>(
           rows.getDefiningOp())))
    return readFromTokens(user->getResult(0));
  return false;
}

/// Every pair of round trips of one x along its last two dims (see "MX round
/// trips of both blockings") in one block becomes one call, placed before
/// the first of them.
void lowerRoundTripPairs(ModuleOp module, SymbolTable &symbols,
                         bool withinPeak) {
  SmallVector<std::tuple<DequantizeOp, DequantizeOp, MXRoundTripPair>> work;
  for (auto func : module.getOps<func::FuncOp>()) {
    if (func->hasAttr("moe.dedicated_kernel"))
      continue;
    // Round trips by input and blocking axis (the first of each).
    llvm::MapVector<std::pair<Value, unsigned>,
                    std::pair<DequantizeOp, MXRoundTrip>>
        byInput;
    func.walk([&](DequantizeOp dq) {
      std::optional<MXRoundTrip> g = matchRoundTrip(dq);
      if (!g || g->mx.getShape().size() < 2)
        return;
      auto q = dq.getInput().getDefiningOp<QuantizeOp>();
      byInput.try_emplace({q.getInput(), g->mx.getAxis()}, dq, *g);
    });
    for (auto &[key, alongK] : byInput) {
      unsigned rank = alongK.second.mx.getShape().size();
      if (key.second != rank - 2)
        continue;
      auto it = byInput.find({key.first, rank - 1});
      if (it == byInput.end() ||
          it->second.first->getBlock() != alongK.first->getBlock())
        continue;
      work.push_back({alongK.first, it->second.first,
                      MXRoundTripPair{alongK.second, it->second.second}});
    }
  }
  // Paired, the later round trip's result lives from the earlier one on.
  // Pairs that would raise their block's peak of live tensors are split,
  // each round trip at its own place (reading x twice): a weight's
  // data-gradient blocking or the activations' columnwise one is then not
  // held through the backward's widest point. A weight's pair becomes two
  // single round trips; a dispatch's rows, which only the pair kernel reads
  // from the tokens (-moe-gpu-fuse-row-gathers), two pair kernels of one
  // result each.
  llvm::DenseMap<Block *, std::unique_ptr<BlockLiveness>> liveness;
  auto splits = [&](Operation *first, Operation *second) {
    if (!withinPeak)
      return false;
    std::unique_ptr<BlockLiveness> &live = liveness[first->getBlock()];
    if (!live)
      live = std::make_unique<BlockLiveness>(
          *first->getBlock(), [](Value v) { return !readFromTokens(v); });
    unsigned from = live->position(first), to = live->position(second);
    int64_t bytes = tensorBytes(second->getResult(0));
    if (live->peak(from, to) + bytes > live->peak())
      return true;
    live->add(from, to, bytes);
    return false;
  };
  // Decided smallest first: the most pairs (each saves a read of x) within
  // the peak.
  // Each pair's round trips in block order.
  auto inOrder = [&](unsigned i) -> std::pair<Operation *, Operation *> {
    auto &[dqK, dqN, pair] = work[i];
    if (dqK->isBeforeInBlock(dqN))
      return {dqK, dqN};
    return {dqN, dqK};
  };
  SmallVector<unsigned> order = llvm::to_vector(llvm::seq<unsigned>(0, work.size()));
  llvm::stable_sort(order, [&](unsigned a, unsigned b) {
    return tensorBytes(inOrder(a).second->getResult(0)) <
           tensorBytes(inOrder(b).second->getResult(0));
  });
  SmallVector<bool> split(work.size(), false);
  for (unsigned i : order) {
    auto [first, second] = inOrder(i);
    split[i] = splits(first, second);
  }
  SmallVector<std::tuple<SmallVector<DequantizeOp>, MXRoundTripPair>> calls;
  for (auto [i, item] : llvm::enumerate(work)) {
    auto &[dqK, dqN, pair] = item;
    Value x = dqK.getInput().getDefiningOp<QuantizeOp>().getInput();
    if (!split[i]) {
      calls.push_back({{dqK, dqN}, pair});
      continue;
    }
    if (!x.getDefiningOp<DispatchOp>())
      continue; // two single round trips (lowerRoundTrips)
    MXRoundTripPair k = pair, n = pair;
    k.withN = false;
    n.withK = false;
    calls.push_back({{dqK}, k});
    calls.push_back({{dqN}, n});
  }
  for (auto &[dqs, pair] : calls) {
    const MXRoundTripPair &g = pair;
    Location loc = dqs.front().getLoc();
    Value x = dqs.front().getInput().getDefiningOp<QuantizeOp>().getInput();
    int64_t grid = std::min(tilesOf(g.tiles(), kRTPairWarps), kRTMaxBlocks);
    SmallVector<RankedTensorType> types;
    for (DequantizeOp dq : dqs)
      types.push_back(dq.getType());
    func::FuncOp kernel = getOrCreateKernelCall(
        module, symbols, g.name(), "mx round trips along both dims",
        {x.getType()}, types, loc,
        {grid, 1, 1, kRTPairWarps * 32, kRTPairWarps * kRTPairSlabBytes},
        [&](OpBuilder &b, gpu::LaunchOp launch, ArrayRef<Value> buf,
            ArrayRef<Value> outs) {
          RoundTripPairEmitter k(b, loc, g, grid, buf[0], outs);
          k.emit(launch);
        });
    if (g.alongK.mx.getShape().size() == 2)
      kernel->setAttr(kRoundTripPairAttr,
                      roundTripPairAttr(module.getContext(), g));
    Operation *first = dqs.front();
    for (DequantizeOp dq : dqs)
      if (dq->isBeforeInBlock(first))
        first = dq;
    OpBuilder b(first);
    auto call = func::CallOp::create(b, loc, kernel, ValueRange{x});
    for (auto [dq, result] : llvm::zip(dqs, call.getResults())) {
      auto q = dq.getInput().getDefiningOp<QuantizeOp>();
      dq.getResult().replaceAllUsesWith(result);
      dq.erase();
      if (q->use_empty())
        q.erase();
    }
  }
}

/// Every `moe.dequantize (moe.quantize x)` the kernel handles becomes a call
/// of it (see "MX round trip"); quantizes left without uses are erased.
void lowerRoundTrips(ModuleOp module, SymbolTable &symbols) {
  SmallVector<std::tuple<DequantizeOp, MXRoundTrip, RowBound>> work;
  {
    LiveRows live(module);
    for (auto func : module.getOps<func::FuncOp>())
      if (!func->hasAttr("moe.dedicated_kernel"))
        func.walk([&](DequantizeOp dq) {
          if (std::optional<MXRoundTrip> g = matchRoundTrip(dq))
            work.push_back({dq, *g, live.boundedOp(dq)});
        });
  }
  for (auto [dq, g, bound] : work) {
    auto q = dq.getInput().getDefiningOp<QuantizeOp>();
    SmallVector<Value> args = {q.getInput()};
    auto offsetsType = bound.offsets
                           ? dyn_cast<RankedTensorType>(bound.offsets.getType())
                           : RankedTensorType();
    if (offsetsType && offsetsType.hasStaticShape() &&
        offsetsType.getRank() == 1 && offsetsType.getDimSize(0) > 0 &&
        offsetsType.getElementType().isInteger() && g.mx.getAxis() != 0) {
      g.offsetElt = offsetsType.getElementType();
      args.push_back(bound.offsets);
    }
    func::FuncOp kernel = getOrCreateRoundTripFunction(
        module, symbols, g, llvm::to_vector(ValueRange(args).getTypes()),
        dq.getType(),
        dq.getLoc());
    OpBuilder b(dq);
    auto call = func::CallOp::create(b, dq.getLoc(), kernel, args);
    dq.getResult().replaceAllUsesWith(call.getResult(0));
    dq.erase();
    if (q->use_empty())
      q.erase();
    // A round trip to a narrower type, the only reader of its input, runs
    // right after the input is computed: the narrow result is what waits
    // for the reader (the activation's columnwise rounding, read by the
    // backward, is held as bf16 instead of f32 in between).
    Value x = args[0];
    Operation *producer = x.getDefiningOp();
    auto in = cast<RankedTensorType>(x.getType());
    if (args.size() == 1 && x.hasOneUse() && producer &&
        producer->getBlock() == call->getBlock() &&
        producer->isBeforeInBlock(call) &&
        g.outElt.getIntOrFloatBitWidth() <
            in.getElementType().getIntOrFloatBitWidth())
      call->moveAfter(producer);
  }
}

//===----------------------------------------------------------------------===//
// MX dequantize: packed MX data and scales to floats
//===----------------------------------------------------------------------===//
//
// moe.dequantize of an MX tensor that no round trip covers (MX data that was
// dispatched or exchanged, a program's MX inputs, an exact MXFP8 GEMM's
// operands on Hopper): (data, scales) -> floats, one pass, both chips. A
// thread takes 8 consecutive elements (flat order): one 8-byte load of
// data; their scales (one byte when the blocks run along the innermost dim,
// else 8 consecutive bytes, one per column); the hardware's exact f8x2 ->
// f16x2 conversions, times 2^e (buildScaleValue: NaN for the NaN scale),
// rounded once to the result type; one 16- or 32-byte store. The generic
// lowering rounds the same f32 product once: bit-identical. Unaligned
// buffers (a caller's) take byte-wise loads and element-wise stores. Needs
// the innermost dim a multiple of 8.

constexpr int64_t kDQThreads = 256;
constexpr int64_t kDQPer = 8;

struct MXDequantize {
  MXTensorType mx;
  Type outElt;
  int64_t elements() const { return mxElements(mx); }
  /// Elements between consecutive values of one block.
  int64_t inner() const { return mxInner(mx); }
  std::string name() const {
    return llvm::formatv("moe_mx_dequantize_{0}_{1}_to_{2}", mxShapeName(mx),
                         BlockScaledGemm::eltName(mx.getElementType()),
                         BlockScaledGemm::eltName(outElt))
        .str();
  }
};

std::optional<MXDequantize> matchDequantize(DequantizeOp dq) {
  auto mx = dyn_cast<MXTensorType>(dq.getInput().getType());
  RankedTensorType out = dq.getType();
  if (!mx || dq->getParentOfType<ExpertsOp>() ||
      ShapedType::isDynamicShape(mx.getShape()) || !out.hasStaticShape() ||
      !isRoundTripFloat(out.getElementType()) ||
      mx.getBlockSize() != kRTBlock ||
      mx.getShape()[mx.getAxis()] % kRTBlock != 0 ||
      mx.getShape().back() % kDQPer != 0 || out.getNumElements() == 0)
    return std::nullopt;
  return MXDequantize{mx, out.getElementType()};
}

/// Emits the body of the dequantize's gpu.launch.
struct DequantizeEmitter : EmitterBase {
  const MXDequantize &g;
  int64_t grid;
  Value data, scales, out;

  /// `n` consecutive bytes of `buffer` (flat, i8-like) from `at`: one load
  /// when `aligned`, else byte by byte.
  SmallVector<Value> loadBytes(Value buffer, Value base, Value at, int64_t n,
                               Value aligned) {
    SmallVector<Type> types(n, i8());
    return ifElse(
        types, aligned,
        [&] { return loadVector(i8(), n, globalPtr(base, at), n); },
        [&] {
          SmallVector<Value> bytes;
          for (int64_t j = 0; j < n; ++j)
            bytes.push_back(loadBits(buffer, ValueRange{add(at, idx(j))}));
          return bytes;
        });
  }

  void emit(gpu::LaunchOp launch) {
    Value tid = launch.getThreadIds().x;
    Value gtid = add(mul(launch.getBlockIds().x, idx(kDQThreads)), tid);
    Value ds = flat(data), ss = flat(scales), ys = flat(out);
    Value dBase = baseAddress(ds), sBase = baseAddress(ss),
          yBase = baseAddress(ys);
    int64_t inner = g.inner(), along = g.mx.getShape()[g.mx.getAxis()];
    bool oneScale = inner == 1;
    // 8-byte data (and scale) loads, 16-byte stores.
    Value mask = arith::OrIOp::create(
        b, loc, arith::AndIOp::create(b, loc, dBase, int64(7)),
        arith::AndIOp::create(b, loc, yBase, int64(15)));
    if (!oneScale)
      mask = arith::OrIOp::create(
          b, loc, mask, arith::AndIOp::create(b, loc, sBase, int64(7)));
    Value aligned = cmp(P::eq, mask, int64(0));
    Type elt = g.mx.getElementType();
    strideLoop(gtid, idx(g.elements() / kDQPer), grid * kDQThreads,
               [&](Value group) {
      Value first = mul(group, idx(kDQPer));
      SmallVector<Value> bytes = loadBytes(ds, dBase, first, kDQPer, aligned);
      // Flat element f = (o * along + a) * inner + i has scale
      // (o * along / 32 + a / 32) * inner + i.
      SmallVector<Value> scaleBytes;
      if (oneScale) {
        scaleBytes.assign(kDQPer, loadBits(ss, ValueRange{div(first, kRTBlock)}));
      } else {
        Value i = rem(first, inner), rowIdx = div(first, inner);
        Value o = div(rowIdx, along), a = rem(rowIdx, along);
        Value at = add(mul(add(mul(o, idx(along / kRTBlock)), div(a, kRTBlock)),
                           idx(inner)),
                       i);
        scaleBytes = loadBytes(ss, sBase, at, kDQPer, aligned);
      }
      SmallVector<Value> values;
      for (int64_t p = 0; p < kDQPer / 2; ++p) {
        Value pair = vectorOf(ArrayRef(bytes).slice(2 * p, 2));
        llvm::append_range(
            values,
            decodeF8Pair(pair, elt,
                         {buildScaleValue(b, loc, scaleBytes[2 * p]),
                          buildScaleValue(b, loc, scaleBytes[2 * p + 1])},
                         g.outElt));
      }
      storeRun(ys, yBase, first, values, aligned);
    });
  }
};

/// Every moe.dequantize the kernel handles (after the round trips) becomes
/// a call of it on the MX value's data and scales.
void lowerDequantizes(ModuleOp module, SymbolTable &symbols) {
  SmallVector<std::pair<DequantizeOp, MXDequantize>> work;
  for (auto func : module.getOps<func::FuncOp>())
    if (!func->hasAttr("moe.dedicated_kernel"))
      func.walk([&](DequantizeOp dq) {
        if (std::optional<MXDequantize> g = matchDequantize(dq))
          work.push_back({dq, *g});
      });
  for (auto &item : work) {
    DequantizeOp dq = item.first;
    const MXDequantize &g = item.second;
    MXTensorType mx = g.mx;
    int64_t grid = std::min(tilesOf(g.elements() / kDQPer, kDQThreads),
                            kRTMaxBlocks);
    func::FuncOp kernel = getOrCreateKernelCall(
        module, symbols, g.name(), "mx dequantize",
        {mx.getDataType(), mx.getScalesType()}, dq.getType(), dq.getLoc(),
        {grid, 1, 1, kDQThreads, 0},
        [&](OpBuilder &b, gpu::LaunchOp launch, ArrayRef<Value> buf,
            Value out) {
          DequantizeEmitter k{{b, dq.getLoc()}, g, grid, buf[0], buf[1], out};
          k.emit(launch);
        });
    OpBuilder b(dq);
    auto parts = MXUnpackOp::create(b, dq.getLoc(), mx.getDataType(),
                                    mx.getScalesType(), dq.getInput());
    auto call = func::CallOp::create(
        b, dq.getLoc(), kernel, ValueRange{parts.getData(), parts.getScales()});
    dq.getResult().replaceAllUsesWith(call.getResult(0));
    dq.erase();
  }
}

struct MoEGPUDedicatedKernelsPass
    : moe::impl::MoEGPUDedicatedKernelsBase<MoEGPUDedicatedKernelsPass> {
  using MoEGPUDedicatedKernelsBase::MoEGPUDedicatedKernelsBase;

  void getDependentDialects(DialectRegistry &registry) const override {
    MoEGPUDedicatedKernelsBase::getDependentDialects(registry);
    registry.addExtension(declareNVVMMemoryEffects);
  }

  void runOnOperation() override {
    for (auto [name, value] : {std::pair<StringRef, StringRef>{
                                   "pair-round-trips", pairRoundTrips},
                               {"mx-activations", mxActivations}})
      if (value != "peak" && value != "always") {
        getOperation().emitError()
            << "-moe-gpu-dedicated-kernels: " << name
            << " must be 'peak' or 'always', got '" << value << "'";
        return signalPassFailure();
      }
    if (!hasDedicatedGPUKernels(chip))
      return;
    ModuleOp module = getOperation();
    SymbolTable symbols(module);
    SmallVector<GroupedMatmulOp> candidates;
    for (auto func : module.getOps<func::FuncOp>())
      func.walk([&](GroupedMatmulOp op) { candidates.push_back(op); });

    // GEMMs whose rows past the last group nothing reads (asked before
    // anything is rewritten).
    llvm::DenseSet<Operation *> liveRowsOnly;
    {
      LiveRows live(module);
      for (GroupedMatmulOp op : candidates)
        if (live.pastLastGroupUnread(op.getResult(), op.getOffsets()))
          liveRowsOnly.insert(op);
    }
    // The same GEMM twice (a train step's forward and the recomputation its
    // backward makes) becomes one call for CSE to merge: all rows if either
    // needs them.
    for (GroupedMatmulOp op : candidates)
      if (!liveRowsOnly.contains(op))
        for (GroupedMatmulOp other : candidates)
          if (other != op &&
              OperationEquivalence::isEquivalentTo(
                  other, op, OperationEquivalence::IgnoreLocations))
            liveRowsOnly.erase(other);
    if (chip == "sm_90a") {
      // Weight gradients (bf16, or MXFP8 blocked along the rows).
      SmallVector<GroupedMatmulWgradOp> wgrads;
      for (auto func : module.getOps<func::FuncOp>())
        func.walk([&](GroupedMatmulWgradOp op) { wgrads.push_back(op); });
      for (GroupedMatmulWgradOp op : wgrads)
        (void)lowerWgradToWgmma(op, module, symbols);
      // Dense f32 matmuls (router, projections) on CUDA cores.
      SmallVector<linalg::MatmulOp> matmuls;
      for (auto func : module.getOps<func::FuncOp>())
        if (!func->hasAttr("moe.dedicated_kernel"))
          func.walk([&](linalg::MatmulOp op) { matmuls.push_back(op); });
      for (linalg::MatmulOp op : matmuls) {
        std::optional<SimtMatmul> mm = matchSimtMatmul(op);
        if (!mm)
          continue;
        Value lhs = op.getInputs()[0], rhs = op.getInputs()[1],
              init = op.getOutputs()[0];
        auto resultType = cast<RankedTensorType>(op->getResult(0).getType());
        func::FuncOp kernel = getOrCreateSimtMatmulFunction(
            module, symbols, *mm,
            {lhs.getType(), rhs.getType(), init.getType()}, resultType,
            op.getLoc());
        OpBuilder b(op);
        auto call = func::CallOp::create(b, op.getLoc(), kernel,
                                         ValueRange{lhs, rhs, init});
        op->getResult(0).replaceAllUsesWith(call.getResult(0));
        op->erase();
      }
      // MXFP8 without fp8-mma (exact through bf16), transposed rhs
      // (materialized): see rewriteForWgmma. All GEMMs first, so that a
      // GEMM's SwiGLU epilogue sees the round trip of the next GEMM's operand.
      SmallVector<bool> live;
      for (GroupedMatmulOp &op : candidates) {
        live.push_back(liveRowsOnly.contains(op));
        bool mxOperands = isa<MXTensorType>(op.getLhs().getType()) ||
                          isa<MXTensorType>(op.getRhs().getType());
        if (!fp8Mma || !mxOperands)
          if (std::optional<GroupedMatmulOp> rewritten = rewriteForWgmma(op))
            op = *rewritten;
      }
      for (auto [op, live] : llvm::zip(candidates, live)) {
        // FP8 wgmma sums each 32-term slice at reduced precision: only on
        // request (fp8-mma); otherwise MXFP8 keeps the exact generic path.
        std::optional<WgmmaMxGemm> mx =
            fp8Mma ? matchWgmmaMxGemm(op) : std::nullopt;
        if (mx) {
          auto lhs = cast<MXTensorType>(op.getLhs().getType());
          auto rhs = cast<MXTensorType>(op.getRhs().getType());
          SmallVector<Type> argTypes = {lhs.getDataType(), lhs.getScalesType(),
                                        rhs.getDataType(), rhs.getScalesType(),
                                        op.getOffsets().getType()};
          func::FuncOp kernel = getOrCreateWgmmaMxFunction(
              module, symbols, *mx, argTypes, op.getType(), op.getLoc());
          OpBuilder b(op);
          Location loc = op.getLoc();
          auto lhsParts = MXUnpackOp::create(b, loc, lhs.getDataType(),
                                             lhs.getScalesType(), op.getLhs());
          auto rhsParts = MXUnpackOp::create(b, loc, rhs.getDataType(),
                                             rhs.getScalesType(), op.getRhs());
          auto call = func::CallOp::create(
              b, loc, kernel,
              ValueRange{lhsParts.getData(), lhsParts.getScales(),
                         rhsParts.getData(), rhsParts.getScales(),
                         op.getOffsets()});
          op.getResult().replaceAllUsesWith(call.getResult(0));
          op.erase();
          continue;
        }
        std::optional<WgmmaGemm> gemm = matchWgmmaGemm(op);
        if (!gemm)
          continue;
        gemm->liveRowsOnly = live;
        if (std::optional<SwigluFusion> fusion =
                matchSwigluFusion(op, *gemm, mxActivations == "always")) {
          lowerSwigluFusion(op, *gemm, *fusion, module, symbols);
          continue;
        }
        if (auto f8 = f8LhsOf(op, *gemm)) {
          lowerF8LhsGemm(op, *gemm, f8->first, f8->second, module, symbols);
          continue;
        }
        SmallVector<Type> argTypes = {op.getLhs().getType(),
                                      op.getRhs().getType(),
                                      op.getOffsets().getType()};
        func::FuncOp kernel = getOrCreateWgmmaFunction(
            module, symbols, *gemm, argTypes, op.getType(), op.getLoc());
        OpBuilder b(op);
        auto call = func::CallOp::create(
            b, op.getLoc(), kernel,
            ValueRange{op.getLhs(), op.getRhs(), op.getOffsets()});
        op.getResult().replaceAllUsesWith(call.getResult(0));
        op.erase();
      }
      lowerRoundTripPairs(module, symbols, pairRoundTrips == "peak");
      lowerRoundTrips(module, symbols);
      lowerDequantizes(module, symbols);
      return;
    }
    for (GroupedMatmulOp op : candidates) {
      std::optional<BlockScaledGemm> gemm = matchBlockScaledGemm(op);
      if (!gemm)
        continue;
      auto lhs = cast<MXTensorType>(op.getLhs().getType());
      auto rhs = cast<MXTensorType>(op.getRhs().getType());
      SmallVector<Type> argTypes = {lhs.getDataType(), lhs.getScalesType(),
                                    rhs.getDataType(), rhs.getScalesType(),
                                    op.getOffsets().getType()};
      func::FuncOp kernel = getOrCreateKernelFunction(
          module, symbols, *gemm, argTypes, op.getType(), op.getLoc());

      OpBuilder b(op);
      Location loc = op.getLoc();
      auto lhsParts = MXUnpackOp::create(b, loc, lhs.getDataType(),
                                         lhs.getScalesType(), op.getLhs());
      auto rhsParts = MXUnpackOp::create(b, loc, rhs.getDataType(),
                                         rhs.getScalesType(), op.getRhs());
      auto call = func::CallOp::create(
          b, loc, kernel,
          ValueRange{lhsParts.getData(), lhsParts.getScales(),
                     rhsParts.getData(), rhsParts.getScales(),
                     op.getOffsets()});
      op.getResult().replaceAllUsesWith(call.getResult(0));
      op.erase();
    }
    lowerRoundTripPairs(module, symbols, pairRoundTrips == "peak");
    lowerRoundTrips(module, symbols);
    lowerDequantizes(module, symbols);
  }
};

/// The tokens a dispatch's row gather (see kGatheredRowsAttr) extracts
/// from, or null.
Value gatheredTokens(linalg::GenericOp gather) {
  Value tokens;
  gather.getBody()->walk([&](tensor::ExtractOp extract) {
    Value t = extract.getTensor();
    if (!gather->isAncestor(t.getParentRegion()->getParentOp()))
      tokens = t;
  });
  return tokens;
}

/// Rows [T * K, H] computed as scale[t, k] * rows[t, :] (a [T, K, H]
/// product, collapsed).
struct ScaledCopies {
  Value rows, scale;
  int64_t perRow;
  bool scaleFirst;
};

/// `producer` (the generic under `tokens`' reshapes) as scaled copies:
/// generic(scale [T, K] at (t, k), rows [T, H] at (t, h)) -> [T, K, H] whose
/// body is one f32 mulf of the two, collapsed [[0, 1], [2]] into tokens.
std::optional<ScaledCopies> matchScaledCopies(Value producer, Value tokens) {
  auto generic = producer.getDefiningOp<linalg::GenericOp>();
  auto collapse = tokens.getDefiningOp<tensor::CollapseShapeOp>();
  if (!generic || !collapse || collapse.getSrc() != producer ||
      generic.getNumDpsInputs() != 2 || generic.getNumResults() != 1 ||
      collapse.getReassociationIndices() !=
          SmallVector<ReassociationIndices>{{0, 1}, {2}})
    return std::nullopt;
  MLIRContext *ctx = generic.getContext();
  AffineExpr t, k, h;
  bindDims(ctx, t, k, h);
  SmallVector<AffineMap> maps = generic.getIndexingMapsArray();
  if (maps[0] != AffineMap::get(3, 0, {t, k}, ctx) ||
      maps[1] != AffineMap::get(3, 0, {t, h}, ctx) ||
      !maps[2].isIdentity() || generic.getNumParallelLoops() != 3)
    return std::nullopt;
  Block *body = generic.getBody();
  if (body->getOperations().size() != 2)
    return std::nullopt;
  auto mul = dyn_cast<arith::MulFOp>(body->front());
  auto yield = dyn_cast<linalg::YieldOp>(body->back());
  if (!mul || !yield || yield.getValues() != ValueRange{mul.getResult()} ||
      !mul.getType().isF32() ||
      mul.getFastmath() != arith::FastMathFlags::none)
    return std::nullopt;
  Value a = body->getArgument(0), r = body->getArgument(1);
  bool scaleFirst = mul.getLhs() == a && mul.getRhs() == r;
  if (!scaleFirst && !(mul.getLhs() == r && mul.getRhs() == a))
    return std::nullopt;
  Value scale = generic.getDpsInputOperand(0)->get();
  Value rows = generic.getDpsInputOperand(1)->get();
  auto scaleType = cast<RankedTensorType>(scale.getType());
  auto rowsType = cast<RankedTensorType>(rows.getType());
  if (!scaleType.hasStaticShape() || !rowsType.hasStaticShape() ||
      !scaleType.getElementType().isF32() ||
      !rowsType.getElementType().isF32())
    return std::nullopt;
  return ScaledCopies{rows, scale, scaleType.getDimSize(1), scaleFirst};
}

/// A pair round trip of gathered rows -> the pair kernel reading the rows
/// through the gather's source indices (see -moe-gpu-fuse-row-gathers).
void fuseRowGather(func::CallOp call, ModuleOp module, SymbolTable &symbols) {
  auto callee = symbols.lookup<func::FuncOp>(call.getCallee());
  std::optional<MXRoundTripPair> g =
      callee ? roundTripPairOf(callee) : std::nullopt;
  if (!g || call.getNumOperands() != 1 ||
      call.getNumResults() != unsigned(g->withK) + unsigned(g->withN))
    return;
  // The gathered rows, read only by such calls (one, or the two halves of
  // a split pair).
  auto gather = call.getOperand(0).getDefiningOp<linalg::GenericOp>();
  auto pairCall = [&](Operation *user) {
    auto c = dyn_cast<func::CallOp>(user);
    auto f = c ? symbols.lookup<func::FuncOp>(c.getCallee()) : func::FuncOp();
    return f && c.getNumOperands() == 1 && roundTripPairOf(f);
  };
  if (!gather || !gather->hasAttr(kGatheredRowsAttr) ||
      !llvm::all_of(gather->getUsers(), pairCall) ||
      gather.getNumDpsInputs() != 1)
    return;
  Value source = gather.getDpsInputOperand(0)->get();
  Value tokens = gatheredTokens(gather);
  // Tokens an elementwise kernel computes for this gather alone are left to
  // the gather, which computes the elements it reads (FuseIntoExtract in
  // -moe-gpu-fuse-elementwise): read by the pair kernel, they would be
  // written in full first. The one such producer the kernel computes
  // itself: scaled copies of rows (a combine's gradient, w[t, k] * g[t]).
  Value producer = tokens;
  while (producer && isa_and_nonnull<tensor::CollapseShapeOp,
                                     tensor::ExpandShapeOp>(
                         producer.getDefiningOp()))
    producer = producer.getDefiningOp()->getOperand(0);
  std::optional<ScaledCopies> scaled;
  if (producer && producer.getDefiningOp<linalg::GenericOp>() &&
      producer.hasOneUse()) {
    scaled = matchScaledCopies(producer, tokens);
    if (!scaled)
      return;
  }
  auto sourceType = dyn_cast<RankedTensorType>(source.getType());
  auto tokensType =
      tokens ? dyn_cast<RankedTensorType>(tokens.getType()) : nullptr;
  if (!sourceType || !tokensType || !sourceType.hasStaticShape() ||
      !tokensType.hasStaticShape() || sourceType.getRank() != 1 ||
      !sourceType.getElementType().isIndex() || tokensType.getRank() != 2 ||
      sourceType.getDimSize(0) != g->rows() ||
      tokensType.getDimSize(1) != g->cols() ||
      tokensType.getElementType() != g->alongK.inElt ||
      tokensType.getDimSize(0) >= (int64_t(1) << 31))
    return;
  int64_t sourceRows = tokensType.getDimSize(0);
  int64_t grid = std::min(tilesOf(g->tiles(), kRTPairWarps), kRTMaxBlocks);
  Location loc = call.getLoc();
  SmallVector<Value> args = {tokens, source};
  std::string name = llvm::formatv("{0}_gather_{1}", g->name(), sourceRows);
  if (scaled) {
    args = {scaled->rows, source, scaled->scale};
    // The product's operand order is part of the kernel (rounding of a
    // product does not depend on it, but the IR it was matched from does).
    name += llvm::formatv("_scaled_{0}_{1}", scaled->perRow,
                          scaled->scaleFirst ? "sx" : "xs")
                .str();
  }
  func::FuncOp kernel = getOrCreateKernelCall(
      module, symbols, name, "mx round trips along both dims of gathered rows",
      llvm::to_vector(ValueRange(args).getTypes()),
      llvm::map_to_vector(call.getResultTypes(),
                          [](Type t) { return cast<RankedTensorType>(t); }),
      loc, {grid, 1, 1, kRTPairWarps * 32, kRTPairWarps * kRTPairSlabBytes},
      [&](OpBuilder &b, gpu::LaunchOp launch, ArrayRef<Value> buf,
          ArrayRef<Value> outs) {
        RoundTripPairEmitter k(b, loc, *g, grid, buf[0], outs);
        k.source = buf[1];
        k.sourceRows = sourceRows;
        if (scaled) {
          k.scale = k.flat(buf[2]);
          k.perRow = scaled->perRow;
          k.scaleFirst = scaled->scaleFirst;
        }
        k.emit(launch);
      });
  OpBuilder b(call);
  auto fused = func::CallOp::create(b, loc, kernel, args);
  call.replaceAllUsesWith(fused.getResults());
  call.erase();
  // The product and its reshapes, now unread, go with the next
  // canonicalization (a tensor.dim of the tokens may still read them).
  if (gather->use_empty())
    gather.erase();
  if (SymbolTable::symbolKnownUseEmpty(callee, module))
    symbols.erase(callee);
}

struct MoEGPUFuseRowGathersPass
    : moe::impl::MoEGPUFuseRowGathersBase<MoEGPUFuseRowGathersPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    SymbolTable symbols(module);
    SmallVector<func::CallOp> calls;
    module.walk([&](func::CallOp call) { calls.push_back(call); });
    for (func::CallOp call : calls)
      fuseRowGather(call, module, symbols);
  }
};

} // namespace
