//===- DedicatedKernels.cpp - chip-specific GPU kernels for moe ops -------===//
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
// `moe.host_only` function) builds them in front of it. Ops without a kernel
// are left exactly as they are: they take the generic
// data-parallel path of -convert-moe-to-linalg=parallel=true; with
// `report`, each says why in a remark (KernelReport, Kernels/Kernels.h).
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
//   any K and N (R arbitrary), on warpgroup MMA (wgmma.mma_async bf16 ->
//   f32). N a multiple of 256 or above 256, or tiles that are not whole
//   (K % 64, N % 128: partial tiles read zeros past K and store nothing
//   past N; K or N not a multiple of 8 padded with zeros first): a
//   warp-specialized kernel, TMA loads into an mbarrier ring, two consumer
//   warpgroups of m64n256k16, a persistent grid over every expert's tiles;
//   see Kernels/TmaGemmMainloop.cpp. Otherwise a 3-buffer
//   cp.async ring of 128-byte swizzled tiles; see Kernels/WgmmaGemm.cpp
//   for its tiles, layouts and accumulator fragment. moe.grouped_matmul_wgrad
//   (weight gradients) likewise, on the same two kernels (the TMA one storing
//   bf16 when every user rounds the gradient to bf16). MX operands blocked
//   along K are dequantized to bf16 first (exact). f32 linalg.matmul on a
//   CUDA-core tiled kernel (split K for few tiles over a long K).
// Hopper (sm_90a): moe.grouped_matmul with MXFP8 operands (as for
//   Blackwell, K a multiple of 64, N of 128): FP8 wgmma m64n128k32 per
//   32-wide K slice into a fresh accumulator, promoted into the f32 result
//   with both operands' scales (exact up to f32 rounding); see
//   Kernels/WgmmaFp8Gemm.cpp.
// Hopper (sm_90a): moe.attention and moe.attention_grad with bf16 inputs
//   (q [B, S, N, D], k and v [B, S, M, D], D of 64 or 128, the result's
//   gradient bf16), f32 results, static shapes: flash attention on wgmma,
//   never an [S, S] matrix in memory; the forward saves its logsumexp for
//   the backward's dQ and dK/dV kernels; see Kernels/FlashAttention.cpp.
// Both chips: moe.cross_entropy and moe.cross_entropy_grad (static logits
//   [N, V], f32/bf16/f16): a CTA a row, coalesced, the gradient in bf16
//   where every user rounds it so; see Kernels/CrossEntropy.cpp.
// Both chips: moe.dequantize of a moe.quantize (the MX rounding of a
//   tensor, as floats) in one pass over the input; see Kernels/MXRoundTrip.cpp.
//   Other moe.dequantize ops in one pass over data and scales; see
//   Kernels/MXDequantize.cpp.
//
// Which kernel families run on which chip is the table below; the families
// live in Kernels/ (one file each, entry points in Kernels/Kernels.h), the
// memory-driven choices in MemoryPolicy.h.
//
//===----------------------------------------------------------------------===//

#include "moe/Conversion/MoEToGPU/DedicatedKernels.h"
#include "Kernels/KernelBuilder.h"
#include "Kernels/Kernels.h"
#include "MemoryPolicy.h"
#include "moe/Conversion/Passes.h"
#include "moe/Dialect/MoE/Utils/LiveRows.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEGPUDEDICATEDKERNELS
#include "moe/Conversion/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::kernels;

