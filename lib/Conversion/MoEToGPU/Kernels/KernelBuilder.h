//===- KernelBuilder.h - the kernel-builder library -------------*- C++ -*-===//
//
// What every generated kernel is built from: KernelBuilder (arithmetic,
// control flow, addresses, shared memory, the MX rounding of a block, the
// per-expert tile walk), named launches of a given shape, and the private
// function that wraps one launch (getOrCreateKernelCall). Kernels are built
// from gpu, memref, arith, scf, llvm and nvvm ops; no PTX strings.
// HopperBuilder.h adds what the Hopper kernels share (wgmma, TMA, mbarriers).
//
//===----------------------------------------------------------------------===//
#ifndef MOE_CONVERSION_MOETOGPU_KERNELS_KERNELBUILDER_H
#define MOE_CONVERSION_MOETOGPU_KERNELS_KERNELBUILDER_H

#include "Kernels.h"
#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Dialect/MoE/Utils/MXNumerics.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Bufferization/IR/Bufferization.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/Support/FormatVariadic.h"

namespace mlir {
class DialectRegistry;
} // namespace mlir

namespace mlir::moe::kernels {

using P = arith::CmpIPredicate;

/// The MX block: 32 values share one E8M0 scale.
constexpr int64_t MXBlock = 32;
/// The suspend-time hint of an mbarrier try_wait, in ticks.
constexpr int64_t WaitTicks = 0x989680;

/// The builders every kernel emitter shares: arithmetic, control flow,
/// addresses, vector loads and stores, shared memory, the MX rounding and
/// encoding of a block, warp reductions. An emitter derives from it (or from
/// HopperBuilder) and writes one gpu.launch body.
struct KernelBuilder {
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
  /// A view of a static buffer as one dimension. A buffer with the identity
  /// layout is reinterpreted, not collapsed: loads and stores through a
  /// collapse_shape are folded into the buffer's own indices
  /// (-moe-gpu-map-loops), which costs a 64-bit division by every dim that
  /// is not a power of two at every access.
  Value flat(Value buffer) {
    auto type = cast<MemRefType>(buffer.getType());
    if (type.getLayout().isIdentity() && type.hasStaticShape()) {
      int64_t n = type.getNumElements();
      return memref::ReinterpretCastOp::create(
          b, loc,
          MemRefType::get({n}, type.getElementType(), AffineMap(),
                          type.getMemorySpace()),
          buffer, /*offset=*/0, /*sizes=*/ArrayRef<int64_t>{n},
          /*strides=*/ArrayRef<int64_t>{1});
    }
    SmallVector<ReassociationIndices> all(1);
    for (int64_t d = 0; d < type.getRank(); ++d)
      all[0].push_back(d);
    return memref::CollapseShapeOp::create(b, loc, buffer, all);
  }
  /// The address of a buffer's first element, as an i64.
  Value baseAddress(Value memref) {
    return toI64(
        memref::ExtractAlignedPointerAsIndexOp::create(b, loc, memref));
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
    Value v =
        LLVM::LoadOp::create(b, loc, VectorType::get({n}, elt), ptr, alignment);
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
    return forLoop(idx(lb), ub, inits, body);
  }
  SmallVector<Value>
  forLoop(Value lb, Value ub, ValueRange inits,
          function_ref<SmallVector<Value>(Value, ValueRange)> body) {
    auto op = scf::ForOp::create(b, loc, lb, ub, idx(1), inits);
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
  /// The walk over the experts of a kernel whose CTA owns rows [m0,
  /// tileEnd) of a grouped result: for each expert e (of `experts`, index)
  /// whose clamped rows [lo, hi) meet the tile (a CTA-uniform test),
  /// `body(e, lo, hi, carried)`; the others pass `carried` on. Returns the
  /// values after the last expert.
  SmallVector<Value> forEachExpertMeetingTile(
      Value experts, ValueRange inits, Value offsets, int64_t rows, Value m0,
      Value tileEnd,
      function_ref<SmallVector<Value>(Value, Value, Value, ValueRange)> body) {
    return forLoop(
        0, experts, inits,
        [&](Value e, ValueRange carried) -> SmallVector<Value> {
          // Clamped group bounds, as the reference computes them.
          Value lo, hi;
          std::tie(lo, hi) = groupRows(offsets, e, rows);
          Value meets =
              cmp(P::slt, maxS(lo, m0), minS(hi, tileEnd)); // CTA-uniform
          return ifElse(
              TypeRange(carried), meets,
              [&]() -> SmallVector<Value> { return body(e, lo, hi, carried); },
              [&]() -> SmallVector<Value> {
                return SmallVector<Value>(carried.begin(), carried.end());
              });
        });
  }
  /// Stores `values` (of one element type) to consecutive elements of the
  /// flat buffer `flatBuffer` from element `first`: vector stores of up to
  /// 16 bytes when `aligned` (the run's address; `base` is the buffer's),
  /// else one store an element. With `bits` (the values' bits, one integer
  /// each: 8-bit floats have no LLVM vector type), the vector stores store
  /// those.
  void storeRun(Value flatBuffer, Value base, Value first,
                ArrayRef<Value> values, Value aligned,
                ArrayRef<Value> bits = {}) {
    Type elt = values.front().getType();
    int64_t bytes = elt.getIntOrFloatBitWidth() / 8;
    int64_t per = std::min<int64_t>(int64_t(values.size()), 16 / bytes);
    auto store = scf::IfOp::create(b, loc, aligned, /*withElseRegion=*/true);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPoint(store.thenBlock()->getTerminator());
    for (int64_t s0 = 0; s0 < int64_t(values.size()); s0 += per) {
      Value v = vectorOf((bits.empty() ? values : bits).slice(s0, per));
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
        b, loc, VectorType::get({2}, b.getF16Type()), pair, /*relu=*/false, f8);
    SmallVector<Value> result;
    for (int64_t j = 0; j < 2; ++j) {
      Value half = LLVM::ExtractElementOp::create(b, loc, f16, int32(j));
      Value q = arith::ExtFOp::create(b, loc, b.getF32Type(), half);
      Value v = arith::MulFOp::create(b, loc, q, scales[j]);
      result.push_back(
          outElt.isF32()
              ? v
              : arith::TruncFOp::create(b, loc, outElt, v).getResult());
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
  std::pair<Value, SmallVector<Value>>
  mxEncode(ArrayRef<Value> values, Value amax, Type f8, ScaleMode mode) {
    MXFormat fmt = MXFormat::get(f8);
    Value byte = buildScaleByte(b, loc, amax, fmt, mode);
    Value inverse = buildInverseScale(b, loc, byte);
    auto pairI8 = VectorType::get({2}, b.getI8Type());
    SmallVector<Value> pairs;
    for (size_t i = 0; i + 1 < values.size(); i += 2)
      // The i16 holds `a` in its upper byte: element 0 of the pair is `b`.
      pairs.push_back(NVVM::ConvertF32x2ToF8x2Op::create(
          b, loc, pairI8, arith::MulFOp::create(b, loc, values[i + 1], inverse),
          arith::MulFOp::create(b, loc, values[i], inverse),
          NVVM::FPRoundingMode::RN, NVVM::SaturationMode::SATFINITE,
          /*relu=*/false, f8));
    return {byte, pairs};
  }
  /// The 4 x 4 bytes of `words` (4 x i32) transposed: byte i of result word
  /// j is byte j of word i.
  SmallVector<Value> transposeBytes4x4(ArrayRef<Value> words) {
    SmallVector<Value> result;
    for (int64_t j = 0; j < 4; ++j) {
      Value word;
      for (int64_t i = 0; i < 4; ++i) {
        Value byte = arith::AndIOp::create(
            b, loc, arith::ShRUIOp::create(b, loc, words[i], int32(8 * j)),
            int32(0xff));
        Value placed =
            i ? arith::ShLIOp::create(b, loc, byte, int32(8 * i)).getResult()
              : byte;
        word = i ? lor(word, placed) : placed;
      }
      result.push_back(word);
    }
    return result;
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

/// memory in bytes.
struct LaunchShape {
  int64_t gridX, gridY, gridZ, threads, smemBytes;
};

/// Tiles of `tile` covering `n`.
inline int64_t tilesOf(int64_t n, int64_t tile) {
  return (n + tile - 1) / tile;
}

/// A gpu.launch of `shape` (its body empty but for the terminator) that

/// A gpu.launch of `shape` (its body empty but for the terminator) that
/// outlining turns into the kernel `name` wherever the function holding it
/// is inlined.
gpu::LaunchOp createNamedLaunch(OpBuilder &b, Location loc,
                                const LaunchShape &shape, StringRef name);

/// The private function `name`: (tensors `argTypes`) -> `resultTypes`, whose
/// body takes its arguments as buffers (read only), allocates the results,
/// runs `host(b, buffers, outs)` (host code before the launch, optional),
/// then one gpu.launch of `shape` whose body `emit(b, launch, buffers, outs)`
/// writes, and returns the results; marked `moe.dedicated_kernel = what`.
/// An existing function of that name and type is reused.
func::FuncOp getOrCreateKernelCall(
    ModuleOp module, SymbolTable &symbols, StringRef name, StringRef what,
    ArrayRef<Type> argTypes, ArrayRef<RankedTensorType> resultTypes,
    Location loc, LaunchShape shape,
    function_ref<void(OpBuilder &, gpu::LaunchOp, ArrayRef<Value>,
                      ArrayRef<Value>)>
        emit,
    function_ref<void(OpBuilder &, ArrayRef<Value>, ArrayRef<Value>)> host =
        nullptr);

/// getOrCreateKernelCall for a kernel with one result.
func::FuncOp getOrCreateKernelCall(
    ModuleOp module, SymbolTable &symbols, StringRef name, StringRef what,
    ArrayRef<Type> argTypes, RankedTensorType resultType, Location loc,
    LaunchShape shape,
    function_ref<void(OpBuilder &, gpu::LaunchOp, ArrayRef<Value>, Value)> emit,
    function_ref<void(OpBuilder &, ArrayRef<Value>, ArrayRef<Value>)> host =
        nullptr);

/// Declares which arguments of a grouped kernel are rows read only inside the
/// groups of the offsets argument (see LiveRows.h): lets the rows past the
/// last group stay unspecified where they are computed.
func::FuncOp withGroupedArgs(func::FuncOp kernel, ArrayRef<unsigned> rows,
                             unsigned offsets);

/// The (data, scales) tensors of a block-scaled (MX or blockwise FP8) type;
/// null types for any other type.
std::pair<RankedTensorType, RankedTensorType> blockScaledParts(Type type);

/// The arguments of a grouped GEMM kernel on block-scaled (MX or blockwise
/// FP8) operands: (A data, A scales, B data, B scales, offsets).
SmallVector<Type> mxGemmArgTypes(GroupedMatmulOp op);

/// Replaces `op` (block-scaled lhs and rhs) by a call of `kernel` on their
/// data and scales (moe.mx_unpack) and the offsets.
void replaceByMXGemmCall(GroupedMatmulOp op, func::FuncOp kernel);

/// Replaces `op` by a call of `kernel` on its lhs, rhs and offsets.
void replaceByGemmCall(GroupedMatmulOp op, func::FuncOp kernel);

/// Registers memory-effect models for the NVVM ops the kernels use where
/// upstream declares none (the buffer deallocation rejects unknown effects).
void registerNVVMMemoryEffects(DialectRegistry &registry);

} // namespace mlir::moe::kernels

#endif
