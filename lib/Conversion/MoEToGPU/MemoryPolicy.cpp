//===- MemoryPolicy.cpp - memory-driven kernel choices --------------------===//
//===----------------------------------------------------------------------===//

#include "MemoryPolicy.h"
#include "Kernels/TmaGemm.h"

#include "moe/Dialect/MoE/Transforms/GemmRecipe.h"
#include "moe/Dialect/MoE/Utils/TensorLiveness.h"

#include "mlir/IR/Matchers.h"

using namespace mlir;
using namespace mlir::moe;

namespace mlir::moe::kernels {

bool groupsAlignedTo(Value offsets, int64_t m) {
  if (auto d = offsets.getDefiningOp<DispatchOp>())
    return offsets == d.getOffsets() && d.getPadTo() % m == 0;
  if (auto s = offsets.getDefiningOp<SlotOffsetsOp>())
    return s.getPadTo() % m == 0;
  // Constant offsets (a dense GEMM's one group, [0, rows]).
  DenseIntElementsAttr values;
  if (matchPattern(offsets, m_Constant(&values)))
    return llvm::all_of(values.getValues<APInt>(), [&](const APInt &v) {
      return v.getSExtValue() % m == 0;
    });
  return false;
}

/// The bf16 dequantizes reading `q` when they are all of its users.
static SmallVector<DequantizeOp> bf16RoundTripsOf(QuantizeOp q) {
  SmallVector<DequantizeOp> trips;
  for (Operation *user : q->getUsers()) {
    auto dq = dyn_cast<DequantizeOp>(user);
    if (!dq || !dq.getType().getElementType().isBF16())
      return {};
    trips.push_back(dq);
  }
  return trips;
}

/// Whether the backward epilogue's columnwise rounding of dh lowers the
/// block's peak of live tensors. Either way dh's roundings (bf16) live from
/// the kernel on; without it the kernel also writes dh in f32, which the
/// columnwise round trip right after it reads (see lowerRoundTrips): one
/// more f32 [R, 2F] at the kernel. The epilogue's columnwise pass costs
/// time (amaxes over two warps), so it is used only where that f32 would
/// raise the peak.
/// The position of the first of `dqs` in `block` (the dequantizes a fused
/// kernel at position `at` replaces, where they stand now), after `at`.
static unsigned firstDequantize(const BlockLiveness &live, Block &block,
                                ArrayRef<DequantizeOp> dqs, unsigned at) {
  unsigned first = std::numeric_limits<unsigned>::max();
  for (DequantizeOp dq : dqs)
    if (Operation *anc = block.findAncestorOpInBlock(*dq))
      first = std::min(first, live.position(anc));
  return first == std::numeric_limits<unsigned>::max()
             ? at + 1
             : std::max(first, at + 1);
}

static bool colRoundingLowersPeak(GroupedMatmulOp op,
                                  const SwigluFusion &fusion) {
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
static bool takesF8Lhs(GroupedMatmulOp op) {
  std::optional<WgmmaGemm> g = matchWgmmaGemm(op);
  return g && g->tma && llvm::none_of(op->getUsers(), [](Operation *u) {
           return isa<SwigluOp, SwigluGradOp>(u);
         });
}

/// The bf16 dequantize a TMA GEMM's lhs is and the moe.mx_pack it reads (an
/// epilogue's MX result, blocks of 32 along K), when the kernel can read
/// the elements and scales instead.
std::optional<std::pair<DequantizeOp, MXPackOp>> f8LhsOf(GroupedMatmulOp op,
                                                         const WgmmaGemm &g) {
  auto dq = op.getLhs().getDefiningOp<DequantizeOp>();
  if (!g.tma || !dq)
    return std::nullopt;
  auto pack = dq.getInput().getDefiningOp<MXPackOp>();
  if (!pack)
    return std::nullopt;
  auto mx = dyn_cast<MXTensorType>(pack.getType());
  if (!mx || mx.getAxis() != 1 || mx.getBlockSize() != tma::SwigluBlock ||
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
static bool mxLowersPeak(GroupedMatmulOp op, const SwigluFusion &fusion) {
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
  int64_t encoded = elements + elements / tma::SwigluBlock;
  unsigned size = block->getOperations().size();
  int64_t lowered = std::max({live.peak(0, at), live.peak(end, size),
                              live.peak(at, end) - rounded + encoded});
  return lowered < live.peak();
}

std::optional<SwigluFusion> matchSwigluFusion(GroupedMatmulOp op,
                                              const WgmmaGemm &g, bool mxAlways,
                                              WhyNot why) {
  Value result = op.getResult();
  Operation *activation = nullptr;
  // An f32 result (rounded by a quantize, or to bf16, after it) or a bf16
  // one (the rounding itself).
  auto f32OrBf16 = [](Type t) {
    Type elt = cast<RankedTensorType>(t).getElementType();
    return elt.isF32() || elt.isBF16();
  };
  for (OpOperand &use : result.getUses()) {
    Operation *user = use.getOwner();
    if (activation)
      break;
    if (auto s = dyn_cast<SwigluOp>(user);
        s && !g.rhsTransposed && s.getLayout() == SwigluLayout::split &&
        f32OrBf16(s.getType()))
      activation = s;
    if (auto s = dyn_cast<SwigluGradOp>(user);
        s && g.rhsTransposed && use.getOperandNumber() == 1 &&
        s.getLayout() == SwigluLayout::split && f32OrBf16(s.getType()) &&
        s.getInput().getType().getElementType().isF32() && result.hasOneUse())
      activation = s;
  }
  if (!activation)
    return std::nullopt;
  SwigluFusion fusion{activation, {}, {}, {}, {}, {}};
  fusion.epilogue.grad = g.rhsTransposed;
  Value values = activation->getResult(0);
  // The bf16 recipe: the values in bf16 (SwigluEpilogue without f8), as the
  // activation's result type or as the only use of its f32 result; else
  // their rowwise MX round trip.
  bool bf16 =
      cast<RankedTensorType>(values.getType()).getElementType().isBF16() ||
      onlyRoundedToBF16(values);
  if (!bf16) {
    for (Operation *user : values.getUsers()) {
      auto q = dyn_cast<QuantizeOp>(user);
      if (!q || fusion.quantize)
        continue;
      auto mx = dyn_cast<MXTensorType>(q.getType());
      if (!mx || mx.getAxis() != 1 || mx.getBlockSize() != tma::SwigluBlock)
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
  }
  // Any K and F (the TMA kernel's partial stages and column tiles; the
  // epilogue stores whole runs of 32 outputs: an MX block, of which F, the
  // quantize's blocked dim, is a multiple; for the bf16 rounding, F must
  // be one).
  if (!g.tma)
    return noKernel(why, "the GEMM is on the cp.async kernel, which has no "
                         "epilogues");
  // h (forward) stays a result for any other user (a train step's backward
  // reads it).
  fusion.epilogue.keepH = !fusion.epilogue.grad &&
                          llvm::any_of(result.getUsers(), [&](Operation *u) {
                            return u != activation;
                          });
  if (bf16) {
    int64_t f = fusion.epilogue.grad ? g.n : g.n / 2;
    if (f % tma::SwigluBlock)
      return noKernel(why, "the SwiGLU's width {0} is not a multiple of {1}", f,
                      tma::SwigluBlock);
    return fusion;
  }
  fusion.epilogue.f8 =
      cast<MXTensorType>(fusion.quantize.getType()).getElementType();
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
  if (groupsAlignedTo(op.getOffsets(), tma::SwigluBlock)) {
    for (Operation *user : values.getUsers()) {
      auto q = dyn_cast<QuantizeOp>(user);
      auto mx = q ? dyn_cast<MXTensorType>(q.getType()) : MXTensorType();
      if (!mx || fusion.colQuantize || mx.getAxis() != 0 ||
          mx.getBlockSize() != tma::SwigluBlock)
        continue;
      fusion.colRoundTrips = bf16RoundTripsOf(q);
      if (!fusion.colRoundTrips.empty())
        fusion.colQuantize = q;
    }
    // Only where it takes the f32 values out: forward (a, for the second
    // GEMM's weight gradient) always; backward (dh) only for the least
    // memory (`mxAlways`), where that lowers the peak: its columnwise pass
    // (an amax and a scale for every 2 values here) makes the epilogue
    // ALU-bound, the kernel more than twice as long (138 TFLOP/s measured
    // at DeepSeek-V2-Lite's dims; the rowwise-only kernel 330-383 at
    // others'), more than the round trip it saves takes.
    if (fusion.colQuantize && !f32Read(fusion.colQuantize) &&
        (!fusion.epilogue.grad ||
         (mxAlways && colRoundingLowersPeak(op, fusion)))) {
      fusion.epilogue.col = true;
      fusion.epilogue.colF8 =
          cast<MXTensorType>(fusion.colQuantize.getType()).getElementType();
      fusion.epilogue.colMode = fusion.colQuantize.getScaleMode();
    } else {
      // Not in the epilogue: the f32 values stay a result for it.
      fusion.colQuantize = {};
      fusion.colRoundTrips.clear();
    }
  }
  // The f32 values stay a result for any other user (the weight gradients
  // quantize a and dh along the rows).
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
      llvm::all_of(fusion.roundTrips,
                   [](DequantizeOp dq) {
                     return llvm::all_of(dq->getUses(), [](OpOperand &use) {
                       auto gemm = dyn_cast<GroupedMatmulOp>(use.getOwner());
                       return gemm && use.getOperandNumber() == 0 &&
                              takesF8Lhs(gemm);
                     });
                   }) &&
      (mxAlways || mxLowersPeak(op, fusion));
  return fusion;
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
           !rows.use_empty() && llvm::all_of(rows.getUsers(), [](Operation *u) {
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
    return d.getTokens() == rows && rows.getDefiningOp<linalg::GenericOp>() &&
           readFromTokens(d.getSorted());
  if (isa<tensor::CollapseShapeOp, tensor::ExpandShapeOp>(user) &&
      (rows.getDefiningOp<linalg::GenericOp>() ||
       isa_and_nonnull<tensor::CollapseShapeOp, tensor::ExpandShapeOp>(
           rows.getDefiningOp())))
    return readFromTokens(user->getResult(0));
  return false;
}

SmallVector<bool>
roundTripPairsToSplit(ArrayRef<std::pair<Operation *, Operation *>> pairs,
                      bool withinPeak) {
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
  SmallVector<unsigned> order =
      llvm::to_vector(llvm::seq<unsigned>(0, pairs.size()));
  llvm::stable_sort(order, [&](unsigned a, unsigned b) {
    return tensorBytes(pairs[a].second->getResult(0)) <
           tensorBytes(pairs[b].second->getResult(0));
  });
  SmallVector<bool> split(pairs.size(), false);
  for (unsigned i : order)
    split[i] = splits(pairs[i].first, pairs[i].second);
  return split;
}

} // namespace mlir::moe::kernels