namespace {

/// The kernel families -moe-gpu-dedicated-kernels applies, each a set of ops
/// it lowers (Kernels/Kernels.h).
enum class Family {
  /// moe.attention and moe.attention_grad with bf16 inputs as flash kernels
  /// (Kernels/FlashAttention.cpp).
  FlashAttention,
  /// moe.cross_entropy and its gradient, a CTA a row
  /// (Kernels/CrossEntropy.cpp).
  CrossEntropy,
  /// moe.grouped_matmul_wgrad on wgmma (Kernels/WgmmaWgrad.cpp).
  WgmmaWeightGradients,
  /// f32 linalg.matmul on CUDA cores (Kernels/SimtMatmul.cpp).
  SimtMatmuls,
  /// moe.grouped_matmul on wgmma: bf16 (cp.async or TMA kernel, with the
  /// SwiGLU epilogues and 8-bit lhs reads), blockwise FP8 on FP8 wgmma
  /// (TMA kernel) or MXFP8 with fp8-mma (Kernels/WgmmaGemm.cpp,
  /// TmaGemm*.cpp, WgmmaFp8Gemm.cpp, ByteTranspose.cpp).
  WgmmaGroupedGemms,
  /// MXFP8 moe.grouped_matmul on tcgen05 (Kernels/Tcgen05BlockScaledGemm.cpp).
  Tcgen05BlockScaledGemms,
  /// moe.grouped_matmul with N under 16: matrix-vector products on CUDA
  /// cores (Kernels/MatrixVector.cpp).
  MatrixVectors,
  /// Both blockings of a matrix in one pass (Kernels/MXRoundTripPair.cpp).
  MXRoundTripPairs,
  /// moe.dequantize(moe.quantize x) (Kernels/MXRoundTrip.cpp).
  MXRoundTrips,
  /// Blockwise FP8 round trips and quantizes
  /// (Kernels/FP8BlockRoundTrip.cpp).
  FP8BlockConversions,
  /// Other moe.dequantize ops (Kernels/MXDequantize.cpp).
  MXDequantizes,
};

/// Which family runs on which chip, in the order the pass applies them:
/// every GEMM first (a GEMM's SwiGLU epilogue then sees the round trip of
/// the next GEMM's operand), the round trips after.
struct ChipFamily {
  GPUChip chip;
  Family family;
};
constexpr ChipFamily kKernelTable[] = {
    {GPUChip::sm_90a, Family::FlashAttention},
    {GPUChip::sm_90a, Family::CrossEntropy},
    {GPUChip::sm_100a, Family::CrossEntropy},
    {GPUChip::sm_90a, Family::WgmmaWeightGradients},
    {GPUChip::sm_90a, Family::SimtMatmuls},
    {GPUChip::sm_90a, Family::WgmmaGroupedGemms},
    {GPUChip::sm_100a, Family::Tcgen05BlockScaledGemms},
    {GPUChip::sm_90a, Family::MatrixVectors},
    {GPUChip::sm_100a, Family::MatrixVectors},
    {GPUChip::sm_90a, Family::MXRoundTripPairs},
    {GPUChip::sm_100a, Family::MXRoundTripPairs},
    {GPUChip::sm_90a, Family::MXRoundTrips},
    {GPUChip::sm_100a, Family::MXRoundTrips},
    {GPUChip::sm_90a, Family::FP8BlockConversions},
    {GPUChip::sm_100a, Family::FP8BlockConversions},
    {GPUChip::sm_90a, Family::MXDequantizes},
    {GPUChip::sm_100a, Family::MXDequantizes},
};

} // namespace

bool mlir::moe::hasDedicatedGPUKernels(GPUChip chip) {
  // The tcgen05 ops need an arch-specific data-center Blackwell target, and
  // MLIR 22's NVVM accepts all of those the kernel uses for sm_100a only
  // (tcgen05.alloc: sm_100a/sm_101a; tcgen05.mma.block_scale: sm_100a/
  // sm_110a). Consumer Blackwell (sm_120) has no tensor memory.
  // Hopper: warpgroup MMA (wgmma) needs the arch-specific sm_90a target.
  return llvm::any_of(kKernelTable,
                      [&](const ChipFamily &e) { return e.chip == chip; });
}

