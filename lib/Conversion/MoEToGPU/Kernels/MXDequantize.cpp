//===- MXDequantize.cpp - MX dequantize -----------------------------------===//
//
// MX dequantize: packed MX data and scales to floats
// --------------------------------------------------
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
//
//===----------------------------------------------------------------------===//

#include "KernelBuilder.h"
#include "Kernels.h"

using namespace mlir;
using namespace mlir::moe;

namespace mlir::moe::kernels {

namespace dequant {
constexpr int64_t Threads = 256;
constexpr int64_t Per = 8;
} // namespace dequant

using namespace dequant;

namespace {

struct MXDequantize {
  MXTensorType mx;
  Type outElt;
  int64_t elements() const { return mxElements(mx); }
  /// Elements between consecutive values of one block.
  int64_t inner() const { return mxInner(mx); }
  std::string name() const {
    return llvm::formatv("moe_mx_dequantize_{0}_{1}_to_{2}", mxShapeName(mx),
                         elementName(mx.getElementType()), elementName(outElt))
        .str();
  }
};

std::optional<MXDequantize> matchDequantize(DequantizeOp dq, WhyNot why) {
  auto mx = dyn_cast<MXTensorType>(dq.getInput().getType());
  RankedTensorType out = dq.getType();
  if (isa<FP8BlockTensorType>(dq.getInput().getType())) {
    // What the blockwise FP8 round trip (which ran before) said.
    if (why) {
      std::string reason;
      isFP8BlockRoundTrip(dq, &reason);
      return noKernel(why, "blockwise FP8: {0}", reason);
    }
    return std::nullopt;
  }
  if (!mx)
    return noKernel(why, "the input is not MX");
  if (dq->getParentOfType<ExpertsOp>())
    return noKernel(why, "inside a moe.experts region (not grouped)");
  if (ShapedType::isDynamicShape(mx.getShape()) || !out.hasStaticShape())
    return noKernel(why, "a dynamic shape (the kernels are generated for "
                         "static shapes)");
  if (!isRoundTripFloat(out.getElementType()))
    return noKernel(why, "a {0} result", out.getElementType());
  if (mx.getBlockSize() != roundtrip::Block ||
      mx.getShape()[mx.getAxis()] % roundtrip::Block != 0)
    return noKernel(why,
                    "blocks of {0} over {1} values (the kernel takes "
                    "whole blocks of {2})",
                    mx.getBlockSize(), mx.getShape()[mx.getAxis()],
                    roundtrip::Block);
  if (mx.getShape().back() % Per != 0 || out.getNumElements() == 0)
    return noKernel(why, "the last dim, {0}, is not a multiple of {1}",
                    mx.getShape().back(), Per);
  return MXDequantize{mx, out.getElementType()};
}

/// Emits the body of the dequantize's gpu.launch.
struct DequantizeEmitter : KernelBuilder {
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
    Value gtid = add(mul(launch.getBlockIds().x, idx(Threads)), tid);
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
    strideLoop(gtid, idx(g.elements() / Per), grid * Threads, [&](Value group) {
      Value first = mul(group, idx(Per));
      SmallVector<Value> bytes = loadBytes(ds, dBase, first, Per, aligned);
      // Flat element f = (o * along + a) * inner + i has scale
      // (o * along / 32 + a / 32) * inner + i.
      SmallVector<Value> scaleBytes;
      if (oneScale) {
        scaleBytes.assign(
            Per, loadBits(ss, ValueRange{div(first, roundtrip::Block)}));
      } else {
        Value i = rem(first, inner), rowIdx = div(first, inner);
        Value o = div(rowIdx, along), a = rem(rowIdx, along);
        Value at = add(mul(add(mul(o, idx(along / roundtrip::Block)),
                               div(a, roundtrip::Block)),
                           idx(inner)),
                       i);
        scaleBytes = loadBytes(ss, sBase, at, Per, aligned);
      }
      SmallVector<Value> values;
      for (int64_t p = 0; p < Per / 2; ++p) {
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

} // namespace

void lowerDequantizes(ModuleOp module, SymbolTable &symbols,
                      KernelReport *report) {
  SmallVector<std::pair<DequantizeOp, MXDequantize>> work;
  std::string why;
  for (auto func : module.getOps<func::FuncOp>())
    if (!func->hasAttr("moe.dedicated_kernel"))
      func.walk([&](DequantizeOp dq) {
        if (std::optional<MXDequantize> g =
                matchDequantize(dq, report ? &why : nullptr))
          work.push_back({dq, *g});
        else if (report)
          report->generic(dq, why);
      });
  for (auto &item : work) {
    DequantizeOp dq = item.first;
    const MXDequantize &g = item.second;
    MXTensorType mx = g.mx;
    int64_t grid =
        std::min(tilesOf(g.elements() / Per, Threads), roundtrip::MaxBlocks);
    func::FuncOp kernel = getOrCreateKernelCall(
        module, symbols, g.name(), "mx dequantize",
        {mx.getDataType(), mx.getScalesType()}, dq.getType(), dq.getLoc(),
        {grid, 1, 1, Threads, 0},
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

} // namespace mlir::moe::kernels
