//===- MemoryPolicy.h - memory-driven kernel choices ------------*- C++ -*-===//
//
// The choices -moe-gpu-dedicated-kernels makes to hold less memory, on the
// compiler's estimate of a block's live tensors (TensorLiveness.h): which
// SwiGLU epilogue a GEMM gets (its MX encoding instead of the bf16
// rounding, the columnwise rounding in the epilogue), and which pairs of MX
// round trips are split instead of reading their input once.
//
//===----------------------------------------------------------------------===//
#ifndef MOE_CONVERSION_MOETOGPU_MEMORYPOLICY_H
#define MOE_CONVERSION_MOETOGPU_MEMORYPOLICY_H

#include "Kernels/Kernels.h"

namespace mlir::moe::kernels {

/// The SwiGLU fusion of `op` (matched as `g`) when its TMA kernel can
/// compute the activation and the next GEMM's operand rounding in its
/// epilogue, with the epilogue chosen for memory (`mxAlways`: the MX
/// encoding wherever the readers can take it, and the backward's columnwise
/// rounding where it lowers the block's peak; else the encoding only where
/// it lowers the peak, and no backward columnwise rounding); or, where the
/// activation is only rounded to bf16 (the bf16 recipe), that rounding and
/// no MX one. A GEMM read by a
/// SwiGLU whose dims the epilogue does not take says why (`why`); other misses
/// are no SwiGLU pattern and say nothing.
std::optional<SwigluFusion> matchSwigluFusion(GroupedMatmulOp op,
                                              const WgmmaGemm &g, bool mxAlways,
                                              WhyNot why = nullptr);

/// The bf16 dequantize a TMA GEMM's lhs is and the moe.mx_pack it reads (an
/// epilogue's MX result, blocks of 32 along K), when the kernel can read
/// the elements and scales instead.
std::optional<std::pair<DequantizeOp, MXPackOp>> f8LhsOf(GroupedMatmulOp op,
                                                         const WgmmaGemm &g);

/// Whether `rows` is never materialized because the paired round trips of a
/// dispatch read the dispatched rows from the tokens
/// (-moe-gpu-fuse-row-gathers).
bool readFromTokens(Value rows);

/// Whether every group of `offsets` provably starts (and ends) at a multiple
/// of `m` rows: the offsets of a moe.dispatch or moe.slot_offsets whose
/// pad_to is a multiple of m, or constant offsets that all are (a dense
/// GEMM's one group, [0, rows]).
bool groupsAlignedTo(Value offsets, int64_t m);

/// Which of the round-trip pairs `pairs` (each pair's two round trips, in
/// block order) to split: with `withinPeak`, those whose pairing would raise
/// their block's peak of live tensors, decided smallest first (the most
/// pairs within the peak); none otherwise.
SmallVector<bool>
roundTripPairsToSplit(ArrayRef<std::pair<Operation *, Operation *>> pairs,
                      bool withinPeak);

} // namespace mlir::moe::kernels

#endif