namespace {

struct MoEGPUDedicatedKernelsPass
    : moe::impl::MoEGPUDedicatedKernelsBase<MoEGPUDedicatedKernelsPass> {
  using MoEGPUDedicatedKernelsBase::MoEGPUDedicatedKernelsBase;

  void getDependentDialects(DialectRegistry &registry) const override {
    MoEGPUDedicatedKernelsBase::getDependentDialects(registry);
    registerNVVMMemoryEffects(registry);
  }

  /// The report's remarks (`report`), null when not asked for.
  std::optional<KernelReport> kernelReport;
  KernelReport *reporter() { return kernelReport ? &*kernelReport : nullptr; }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (report)
      kernelReport.emplace(stringifyGPUChip(chip));
    if (!hasDedicatedGPUKernels(chip)) {
      if (report)
        emitRemark(module.getLoc())
            << "no dedicated kernels for " << stringifyGPUChip(chip)
            << ": every op takes the generic kernels";
      return;
    }
    SymbolTable symbols(module);
    SmallVector<GroupedMatmulOp> candidates;
    for (auto func : module.getOps<func::FuncOp>())
      func.walk([&](GroupedMatmulOp op) {
        // Matrix-vector products are the matrix-vector kernel's, not the
        // tile GEMMs' (every chip with dedicated kernels has it; it says why
        // where it cannot take one).
        if (!isMatrixVectorGemm(op))
          candidates.push_back(op);
      });

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

    for (const ChipFamily &entry : kKernelTable) {
      if (entry.chip != chip)
        continue;
      switch (entry.family) {
      case Family::FlashAttention:
        lowerAttention(module, symbols);
        break;
      case Family::CrossEntropy:
        lowerCrossEntropy(module, symbols, reporter());
        break;
      case Family::WgmmaWeightGradients:
        lowerWeightGradients(module, symbols);
        break;
      case Family::SimtMatmuls:
        lowerSimtMatmuls(module, symbols);
        break;
      case Family::WgmmaGroupedGemms:
        lowerWgmmaGroupedGemms(candidates, liveRowsOnly, module, symbols);
        break;
      case Family::Tcgen05BlockScaledGemms:
        for (GroupedMatmulOp op : candidates) {
          std::string why;
          if (std::optional<BlockScaledGemm> gemm =
                  matchBlockScaledGemm(op, report ? &why : nullptr))
            lowerBlockScaledGemm(op, *gemm, module, symbols);
          else if (report)
            reporter()->generic(op, why);
        }
        break;
      case Family::MatrixVectors:
        lowerMatrixVectors(module, symbols, reporter());
        break;
      case Family::MXRoundTripPairs:
        lowerRoundTripPairs(module, symbols,
                            pairRoundTrips == RoundTripPairing::peak);
        break;
      case Family::MXRoundTrips:
        lowerRoundTrips(module, symbols);
        break;
      case Family::FP8BlockConversions:
        lowerFP8BlockConversions(module, symbols);
        break;
      case Family::MXDequantizes:
        lowerDequantizes(module, symbols, reporter());
        break;
      }
    }
    if (report)
      summarize(module);
  }

  /// The report's last remark: the kernel calls made, and the counts of its
  /// other remarks.
  void summarize(ModuleOp module) {
    int64_t calls = 0;
    llvm::SmallDenseSet<StringRef> kernels;
    for (auto func : module.getOps<func::FuncOp>())
      if (!func->hasAttr("moe.dedicated_kernel"))
        func.walk([&](func::CallOp call) {
          auto callee = module.lookupSymbol<func::FuncOp>(call.getCallee());
          if (callee && callee->hasAttr("moe.dedicated_kernel")) {
            ++calls;
            kernels.insert(callee.getSymName());
          }
        });
    emitRemark(
        module.getLoc(),
        llvm::formatv(
            "kernels for {0}: {1} calls of {2} dedicated kernels; {3} ops on "
            "the generic kernels, {4} on a slower kernel than their family's "
            "best",
            stringifyGPUChip(chip), calls, kernels.size(),
            kernelReport->genericOps, kernelReport->slowerOps));
  }

