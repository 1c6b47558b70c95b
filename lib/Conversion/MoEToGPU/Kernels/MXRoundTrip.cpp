//===- MXRoundTrip.cpp - MX round trips -----------------------------------===//
//
// MX round trip: moe.dequantize(moe.quantize x) in one pass
// ---------------------------------------------------------
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
// Grid: at most roundtrip::MaxBlocks CTAs striding over the work, of 256
// threads (128 where each thread holds a whole block: 136 registers a thread,
// so three CTAs an SM instead of one).
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
//
//===----------------------------------------------------------------------===//

#include "KernelBuilder.h"
#include "Kernels.h"

#include "moe/Dialect/MoE/Utils/LiveRows.h"

using namespace mlir;
using namespace mlir::moe;

namespace mlir::moe::kernels {

using namespace roundtrip;

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

bool isRoundTripFloat(Type t) { return t.isF32() || t.isBF16() || t.isF16(); }

/// The round trip `dq` computes, if the kernel handles it.
std::optional<MXRoundTrip> matchRoundTrip(DequantizeOp dq) {
  auto q = dq.getInput().getDefiningOp<QuantizeOp>();
  if (!q || dq->getParentOfType<ExpertsOp>())
    return std::nullopt;
  auto mx = dyn_cast<MXTensorType>(q.getType());
  auto in = dyn_cast<RankedTensorType>(q.getInput().getType());
  RankedTensorType out = dq.getType();
  if (!mx || !in || !in.hasStaticShape() || !out.hasStaticShape() ||
      ShapedType::isDynamicShape(mx.getShape()) ||
      !isRoundTripFloat(in.getElementType()) ||
      !isRoundTripFloat(out.getElementType()) || mx.getBlockSize() != Block ||
      mx.getShape()[mx.getAxis()] % Block != 0 || in.getNumElements() == 0)
    return std::nullopt;
  return MXRoundTrip{mx, in.getElementType(), out.getElementType(),
                     q.getScaleMode(), Type()};
}

namespace {

/// Emits the body of the round trip's gpu.launch.
struct RoundTripEmitter : KernelBuilder {
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
      Value first = add(mul(unit, idx(Block)), mul(rem(lane, 8), idx(4)));
      Value valid = cmp(P::ult, unit, units);
      SmallVector<Type> inTypes(4, g.inElt);
      SmallVector<Value> values = ifElse(
          inTypes, valid,
          [&] {
            return ifElse(
                inTypes, aligned,
                [&] {
                  return loadVector(g.inElt, 4,
                                    globalPtr(xBase, mul(first, idx(inBytes))),
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
      Value first = add(mul(div(u, inner), idx(Block * inner)), rem(u, inner));
      SmallVector<Value> at, values;
      for (int64_t j = 0; j < Block; ++j) {
        at.push_back(add(first, idx(j * inner)));
        values.push_back(
            toF32(memref::LoadOp::create(b, loc, xs, ValueRange{at.back()})));
      }
      SmallVector<Value> results = roundTrip(values, amaxOf(values));
      for (int64_t j = 0; j < Block; ++j)
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
  int64_t grid = std::min(tilesOf(g.threads(), g.ctaThreads()), MaxBlocks);
  func::FuncOp kernel = getOrCreateKernelCall(
      module, symbols, g.name(), "mx round trip", argTypes, resultType, loc,
      {grid, 1, 1, g.ctaThreads(), 0},
      [&](OpBuilder &b, gpu::LaunchOp launch, ArrayRef<Value> buf, Value out) {
        RoundTripEmitter k{
            {b, loc}, g, grid, buf[0], g.offsetElt ? buf[1] : Value(), out};
        k.emit(launch);
      });
  return g.offsetElt ? withGroupedArgs(kernel, {0}, 1) : kernel;
}

} // namespace

Value kernelOffsets(Value offsets) {
  auto type = offsets ? dyn_cast<RankedTensorType>(offsets.getType()) : nullptr;
  if (type && type.hasStaticShape() && type.getRank() == 1 &&
      type.getDimSize(0) > 0 && type.getElementType().isInteger())
    return offsets;
  return Value();
}

void runNarrowingRoundTripEarly(func::CallOp call) {
  // A round trip to a narrower type, the only reader of its input, runs
  // right after the input is computed: the narrow result is what waits for
  // the reader (the activation's columnwise rounding, read by the backward,
  // is held as bf16 instead of f32 in between).
  if (call.getNumOperands() != 1 || call.getNumResults() != 1)
    return;
  Value x = call.getOperand(0);
  Operation *producer = x.getDefiningOp();
  auto in = dyn_cast<RankedTensorType>(x.getType());
  auto out = dyn_cast<RankedTensorType>(call.getResult(0).getType());
  if (in && out && x.hasOneUse() && producer &&
      producer->getBlock() == call->getBlock() &&
      producer->isBeforeInBlock(call) &&
      out.getElementType().getIntOrFloatBitWidth() <
          in.getElementType().getIntOrFloatBitWidth())
    call->moveAfter(producer);
}

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
    if (Value offsets = kernelOffsets(bound.offsets);
        offsets && g.mx.getAxis() != 0) {
      g.offsetElt = getElementTypeOrSelf(offsets.getType());
      args.push_back(offsets);
    }
    func::FuncOp kernel = getOrCreateRoundTripFunction(
        module, symbols, g, llvm::to_vector(ValueRange(args).getTypes()),
        dq.getType(), dq.getLoc());
    OpBuilder b(dq);
    auto call = func::CallOp::create(b, dq.getLoc(), kernel, args);
    dq.getResult().replaceAllUsesWith(call.getResult(0));
    dq.erase();
    if (q->use_empty())
      q.erase();
    runNarrowingRoundTripEarly(call);
  }
}

} // namespace mlir::moe::kernels
