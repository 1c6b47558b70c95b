//===- MXNumerics.cpp - scalar MX arithmetic as arith ops -----------------===//

#include "moe/Dialect/MoE/Utils/MXNumerics.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"

using namespace mlir;
using namespace mlir::moe;

MXFormat MXFormat::get(Type t) {
  if (isa<Float8E4M3FNType>(t))
    // 0.1111.110 = 1.75 * 2^8 = 448; S.1111.111 is NaN; no infinities.
    return {4, 3, 7, 8, 0x600000, 448.0, 0x7F, false};
  assert(isa<Float8E5M2Type>(t) && "MX element type");
  // 0.11110.11 = 1.75 * 2^15 = 57344; exponent 11111 is Inf/NaN. NaN is
  // encoded as the quiet NaN 0.11111.10 (what CUDA's conversions produce).
  return {5, 2, 15, 15, 0x600000, 57344.0, 0x7E, true};
}

namespace {
/// Small helpers over one builder and location.
struct Arith {
  OpBuilder &b;
  Location loc;
  Type i32() { return b.getI32Type(); }
  Value c32(int64_t v) { return arith::ConstantIntOp::create(b, loc, v, 32); }
  Value f32(double v) {
    return arith::ConstantOp::create(b, loc, b.getF32FloatAttr(v));
  }
  Value bitsF(Value f) { return arith::BitcastOp::create(b, loc, i32(), f); }
  Value asF(Value i) {
    return arith::BitcastOp::create(b, loc, b.getF32Type(), i);
  }
  Value add(Value x, Value y) { return arith::AddIOp::create(b, loc, x, y); }
  Value sub(Value x, Value y) { return arith::SubIOp::create(b, loc, x, y); }
  Value band(Value x, Value y) { return arith::AndIOp::create(b, loc, x, y); }
  Value bor(Value x, Value y) { return arith::OrIOp::create(b, loc, x, y); }
  Value shl(Value x, Value y) { return arith::ShLIOp::create(b, loc, x, y); }
  Value shr(Value x, Value y) { return arith::ShRUIOp::create(b, loc, x, y); }
  Value cmp(arith::CmpIPredicate p, Value x, Value y) {
    return arith::CmpIOp::create(b, loc, p, x, y);
  }
  Value cmpf(arith::CmpFPredicate p, Value x, Value y) {
    return arith::CmpFOp::create(b, loc, p, x, y);
  }
  Value sel(Value c, Value x, Value y) {
    return arith::SelectOp::create(b, loc, c, x, y);
  }
  Value mulf(Value x, Value y) { return arith::MulFOp::create(b, loc, x, y); }
  /// 2^k as f32 for an i32 k in [-127, 127] (2^-127 is subnormal).
  Value exp2i(Value k) {
    Value normal = asF(shl(add(k, c32(127)), c32(23)));
    Value sub127 = asF(c32(0x00400000));
    return sel(cmp(arith::CmpIPredicate::slt, k, c32(-126)), sub127, normal);
  }
  Value toI8(Value x) {
    return arith::TruncIOp::create(b, loc, b.getI8Type(), x);
  }
  Value fromI8(Value x) { return arith::ExtUIOp::create(b, loc, i32(), x); }
};
} // namespace

