//===- MoEToRuntime.cpp - collectives -> libmoert calls -------------------===//
//
// moe.all_to_all, shard.all_reduce and shard.process_linear_index /
// process_multi_index over a shard.grid of more than one rank become calls
// into libmoert's communication layer (runtime/include/moert/Comm.h), at
// tensor level:
//
//   %r, %rc = moe.all_to_all %x, %c on @ep : tensor<32x64xf32>, tensor<8xi32>
//                                          -> tensor<64x64xf32>, tensor<8xi32>
// becomes
//   %xb = bufferization.to_buffer %x read_only : ... to memref<32x64xf32>
//   %cb = bufferization.to_buffer %c read_only : ... to memref<8xi32>
//   %rb = memref.alloc() : memref<64x64xf32>
//   %rcb = memref.alloc() : memref<8xi32>
//   call @moert_all_to_all_f32(<the four as memref<?x?xf32> / memref<?xi32>>,
//                              %c2_i64, %c1_i64,   // 2 ranks 1 apart
//                              %c2_i64)            // of the grid's 2
//   %r = bufferization.to_tensor %rb restrict writable
//   %rc = bufferization.to_tensor %rcb restrict writable
//
// One-shot bufferization then passes the operands' buffers (copying only
// where their layout is not the identity) and owns the new buffers like any
// other allocation.
//
//===----------------------------------------------------------------------===//

#include "moe/Conversion/Passes.h"
#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Dialect/MoE/Utils/LiveRows.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Bufferization/IR/Bufferization.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/Support/InterleavedRange.h"