  /// Attention on the flash kernels. A gradient whose forward (the same
  /// inputs and attributes) is in its block reuses that call's result and
  /// logsumexp; otherwise the forward kernel runs for it first.
  void lowerAttention(ModuleOp module, SymbolTable &symbols) {
    SmallVector<AttentionOp> forwards;
    SmallVector<AttentionGradOp> grads;
    for (auto func : module.getOps<func::FuncOp>())
      if (!func->hasAttr("moe.dedicated_kernel"))
        func.walk([&](Operation *op) {
          if (auto a = dyn_cast<AttentionOp>(op))
            forwards.push_back(a);
          else if (auto g = dyn_cast<AttentionGradOp>(op))
            grads.push_back(g);
        });
    struct Lowered {
      Value q, k, v, documents, ranges;
      FlashAttention f;
      Value out, lse;
    };
    SmallVector<Lowered> lowered;
    std::string why;
    WhyNot whyNot = report ? &why : nullptr;
    for (AttentionOp op : forwards) {
      std::optional<FlashAttention> f = matchFlashAttention(op, whyNot);
      if (!f) {
        if (report)
          reporter()->generic(op, why);
        continue;
      }
      OpBuilder b(op);
      Value documents = op.getDocuments();
      Value ranges = documents
                         ? createDocumentRanges(b, op.getLoc(), *f, documents,
                                                module, symbols)
                         : Value();
      auto [out, lse] =
          createFlashForward(b, op.getLoc(), *f, op.getQuery(), op.getKey(),
                             op.getValue(), documents, ranges, module, symbols);
      lowered.push_back({op.getQuery(), op.getKey(), op.getValue(), documents,
                         ranges, *f, out, lse});
      op.getResult().replaceAllUsesWith(out);
      op.erase();
    }
    for (AttentionGradOp op : grads) {
      std::optional<FlashAttention> f = matchFlashAttention(op, whyNot);
      if (!f) {
        if (report)
          reporter()->generic(op, why);
        continue;
      }
      OpBuilder b(op);
      Location loc = op.getLoc();
      Value q = op.getQuery(), k = op.getKey(), v = op.getValue();
      Value documents = op.getDocuments();
      const Lowered *forward = nullptr;
      for (const Lowered &l : lowered) {
        Operation *call = l.out.getDefiningOp();
        if (l.q == q && l.k == k && l.v == v && l.documents == documents &&
            l.f.causal == f->causal && l.f.scale == f->scale &&
            call->getBlock() == op->getBlock() && call->isBeforeInBlock(op))
          forward = &l;
      }
      Value out, lse, ranges;
      if (forward) {
        out = forward->out;
        lse = forward->lse;
        ranges = forward->ranges;
      } else {
        if (documents)
          ranges = createDocumentRanges(b, loc, *f, documents, module, symbols);
        std::tie(out, lse) = createFlashForward(b, loc, *f, q, k, v, documents,
                                                ranges, module, symbols);
      }
      f->overlapDkv = flashDkvOverlap;
      std::array<Value, 3> grads =
          createFlashBackward(b, loc, *f, q, k, v, op.getGrad(), out, lse,
                              documents, ranges, module, symbols);
      op->replaceAllUsesWith(ValueRange(grads));
      op.erase();
    }
  }

  /// Weight gradients (bf16, or MXFP8 blocked along the rows).
  void lowerWeightGradients(ModuleOp module, SymbolTable &symbols) {
    SmallVector<GroupedMatmulWgradOp> wgrads;
    for (auto func : module.getOps<func::FuncOp>())
      func.walk([&](GroupedMatmulWgradOp op) { wgrads.push_back(op); });
    for (GroupedMatmulWgradOp op : wgrads)
      (void)lowerWgradToWgmma(op, module, symbols,
                              /*fp8Wgmma=*/!fp8blockExact, reporter());
  }

  /// Dense f32 matmuls (router, projections) on CUDA cores.
  void lowerSimtMatmuls(ModuleOp module, SymbolTable &symbols) {
    SmallVector<linalg::MatmulOp> matmuls;
    for (auto func : module.getOps<func::FuncOp>())
      if (!func->hasAttr("moe.dedicated_kernel"))
        func.walk([&](linalg::MatmulOp op) { matmuls.push_back(op); });
    for (linalg::MatmulOp op : matmuls)
      (void)lowerToSimtMatmul(op, module, symbols, reporter());
  }

