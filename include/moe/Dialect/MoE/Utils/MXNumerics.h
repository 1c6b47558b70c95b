//===- MXNumerics.h - scalar MX arithmetic as arith ops ---------*- C++ -*-===//
//
// The one place the MX (OCP microscaling) rules are written down as IR. Every
// lowering of moe.quantize / moe.dequantize / block-scaled GEMM operands (CPU
// and GPU) builds its scalar code from these helpers, so all paths produce the
// same bits (one exception, checked bit for bit on the GPU: the GPU round-trip
// kernel rounds elements with the hardware's f32 -> f8 conversion, which
// follows buildEncode's rule). Only integer and exactly-rounded f32
// arithmetic is used:
// `x * 2^k` for a power of two, `math.roundeven`, comparisons and bit moves.
//
//===----------------------------------------------------------------------===//
#ifndef MOE_DIALECT_MOE_UTILS_MXNUMERICS_H
#define MOE_DIALECT_MOE_UTILS_MXNUMERICS_H

#include "mlir/IR/Builders.h"
#include "moe/Dialect/MoE/IR/MoEOps.h"

namespace mlir::moe {

/// The parameters of an MX element format.
struct MXFormat {
  unsigned exponentBits;
  unsigned mantissaBits;
  int bias;
  /// Unbiased exponent of the largest finite value (8 for E4M3, 15 for E5M2).
  int emax;
  /// The fraction bits of the largest finite value, as the 23 f32 fraction
  /// bits (1.75 -> 0x600000).
  uint32_t maxFraction;
  /// The largest finite value.
  double maxValue;
  /// The element encoding used for NaN (sign bit clear).
  uint32_t nanCode;
  /// True if the all-ones exponent encodes infinities (E5M2).
  bool hasInfinity;

  /// The format of `f8E4M3FN` or `f8E5M2`; asserts on anything else (the
  /// type verifier rejects other element types).
  static MXFormat get(Type elementType);
};

/// amax (f32, >= 0, may be NaN/Inf) -> biased E8M0 scale byte (i8): 0 for an
/// all-zero block, 0xFF for NaN/Inf, else clamp(e, -127, 127) + 127.
Value buildScaleByte(OpBuilder &b, Location loc, Value amax,
                     const MXFormat &format, ScaleMode mode);

/// Scale byte (i8) -> the f32 factor elements are multiplied by before
/// rounding: 2^-e, or 1 for the NaN scale.
Value buildInverseScale(OpBuilder &b, Location loc, Value scaleByte);

/// Scale byte (i8) -> 2^e as f32; NaN for 0xFF.
Value buildScaleValue(OpBuilder &b, Location loc, Value scaleByte);

/// f32 -> element bits (i8): round to nearest even, saturate to +-max,
/// NaN -> NaN, sign kept (including -0).
Value buildEncode(OpBuilder &b, Location loc, Value x, const MXFormat &format);

/// Element bits (i8) -> f32 (exact).
Value buildDecode(OpBuilder &b, Location loc, Value bits,
                  const MXFormat &format);

/// A blockwise FP8 tile's amax (f32, >= 0, may be NaN/Inf) -> the f32 factor
/// its elements are multiplied by before rounding (moe.quantize):
/// `max / amax` rounded to nearest; 1 for an amax of 0, Inf or NaN; the
/// largest finite f32 where the quotient overflows; with `pow2`, only its
/// exponent. The stored scale is its reciprocal.
Value buildFP8BlockScale(OpBuilder &b, Location loc, Value amax,
                         const MXFormat &format, bool pow2);

} // namespace mlir::moe

#endif