namespace mlir::moe {
#define GEN_PASS_DEF_CONVERTMOETORUNTIME
#include "moe/Conversion/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

namespace {

/// The runtime's name for an element type, or "" if it has no entry point.
std::string typeName(Type t) {
  if (t.isF32())
    return "f32";
  if (t.isF64())
    return "f64";
  if (t.isBF16())
    return "bf16";
  if (t.isF16())
    return "f16";
  if (t.isInteger(32))
    return "i32";
  if (t.isInteger(64))
    return "i64";
  return "";
}

/// The ranks a collective over `axes` of `grid` runs among (all axes when
/// `allIfEmpty` and none are listed): `size` ranks `stride` apart (the
/// runtime's comm::group), of the grid's `total`. Ranks are the grid's
/// row-major linear indices, so an axis, or a run of adjacent axes, is such
/// a group; other sets of axes, and dynamic sizes, are errors.
struct GroupShape {
  int64_t size = 1, stride = 1, total = 1;
};

FailureOr<GroupShape> groupShape(Operation *op, shard::GridOp grid,
                                 ArrayRef<int16_t> axes, bool allIfEmpty) {
  ArrayRef<int64_t> shape = grid.getShape();
  SmallVector<int64_t> list;
  if (axes.empty() && allIfEmpty)
    list = llvm::to_vector(llvm::seq<int64_t>(0, shape.size()));
  else
    for (int16_t a : axes)
      list.push_back(a);
  auto dynamic = [&]() {
    return op->emitOpError("runs over @")
           << grid.getSymName()
           << ", whose size is dynamic; -convert-moe-to-runtime needs the "
              "number of ranks at compile time";
  };
  GroupShape g;
  for (int64_t a : list) {
    if (a < 0 || a >= int64_t(shape.size()))
      return op->emitOpError("names axis ") << a << " of the " << shape.size()
                                            << "-d grid @" << grid.getSymName();
    if (ShapedType::isDynamic(shape[a]))
      return dynamic();
    g.size *= shape[a];
  }
  if (g.size == 1)
    return g; // one rank: no group to find
  for (auto [i, a] : llvm::enumerate(list))
    if (i > 0 && a != list[i - 1] + 1)
      return op->emitOpError("runs over axes ")
             << llvm::interleaved_array(list) << " of @" << grid.getSymName()
             << "; -convert-moe-to-runtime lowers collectives over one axis "
                "or adjacent axes, in order (a group of ranks evenly apart)";
  for (auto [a, n] : llvm::enumerate(shape)) {
    if (ShapedType::isDynamic(n))
      return dynamic();
    g.total *= n;
    if (int64_t(a) > list.back())
      g.stride *= n;
  }
  return g;
}

struct ConvertMoEToRuntimePass
    : moe::impl::ConvertMoEToRuntimeBase<ConvertMoEToRuntimePass> {
  using ConvertMoEToRuntimeBase::ConvertMoEToRuntimeBase;

  /// The last exchange started in each block so far.
  llvm::DenseMap<Block *, Operation *> lastStart;

  /// `@name` declared with `type` (created on first use); an existing
  /// symbol of another type is an error.
  FailureOr<func::FuncOp> declare(ModuleOp module, StringRef name,
                                  FunctionType type, bool cInterface,
                                  Location loc) {
    SymbolTable symbols(module);
    if (auto f = symbols.lookup<func::FuncOp>(name)) {
      if (f.getFunctionType() != type)
        return f.emitError("@")
               << name << " is declared as " << f.getFunctionType()
               << ", but the communication runtime's entry point is " << type;
      return f;
    }
    if (symbols.lookup(name))
      return module.emitError("@")
             << name
             << " names something other than a function; it is the "
                "communication runtime's entry point";
    OpBuilder b = OpBuilder::atBlockEnd(module.getBody());
    auto f = func::FuncOp::create(b, loc, name, type);
    f.setPrivate();
    if (cInterface)
      f->setAttr(LLVM::LLVMDialect::getEmitCWrapperAttrName(), b.getUnitAttr());
    return f;
  }

  /// `t` with a fully dynamic strided layout (any offset and strides).
  static MemRefType anyLayout(MemRefType t) {
    SmallVector<int64_t> strides(t.getRank(), ShapedType::kDynamic);
    return MemRefType::get(
        t.getShape(), t.getElementType(),
        StridedLayoutAttr::get(t.getContext(), ShapedType::kDynamic, strides));
  }

  /// A dynamically shaped identity-layout buffer of `t`'s element type.
  static MemRefType dynamicBuffer(RankedTensorType t) {
    return MemRefType::get(
        SmallVector<int64_t>(t.getRank(), ShapedType::kDynamic),
        t.getElementType());
  }

  /// The buffer of `tensor` (read only), cast to a dynamic shape.
  static std::pair<Value, Value> inputBuffer(OpBuilder &b, Location loc,
                                             Value tensor) {
    auto t = cast<RankedTensorType>(tensor.getType());
    Value buf = bufferization::ToBufferOp::create(
        b, loc, MemRefType::get(t.getShape(), t.getElementType()), tensor,
        /*read_only=*/true);
    return {buf, memref::CastOp::create(b, loc, dynamicBuffer(t), buf)};
  }

  /// A new buffer shaped like `t` (dynamic sizes from `like`).
  static Value newBuffer(OpBuilder &b, Location loc, RankedTensorType t,
                         Value like) {
    SmallVector<Value> dyn;
    for (int64_t i = 0; i < t.getRank(); ++i)
      if (t.isDynamicDim(i))
        dyn.push_back(memref::DimOp::create(b, loc, like, i));
    return memref::AllocOp::create(
        b, loc, MemRefType::get(t.getShape(), t.getElementType()), dyn);
  }

  static Value toTensor(OpBuilder &b, Location loc, Value buf) {
    auto m = cast<MemRefType>(buf.getType());
    return bufferization::ToTensorOp::create(
        b, loc, RankedTensorType::get(m.getShape(), m.getElementType()), buf,
        b.getUnitAttr(), b.getUnitAttr());
  }

  /// Puts `b` where a started collective of `operands` goes: after their
  /// definitions in `block` and after the collectives started before it in
  /// program order (they keep their order).
  void setStartPoint(OpBuilder &b, Block *block, ValueRange operands) {
    Operation *last = lastStart.lookup(block);
    for (Value v : operands) {
      Operation *def = v.getDefiningOp();
      if (def && def->getBlock() == block &&
          (!last || last->isBeforeInBlock(def)))
        last = def;
    }
    if (last)
      b.setInsertionPointAfter(last);
    else
      b.setInsertionPointToStart(block);
  }

  /// The wait of a started collective, before `at`: `handle`, the input
  /// tensor read again and the result buffer (dynamic sizes). The input is
  /// read again (to_buffer) so that bufferization writes nothing into its
  /// buffer while the collective runs; the wait checks that it is the
  /// buffer the start was given. That read has a type of its own (any
  /// strided layout: the buffer as it is), so that CSE cannot merge it into
  /// the start's. Leaves `b` before `at`.
  static void emitWait(OpBuilder &b, Location loc, func::FuncOp wait,
                       Value handle, Value input, Value resultDyn,
                       Operation *at) {
    b.setInsertionPoint(at);
    auto t = cast<RankedTensorType>(input.getType());
    Value again = bufferization::ToBufferOp::create(
        b, loc, anyLayout(MemRefType::get(t.getShape(), t.getElementType())),
        input, /*read_only=*/true);
    Value againDyn = memref::CastOp::create(
        b, loc, anyLayout(cast<MemRefType>(resultDyn.getType())), again);
    func::CallOp::create(b, loc, wait, ValueRange{handle, againDyn, resultDyn});
  }

  /// The first op of `block` that reads `v` (itself or inside its regions),
  /// or the terminator.
  static Operation *firstReaderInBlock(Value v, Block *block) {
    Operation *first = block->getTerminator();
    for (Operation *user : v.getUsers())
      if (Operation *at = block->findAncestorOpInBlock(*user);
          at && at->isBeforeInBlock(first))
        first = at;
    return first;
  }

  /// An exchange of MX rows as two exchanges with the same counts: the data
  /// rows and the scale rows. The parts are split off where the rows are
  /// made and put together where they are first used, so that a started
  /// exchange still runs until then.
  static std::pair<AllToAllOp, AllToAllOp> splitMX(AllToAllOp op) {
    Location loc = op.getLoc();
    auto in = cast<MXTensorType>(op.getInput().getType());
    auto out = cast<MXTensorType>(op.getResult().getType());
    OpBuilder b(op);
    b.setInsertionPointAfterValue(op.getInput());
    auto unpack = MXUnpackOp::create(b, loc, in.getDataType(),
                                     in.getScalesType(), op.getInput());
    b.setInsertionPoint(op);
    Type counts = op.getRecvCounts().getType();
    auto data =
        AllToAllOp::create(b, loc, TypeRange{out.getDataType(), counts},
                           ValueRange{unpack.getData(), op.getSendCounts()},
                           op->getAttrDictionary().getValue());
    auto scales =
        AllToAllOp::create(b, loc, TypeRange{out.getScalesType(), counts},
                           ValueRange{unpack.getScales(), op.getSendCounts()},
                           op->getAttrDictionary().getValue());
    b.setInsertionPoint(firstReaderInBlock(op.getResult(), op->getBlock()));
    Value rows =
        MXPackOp::create(b, loc, out, data.getResult(), scales.getResult());
    op.getResult().replaceAllUsesWith(rows);
    op.getRecvCounts().replaceAllUsesWith(data.getRecvCounts());
    op.erase();
    return {data, scales};
  }

  LogicalResult lowerAllToAll(ModuleOp module, AllToAllOp op, GroupShape g) {
    if (isa<MXTensorType>(op.getInput().getType())) {
      auto [data, scales] = splitMX(op);
      if (failed(lowerAllToAll(module, data, g)))
        return failure();
      return lowerAllToAll(module, scales, g);
    }
    Location loc = op.getLoc();
    OpBuilder b(op);
    auto inType = cast<RankedTensorType>(op.getInput().getType());
    auto resType = cast<RankedTensorType>(op.getResult().getType());
    std::string dtype = typeName(inType.getElementType());
    // 8-bit values (an MX tensor's data or scales) travel as bytes.
    Type elt = inType.getElementType();
    if (isa<Float8E4M3FNType>(elt))
      dtype = "f8e4m3fn";
    else if (isa<Float8E5M2Type>(elt))
      dtype = "f8e5m2";
    else if (isa<Float8E8M0FNUType>(elt))
      dtype = "f8e8m0fnu";
    else if (dtype != "f32" && dtype != "bf16" && dtype != "f16")
      return op.emitOpError("exchanges ")
             << elt
             << " rows; the communication runtime has f32, bf16, f16 and the "
                "8-bit types of MX tensors";
    if (resType.isDynamicDim(0))
      return op.emitOpError("has a dynamic result row count; the "
                            "communication runtime needs a static one (the "
                            "most rows this rank can receive)");
    auto countsType = op.getSendCounts().getType();
    if (countsType.isDynamicDim(0))
      return op.emitOpError("has a dynamic number of send counts");
    Type i32 = b.getI32Type();
    Value counts = op.getSendCounts();
    bool wide = !countsType.getElementType().isInteger(32);
    auto counts32Type = RankedTensorType::get(countsType.getShape(), i32);

    auto rowsDyn = MemRefType::get({ShapedType::kDynamic, ShapedType::kDynamic},
                                   inType.getElementType());
    auto countsDyn = MemRefType::get({ShapedType::kDynamic}, i32);
    Type i64 = b.getI64Type();
    TypeRange startResults;
    if (overlap)
      startResults = TypeRange(i64);
    // A slot-major side: the `slots` entry points, which take the layout
    // (bit 0: input, bit 1: result) and the slots' padding.
    int64_t layout =
        (op.getSlotMajorInput() ? 1 : 0) | (op.getSlotMajorResult() ? 2 : 0);
    SmallVector<Type> argTypes = {rowsDyn, countsDyn, rowsDyn, countsDyn,
                                  i64,     i64,       i64};
    if (layout)
      argTypes.append({i64, i64});
    auto fnType = FunctionType::get(&getContext(), argTypes, startResults);
    std::string entry = std::string("moert_all_to_all_") +
                        (layout ? "slots_" : "") + (overlap ? "start_" : "") +
                        dtype;
    auto fn = declare(module, entry, fnType, /*cInterface=*/true, loc);
    if (failed(fn))
      return failure();
    // The exchange reads the first sum(counts) rows of its input (argument
    // 1 holds the counts): what the live-rows analysis needs to know. A call
    // reading by padded slot says so itself (the declaration is shared by
    // every layout): below.
    (*fn).setArgAttr(0, kRowsCountedByAttr, b.getI64IntegerAttr(1));
    FailureOr<func::FuncOp> waitFn;
    if (overlap) {
      waitFn =
          declare(module, "moert_all_to_all_wait_" + dtype,
                  FunctionType::get(&getContext(),
                                    {i64, anyLayout(rowsDyn), rowsDyn}, {}),
                  /*cInterface=*/true, loc);
      if (failed(waitFn))
        return failure();
      // The wait only checks the input's address.
      (*waitFn).setArgAttr(1, kRowsUnreadAttr, b.getUnitAttr());
    }

    // With overlap, the exchange starts as soon as its operands are there.
    Block *block = op->getBlock();
    if (overlap)
      setStartPoint(b, block, {op.getInput(), op.getSendCounts()});
    if (wide)
      counts = arith::TruncIOp::create(b, loc, counts32Type, counts);
    auto [inBuf, inDyn] = inputBuffer(b, loc, op.getInput());
    auto [countsBuf, countsDynV] = inputBuffer(b, loc, counts);
    Value outBuf = newBuffer(b, loc, resType, inBuf);
    Value recvBuf = newBuffer(b, loc, counts32Type, countsBuf);
    Value outDyn = memref::CastOp::create(b, loc, rowsDyn, outBuf);
    Value recvDyn = memref::CastOp::create(b, loc, countsDyn, recvBuf);
    SmallVector<Value> args = {inDyn, countsDynV, outDyn, recvDyn};
    for (int64_t v : {g.size, g.stride, g.total})
      args.push_back(arith::ConstantIntOp::create(b, loc, v, 64));
    if (layout) {
      args.push_back(arith::ConstantIntOp::create(b, loc, layout, 64));
      args.push_back(arith::ConstantIntOp::create(b, loc, op.getPadTo(), 64));
    }
    auto call = func::CallOp::create(b, loc, *fn, args);
    if (op.getSlotMajorInput() && op.getPadTo() > 1)
      call->setAttr(kRowsInSlotsPaddedToAttr,
                    b.getI64IntegerAttr(op.getPadTo()));
    lastStart[block] = call;
    // The received counts are there when the call returns.
    Value recv = toTensor(b, loc, recvBuf);
    if (wide)
      recv = arith::ExtSIOp::create(b, loc, countsType, recv);
    op.getRecvCounts().replaceAllUsesWith(recv);
    if (overlap) {
      // The rows are waited for where they are first needed.
      emitWait(b, loc, *waitFn, call.getResult(0), op.getInput(), outDyn,
               firstReaderInBlock(op.getResult(), block));
    }
    op.getResult().replaceAllUsesWith(toTensor(b, loc, outBuf));
    op.erase();
    return success();
  }

  /// `value` (a tensor) with its elements converted to `elt`.
  static FailureOr<Value> convertElements(OpBuilder &b, Location loc,
                                          Value value, Type elt) {
    auto t = cast<RankedTensorType>(value.getType());
    Type from = t.getElementType();
    if (from == elt)
      return value;
    auto to = t.clone(elt);
    if (isa<FloatType>(from) && isa<FloatType>(elt))
      return from.getIntOrFloatBitWidth() < elt.getIntOrFloatBitWidth()
                 ? Value(arith::ExtFOp::create(b, loc, to, value))
                 : Value(arith::TruncFOp::create(b, loc, to, value));
    if (isa<IntegerType>(from) && isa<FloatType>(elt))
      return Value(arith::SIToFPOp::create(b, loc, to, value));
    if (isa<IntegerType>(from) && isa<IntegerType>(elt))
      return from.getIntOrFloatBitWidth() < elt.getIntOrFloatBitWidth()
                 ? Value(arith::ExtSIOp::create(b, loc, to, value))
                 : Value(arith::TruncIOp::create(b, loc, to, value));
    return failure();
  }

  LogicalResult lowerAllReduce(ModuleOp module, shard::AllReduceOp op,
                               GroupShape g) {
    Location loc = op.getLoc();
    OpBuilder b(op);
    auto inType = dyn_cast<RankedTensorType>(op.getInput().getType());
    auto resType = dyn_cast<RankedTensorType>(op.getResult().getType());
    if (!inType || !resType)
      return op.emitOpError("on buffers; -convert-moe-to-runtime lowers the "
                            "tensor form (run it before bufferization)");
    if (op.getReduction() != shard::ReductionKind::Sum)
      return op.emitOpError("reduces with '")
             << shard::stringifyReductionKind(op.getReduction())
             << "'; the communication runtime sums";
    std::string dtype = typeName(resType.getElementType());
    if (dtype.empty())
      return op.emitOpError("sums ")
             << resType.getElementType()
             << " values; the communication runtime has f32, f64, bf16, f16, "
                "i32 and i64";
    Type elt = resType.getElementType();
    Type i64 = b.getI64Type();
    auto flatDyn = MemRefType::get({ShapedType::kDynamic}, elt);
    std::string entry =
        "moert_all_reduce_sum_" + std::string(overlap ? "start_" : "") + dtype;
    auto fn = declare(module, entry,
                      FunctionType::get(&getContext(),
                                        {flatDyn, flatDyn, i64, i64, i64},
                                        overlap ? TypeRange(i64) : TypeRange()),
                      /*cInterface=*/true, loc);
    if (failed(fn))
      return failure();
    FailureOr<func::FuncOp> waitFn;
    if (overlap) {
      waitFn =
          declare(module, "moert_all_reduce_sum_wait_" + dtype,
                  FunctionType::get(&getContext(),
                                    {i64, anyLayout(flatDyn), flatDyn}, {}),
                  /*cInterface=*/true, loc);
      if (failed(waitFn))
        return failure();
    }

    // With overlap, the sum starts as soon as its input is there.
    Block *block = op->getBlock();
    if (overlap)
      setStartPoint(b, block, {op.getInput()});
    FailureOr<Value> input = convertElements(b, loc, op.getInput(), elt);
    if (failed(input))
      return op.emitOpError("converts ")
             << inType.getElementType() << " to " << elt
             << "; only float widening/narrowing, int to float and int "
                "widening/narrowing are supported";
    // Both as one run of values: the tensors flattened (views once
    // bufferized).
    int64_t rank = resType.getRank(), n = resType.getNumElements();
    auto flatType = RankedTensorType::get({n}, elt);
    ReassociationIndices all = llvm::to_vector(llvm::seq<int64_t>(0, rank));
    SmallVector<ReassociationIndices> groups;
    if (rank > 0)
      groups.push_back(all);
    Value flatIn = *input;
    if (rank == 0)
      flatIn = tensor::ExpandShapeOp::create(
          b, loc, flatType, flatIn, groups,
          ArrayRef<OpFoldResult>{b.getIndexAttr(1)});
    else if (rank > 1)
      flatIn = tensor::CollapseShapeOp::create(b, loc, flatIn, groups);
    auto [inBuf, inDyn] = inputBuffer(b, loc, flatIn);
    Value outBuf = newBuffer(b, loc, flatType, inBuf);
    Value outDyn = memref::CastOp::create(b, loc, flatDyn, outBuf);
    SmallVector<Value> args = {inDyn, outDyn};
    for (int64_t v : {g.size, g.stride, g.total})
      args.push_back(arith::ConstantIntOp::create(b, loc, v, 64));
    auto call = func::CallOp::create(b, loc, *fn, args);
    if (overlap) {
      lastStart[block] = call;
      // The sums are waited for where they are first needed.
      emitWait(b, loc, *waitFn, call.getResult(0), flatIn, outDyn,
               firstReaderInBlock(op.getResult(), block));
    }
    Value result = toTensor(b, loc, outBuf);
    if (rank == 0)
      result = tensor::CollapseShapeOp::create(b, loc, resType, result, groups);
    else if (rank > 1)
      result = tensor::ExpandShapeOp::create(b, loc, resType, result, groups);
    op.getResult().replaceAllUsesWith(result);
    op.erase();
    return success();
  }

  /// This process's rank (its linear index in every grid), as an index.
  FailureOr<Value> rank(ModuleOp module, OpBuilder &b, Location loc) {
    auto fn = declare(module, "moert_comm_rank",
                      FunctionType::get(&getContext(), {}, {b.getI32Type()}),
                      /*cInterface=*/false, loc);
    if (failed(fn))
      return failure();
    Value r = func::CallOp::create(b, loc, *fn, ValueRange{}).getResult(0);
    return arith::IndexCastOp::create(b, loc, b.getIndexType(), r).getResult();
  }

  /// shard.process_multi_index: each axis' coordinate of the rank, (rank /
  /// the later axes' product) mod the axis' size.
  LogicalResult lowerMultiIndex(ModuleOp module, shard::ProcessMultiIndexOp op,
                                shard::GridOp grid) {
    Location loc = op.getLoc();
    OpBuilder b(op);
    ArrayRef<int64_t> shape = grid.getShape();
    SmallVector<int64_t> axes;
    if (op.getAxes().empty())
      axes = llvm::to_vector(llvm::seq<int64_t>(0, shape.size()));
    else
      for (int16_t a : op.getAxes())
        axes.push_back(a);
    Value r;
    for (auto [i, a] : llvm::enumerate(axes)) {
      FailureOr<GroupShape> g = groupShape(
          op, grid, ArrayRef<int16_t>{int16_t(a)}, /*allIfEmpty=*/false);
      if (failed(g))
        return failure();
      Value coordinate;
      if (g->size == 1) {
        coordinate = arith::ConstantIndexOp::create(b, loc, 0);
      } else {
        if (!r) {
          FailureOr<Value> made = rank(module, b, loc);
          if (failed(made))
            return failure();
          r = *made;
        }
        coordinate = arith::RemUIOp::create(
            b, loc,
            arith::DivUIOp::create(
                b, loc, r, arith::ConstantIndexOp::create(b, loc, g->stride)),
            arith::ConstantIndexOp::create(b, loc, g->size));
      }
      op.getResult()[i].replaceAllUsesWith(coordinate);
    }
    op.erase();
    return success();
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    lastStart.clear();
    SymbolTableCollection symbols;
    SmallVector<Operation *> ops;
    module.walk([&](Operation *op) {
      if (isa<AllToAllOp, shard::AllReduceOp, shard::ProcessLinearIndexOp,
              shard::ProcessMultiIndexOp>(op))
        ops.push_back(op);
    });
    llvm::SetVector<Operation *> grids;
    for (Operation *op : ops) {
      auto gridAttr = op->getAttrOfType<FlatSymbolRefAttr>("grid");
      auto grid = gridAttr ? shard::getGridOrNull(op, gridAttr, symbols)
                           : shard::GridOp();
      if (!grid) {
        op->emitOpError("refers to no shard.grid");
        return signalPassFailure();
      }
      grids.insert(grid);
      LogicalResult result = success();
      if (auto a2a = dyn_cast<AllToAllOp>(op)) {
        FailureOr<GroupShape> g =
            groupShape(op, grid, a2a.getGridAxes(), /*allIfEmpty=*/true);
        if (failed(g))
          return signalPassFailure();
        if (g->size == 1)
          continue; // -convert-moe-to-linalg copies
        result = lowerAllToAll(module, a2a, *g);
      } else if (auto reduce = dyn_cast<shard::AllReduceOp>(op)) {
        FailureOr<GroupShape> g =
            groupShape(op, grid, reduce.getGridAxes(), /*allIfEmpty=*/false);
        if (failed(g))
          return signalPassFailure();
        if (g->size == 1) {
          // Nothing to sum with: the input, in the result's element type.
          OpBuilder b(op);
          auto resType = dyn_cast<RankedTensorType>(reduce.getType());
          FailureOr<Value> v =
              resType ? convertElements(b, op->getLoc(), reduce.getInput(),
                                        resType.getElementType())
                      : FailureOr<Value>(failure());
          if (failed(v) || (*v).getType() != reduce.getType()) {
            op->emitOpError("over one rank could not be replaced by its input");
            return signalPassFailure();
          }
          reduce.getResult().replaceAllUsesWith(*v);
          op->erase();
          continue;
        }
        result = lowerAllReduce(module, reduce, *g);
      } else if (auto multi = dyn_cast<shard::ProcessMultiIndexOp>(op)) {
        result = lowerMultiIndex(module, multi, grid);
      } else {
        auto index = cast<shard::ProcessLinearIndexOp>(op);
        FailureOr<GroupShape> g = groupShape(op, grid, {}, /*allIfEmpty=*/true);
        if (failed(g))
          return signalPassFailure();
        OpBuilder b(op);
        FailureOr<Value> r =
            g->size == 1 ? FailureOr<Value>(arith::ConstantIndexOp::create(
                                                b, op->getLoc(), 0)
                                                .getResult())
                         : rank(module, b, op->getLoc());
        if (failed(r))
          return signalPassFailure();
        index.getResult().replaceAllUsesWith(*r);
        op->erase();
      }
      if (failed(result))
        return signalPassFailure();
    }
    // Grids nothing refers to any more (the shard dialect has no lowering).
    for (Operation *grid : grids)
      if (SymbolTable::symbolKnownUseEmpty(grid, module))
        grid->erase();
  }
};

} // namespace