  /// Whether `op` runs on the FP8 wgmma kernels (see lowerWgmmaGroupedGemms);
  /// if not, for a blockwise FP8 GEMM that is not fp8block-exact, why
  /// (`whyNotBlockwise`: the kernel refused it, it is slower elsewhere).
  bool onFp8Wgmma(GroupedMatmulOp op, WhyNot whyNotBlockwise = nullptr) {
    if (isa<FP8BlockTensorType>(op.getLhs().getType()))
      return !fp8blockExact && fitsFp8Wgmma(op, whyNotBlockwise);
    return fp8Mma && fitsFp8Wgmma(op);
  }

  /// The grouped GEMMs on wgmma. Blockwise FP8 (unless fp8block-exact) and,
  /// with fp8-mma, MXFP8 on FP8 wgmma; otherwise block-scaled operands
  /// exact through bf16, transposed rhs (materialized): see
  /// rewriteForWgmma. All GEMMs first, so that a GEMM's SwiGLU epilogue sees
  /// the round trip of the next GEMM's operand.
  void lowerWgmmaGroupedGemms(SmallVectorImpl<GroupedMatmulOp> &candidates,
                              const llvm::DenseSet<Operation *> &liveRowsOnly,
                              ModuleOp module, SymbolTable &symbols) {
    SmallVector<bool> live;
    // Why a GEMM could not be brought to the kernels' form (rewriteForWgmma).
    SmallVector<std::string> whyNot;
    // Why a blockwise FP8 GEMM is not on the FP8 wgmma kernel (then its
    // operands take the bf16 kernels through exact round trips: slower).
    SmallVector<std::string> whyNotFp8;
    for (GroupedMatmulOp &op : candidates) {
      live.push_back(liveRowsOnly.contains(op));
      whyNot.emplace_back();
      whyNotFp8.emplace_back();
      // Block-scaled GEMMs for the FP8 kernels stay as they are for them;
      // the others go to the bf16 kernels where they can.
      if (!onFp8Wgmma(op, report ? &whyNotFp8.back() : nullptr))
        if (std::optional<GroupedMatmulOp> rewritten =
                rewriteForWgmma(op, report ? &whyNot.back() : nullptr))
          op = *rewritten;
    }
    for (auto [op, live, why, whyFp8] :
         llvm::zip(candidates, live, whyNot, whyNotFp8)) {
      // FP8 wgmma sums each promoted block at reduced precision: blockwise
      // FP8 (the recipe's arithmetic) unless fp8block-exact, MXFP8 only on
      // request (fp8-mma); otherwise block-scaled operands take the bf16
      // kernels exactly (MX, power-of-two blockwise FP8) or the generic
      // ones.
      if (onFp8Wgmma(op) && lowerToFp8Wgmma(op, module, symbols))
        continue;
      std::optional<WgmmaGemm> gemm =
          matchWgmmaGemm(op, report && why.empty() ? &why : nullptr);
      if (!gemm) {
        if (report)
          reporter()->generic(op, why);
        continue;
      }
      if (report && !whyFp8.empty())
        reporter()->slower(op, kOffFp8Wgmma, whyFp8);
      if (report && !gemm->tma)
        reporter()->slower(op, "the cp.async wgmma kernel, not the TMA one",
                           gemm->whyNotTma());
      gemm->liveRowsOnly = live;
      std::string unfused;
      if (std::optional<SwigluFusion> fusion = matchSwigluFusion(
              op, *gemm, mxActivations == MXActivations::always,
              report ? &unfused : nullptr)) {
        lowerSwigluFusion(op, *gemm, *fusion, module, symbols);
        continue;
      }
      if (!unfused.empty())
        reporter()->slower(
            op,
            "its SwiGLU (and the rounding after it) on the generic "
            "kernels, not in this GEMM's epilogue",
            unfused);
      if (auto f8 = f8LhsOf(op, *gemm)) {
        lowerF8LhsGemm(op, *gemm, f8->first, f8->second, module, symbols);
        continue;
      }
      lowerWgmmaGemm(op, *gemm, module, symbols);
    }
  }
};

} // namespace