Value mlir::moe::buildScaleByte(OpBuilder &b, Location loc, Value amax,
                                const MXFormat &fmt, ScaleMode mode) {
  Arith a{b, loc};
  using P = arith::CmpIPredicate;
  Value bits = a.bitsF(amax);
  Value biased = a.shr(bits, a.c32(23));
  Value frac = a.band(bits, a.c32(0x7FFFFF));
  // Normalize an f32 subnormal amax: its leading one at bit p gives 2^(p-149).
  Value lz = math::CountLeadingZerosOp::create(b, loc, frac);
  Value p = a.sub(a.c32(31), lz);
  Value isSub = a.cmp(P::eq, biased, a.c32(0));
  Value exponent =
      a.sel(isSub, a.sub(p, a.c32(149)), a.sub(biased, a.c32(127)));
  Value subFrac = a.band(a.shl(frac, a.sub(a.c32(23), p)), a.c32(0x7FFFFF));
  Value fraction = a.sel(isSub, subFrac, frac);
  // e = floor(log2(amax)) - emax, plus one for rceil when amax's significand
  // exceeds max_elem's (then amax / max_elem is in (2^k, 2^(k+1))).
  Value e = a.sub(exponent, a.c32(fmt.emax));
  if (mode == ScaleMode::rceil) {
    Value up = a.cmp(P::ugt, fraction, a.c32(fmt.maxFraction));
    e = a.add(e, arith::ExtUIOp::create(b, loc, a.i32(), up));
  }
  e = arith::MaxSIOp::create(b, loc, e, a.c32(-127));
  e = arith::MinSIOp::create(b, loc, e, a.c32(127));
  Value byte = a.add(e, a.c32(127));
  Value isZero = a.cmpf(arith::CmpFPredicate::OEQ, amax, a.f32(0.0));
  Value finite = a.cmpf(arith::CmpFPredicate::OLT, amax,
                        a.f32(std::numeric_limits<float>::infinity()));
  byte = a.sel(isZero, a.c32(0), byte);
  byte = a.sel(finite, byte, a.c32(0xFF));
  return a.toI8(byte);
}

Value mlir::moe::buildInverseScale(OpBuilder &b, Location loc,
                                   Value scaleByte) {
  Arith a{b, loc};
  Value s = a.fromI8(scaleByte);
  Value inv = a.exp2i(a.sub(a.c32(127), s));
  return a.sel(a.cmp(arith::CmpIPredicate::eq, s, a.c32(0xFF)), a.f32(1.0),
               inv);
}

Value mlir::moe::buildScaleValue(OpBuilder &b, Location loc, Value scaleByte) {
  Arith a{b, loc};
  Value s = a.fromI8(scaleByte);
  Value v = a.exp2i(a.sub(s, a.c32(127)));
  return a.sel(a.cmp(arith::CmpIPredicate::eq, s, a.c32(0xFF)),
               a.f32(std::numeric_limits<float>::quiet_NaN()), v);
}

Value mlir::moe::buildEncode(OpBuilder &b, Location loc, Value x,
                             const MXFormat &fmt) {
  Arith a{b, loc};
  using P = arith::CmpIPredicate;
  int minExp = 1 - fmt.bias; // exponent of the smallest normal
  Value xbits = a.bitsF(x);
  Value sign = a.shl(a.shr(xbits, a.c32(31)), a.c32(7));
  Value isNaN = a.cmpf(arith::CmpFPredicate::UNO, x, x);
  Value mag = math::AbsFOp::create(b, loc, x);
  // The spacing of representable values around |x| is 2^q with
  // q = max(exponent(|x|), minExp) - mantissaBits; round |x| / 2^q to an
  // integer (exact scaling), then scale back: round to nearest even in the
  // target format, with an unbounded exponent range.
  Value exp = a.sub(a.shr(a.bitsF(mag), a.c32(23)), a.c32(127));
  exp = arith::MaxSIOp::create(b, loc, exp, a.c32(minExp));
  Value q = a.sub(exp, a.c32(fmt.mantissaBits));
  // |x| = Inf has exponent 128: q can reach 128 - m; clamp for exp2i.
  q = arith::MinSIOp::create(b, loc, q, a.c32(127));
  Value scaled = a.mulf(mag, a.exp2i(a.sub(a.c32(0), q)));
  Value rounded = math::RoundEvenOp::create(b, loc, scaled);
  Value value = a.mulf(rounded, a.exp2i(q));
  // Saturate (Inf saturates too).
  value = arith::MinimumFOp::create(b, loc, value, a.f32(fmt.maxValue));
  // Encode the (now exactly representable) value.
  Value vbits = a.bitsF(value);
  Value vexp = a.sub(a.shr(vbits, a.c32(23)), a.c32(127));
  Value vfrac = a.band(vbits, a.c32(0x7FFFFF));
  Value normalCode =
      a.bor(a.shl(a.add(vexp, a.c32(fmt.bias)), a.c32(fmt.mantissaBits)),
            a.shr(vfrac, a.c32(23 - fmt.mantissaBits)));
  // Subnormal: value / 2^(minExp - m) is the mantissa field.
  Value subMant = a.mulf(value, a.exp2i(a.c32(fmt.mantissaBits - minExp)));
  Value subCode = arith::FPToUIOp::create(b, loc, a.i32(), subMant);
  Value code = a.sel(a.cmp(P::sge, vexp, a.c32(minExp)), normalCode, subCode);
  code = a.sel(isNaN, a.c32(fmt.nanCode), code);
  return a.toI8(a.bor(sign, code));
}

Value mlir::moe::buildDecode(OpBuilder &b, Location loc, Value bits,
                             const MXFormat &fmt) {
  Arith a{b, loc};
  using P = arith::CmpIPredicate;
  int minExp = 1 - fmt.bias;
  Value u = a.fromI8(bits);
  Value sign = a.shr(u, a.c32(7));
  Value e = a.band(a.shr(u, a.c32(fmt.mantissaBits)),
                   a.c32((1 << fmt.exponentBits) - 1));
  Value m = a.band(u, a.c32((1 << fmt.mantissaBits) - 1));
  Value normal =
      a.asF(a.bor(a.shl(sign, a.c32(31)),
                  a.bor(a.shl(a.add(e, a.c32(127 - fmt.bias)), a.c32(23)),
                        a.shl(m, a.c32(23 - fmt.mantissaBits)))));
  Value subMag = a.mulf(arith::UIToFPOp::create(b, loc, b.getF32Type(), m),
                        a.exp2i(a.c32(minExp - int(fmt.mantissaBits))));
  Value sub = a.sel(a.cmp(P::eq, sign, a.c32(1)),
                    arith::NegFOp::create(b, loc, subMag), subMag);
  Value v = a.sel(a.cmp(P::eq, e, a.c32(0)), sub, normal);
  Value allOnes = a.c32((1 << fmt.exponentBits) - 1);
  Value nan = a.f32(std::numeric_limits<float>::quiet_NaN());
  if (fmt.hasInfinity) {
    Value special = a.cmp(P::eq, e, allOnes);
    Value inf = a.f32(std::numeric_limits<float>::infinity());
    Value signedInf = a.sel(a.cmp(P::eq, sign, a.c32(1)),
                            arith::NegFOp::create(b, loc, inf), inf);
    Value sv = a.sel(a.cmp(P::eq, m, a.c32(0)), signedInf, nan);
    return a.sel(special, sv, v);
  }
  Value isNaN = a.cmp(P::eq, a.band(u, a.c32(0x7F)), a.c32(fmt.nanCode));
  return a.sel(isNaN, nan, v);
}

Value mlir::moe::buildFP8BlockScale(OpBuilder &b, Location loc, Value amax,
                                    const MXFormat &fmt, bool pow2) {
  Arith a{b, loc};
  using F = arith::CmpFPredicate;
  Value inf = a.f32(std::numeric_limits<float>::infinity());
  Value s = arith::DivFOp::create(b, loc, a.f32(fmt.maxValue), amax);
  s = a.sel(a.cmpf(F::OEQ, s, inf), a.f32(std::numeric_limits<float>::max()),
            s);
  Value unit = arith::OrIOp::create(
      b, loc,
      arith::OrIOp::create(b, loc, a.cmpf(F::UNO, amax, amax),
                           a.cmpf(F::OEQ, amax, a.f32(0.0))),
      a.cmpf(F::OEQ, amax, inf));
  s = a.sel(unit, a.f32(1.0), s);
  if (pow2)
    s = a.asF(a.band(a.bitsF(s), a.c32(int32_t(0xFF800000u))));
  return s;
}
