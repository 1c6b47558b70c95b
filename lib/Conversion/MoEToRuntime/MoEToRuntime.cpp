//===- MoEToRuntime.cpp - collectives -> libmoert calls -------------------===//
//
// moe.all_to_all, shard.all_reduce and shard.process_linear_index over a 1-d
// shard.grid of more than one rank become calls into libmoert's
// communication layer (runtime/include/moert/Comm.h), at tensor level:
//
//   %r, %rc = moe.all_to_all %x, %c on @ep : tensor<32x64xf32>, tensor<8xi32>
//                                          -> tensor<64x64xf32>, tensor<8xi32>
// becomes
//   %xb = bufferization.to_buffer %x read_only : ... to memref<32x64xf32>
//   %cb = bufferization.to_buffer %c read_only : ... to memref<8xi32>
//   %rb = memref.alloc() : memref<64x64xf32>
//   %rcb = memref.alloc() : memref<8xi32>
//   call @moert_all_to_all_f32(<the four as memref<?x?xf32> / memref<?xi32>>,
//                              %c2_i64)                 // the grid's size
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

/// Ranks in the group `axes` of `grid` spans (all axes when `allIfEmpty` and
/// none are listed), or ShapedType::kDynamic.
int64_t groupSize(shard::GridOp grid, ArrayRef<int16_t> axes, bool allIfEmpty) {
  ArrayRef<int64_t> shape = grid.getShape();
  SmallVector<int64_t> list;
  if (axes.empty() && allIfEmpty)
    list = llvm::to_vector(llvm::seq<int64_t>(0, shape.size()));
  else
    for (int16_t a : axes)
      list.push_back(a);
  int64_t p = 1;
  for (int64_t a : list) {
    if (a < 0 || a >= int64_t(shape.size()) || ShapedType::isDynamic(shape[a]))
      return ShapedType::kDynamic;
    p *= shape[a];
  }
  return p;
}

/// The grids the runtime lowering supports: one axis of static size.
LogicalResult checkGrid(Operation *op, shard::GridOp grid) {
  if (grid.getRank() != 1)
    return op->emitOpError("runs over the ")
           << grid.getRank() << "-d grid @" << grid.getSymName()
           << "; -convert-moe-to-runtime lowers collectives over 1-d grids "
              "only (one communicator of all ranks, as -moe-expert-parallel "
              "makes)";
  if (ShapedType::isDynamic(grid.getShape()[0]))
    return op->emitOpError("runs over @")
           << grid.getSymName()
           << ", whose size is dynamic; -convert-moe-to-runtime needs the "
              "number of ranks at compile time";
  return success();
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

  LogicalResult lowerAllToAll(ModuleOp module, AllToAllOp op, int64_t p) {
    if (isa<MXTensorType>(op.getInput().getType())) {
      auto [data, scales] = splitMX(op);
      if (failed(lowerAllToAll(module, data, p)))
        return failure();
      return lowerAllToAll(module, scales, p);
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
    SmallVector<Type> argTypes = {rowsDyn, countsDyn, rowsDyn, countsDyn, i64};
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

    // With overlap, the exchange starts as soon as its operands are there
    // (and after the exchanges started before it: they keep their order).
    Block *block = op->getBlock();
    if (overlap) {
      Operation *last = lastStart.lookup(block);
      for (Value v : {Value(op.getInput()), Value(op.getSendCounts())}) {
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
    if (wide)
      counts = arith::TruncIOp::create(b, loc, counts32Type, counts);
    auto [inBuf, inDyn] = inputBuffer(b, loc, op.getInput());
    auto [countsBuf, countsDynV] = inputBuffer(b, loc, counts);
    Value outBuf = newBuffer(b, loc, resType, inBuf);
    Value recvBuf = newBuffer(b, loc, counts32Type, countsBuf);
    Value outDyn = memref::CastOp::create(b, loc, rowsDyn, outBuf);
    Value recvDyn = memref::CastOp::create(b, loc, countsDyn, recvBuf);
    SmallVector<Value> args = {inDyn, countsDynV, outDyn, recvDyn,
                               arith::ConstantIntOp::create(b, loc, p, 64)};
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
      // The rows are waited for where they are first needed. The input is
      // read again there (to_buffer), so that bufferization writes nothing
      // into its buffer while the rows travel; the wait checks that it is
      // the buffer the exchange started with. That read has a type of its
      // own (any strided layout: the buffer as it is), so that CSE cannot
      // merge it into the start's.
      b.setInsertionPoint(firstReaderInBlock(op.getResult(), block));
      Value again = bufferization::ToBufferOp::create(
          b, loc,
          anyLayout(
              MemRefType::get(inType.getShape(), inType.getElementType())),
          op.getInput(), /*read_only=*/true);
      Value againDyn =
          memref::CastOp::create(b, loc, anyLayout(rowsDyn), again);
      func::CallOp::create(b, loc, *waitFn,
                           ValueRange{call.getResult(0), againDyn, outDyn});
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
                               int64_t p) {
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
    FailureOr<Value> input =
        convertElements(b, loc, op.getInput(), resType.getElementType());
    if (failed(input))
      return op.emitOpError("converts ")
             << inType.getElementType() << " to " << resType.getElementType()
             << "; only float widening/narrowing, int to float and int "
                "widening/narrowing are supported";
    auto flatDyn =
        MemRefType::get({ShapedType::kDynamic}, resType.getElementType());
    auto fnType = FunctionType::get(&getContext(),
                                    {flatDyn, flatDyn, b.getI64Type()}, {});
    auto fn = declare(module, "moert_all_reduce_sum_" + dtype, fnType,
                      /*cInterface=*/true, loc);
    if (failed(fn))
      return failure();

    auto bufType =
        MemRefType::get(resType.getShape(), resType.getElementType());
    Value inBuf = bufferization::ToBufferOp::create(b, loc, bufType, *input,
                                                    /*read_only=*/true);
    Value outBuf = newBuffer(b, loc, resType, inBuf);
    // Both as one run of values.
    auto flat = [&](Value buf) -> Value {
      int64_t rank = resType.getRank();
      Value v = buf;
      if (rank == 0) {
        v = memref::ExpandShapeOp::create(
            b, loc, MemRefType::get({1}, resType.getElementType()), v,
            ArrayRef<ReassociationIndices>{},
            ArrayRef<OpFoldResult>{b.getIndexAttr(1)});
      } else if (rank > 1) {
        ReassociationIndices all = llvm::to_vector(llvm::seq<int64_t>(0, rank));
        v = memref::CollapseShapeOp::create(
            b, loc, v, ArrayRef<ReassociationIndices>{all});
      }
      return memref::CastOp::create(b, loc, flatDyn, v);
    };
    Value group = arith::ConstantIntOp::create(b, loc, p, 64);
    func::CallOp::create(b, loc, *fn,
                         ValueRange{flat(inBuf), flat(outBuf), group});
    op.getResult().replaceAllUsesWith(toTensor(b, loc, outBuf));
    op.erase();
    return success();
  }

  LogicalResult lowerProcessIndex(ModuleOp module,
                                  shard::ProcessLinearIndexOp op) {
    Location loc = op.getLoc();
    OpBuilder b(op);
    auto fn = declare(module, "moert_comm_rank",
                      FunctionType::get(&getContext(), {}, {b.getI32Type()}),
                      /*cInterface=*/false, loc);
    if (failed(fn))
      return failure();
    Value r = func::CallOp::create(b, loc, *fn, ValueRange{}).getResult(0);
    op.getResult().replaceAllUsesWith(
        arith::IndexCastOp::create(b, loc, b.getIndexType(), r).getResult());
    op.erase();
    return success();
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    lastStart.clear();
    SymbolTableCollection symbols;
    SmallVector<Operation *> ops;
    module.walk([&](Operation *op) {
      if (isa<AllToAllOp, shard::AllReduceOp, shard::ProcessLinearIndexOp>(op))
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
        int64_t p = groupSize(grid, a2a.getGridAxes(), /*allIfEmpty=*/true);
        if (p == 1)
          continue; // -convert-moe-to-linalg copies
        result = checkGrid(op, grid);
        if (succeeded(result))
          result = lowerAllToAll(module, a2a, p);
      } else if (auto reduce = dyn_cast<shard::AllReduceOp>(op)) {
        int64_t p = groupSize(grid, reduce.getGridAxes(), /*allIfEmpty=*/false);
        if (p == 1) {
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
        result = checkGrid(op, grid);
        if (succeeded(result))
          result = lowerAllReduce(module, reduce, p);
      } else {
        auto index = cast<shard::ProcessLinearIndexOp>(op);
        int64_t p = groupSize(grid, {}, /*allIfEmpty=*/true);
        if (p == 1) {
          OpBuilder b(op);
          index.getResult().replaceAllUsesWith(
              arith::ConstantIndexOp::create(b, op->getLoc(), 0).getResult());
          op->erase();
          continue;
        }
        result = checkGrid(op, grid);
        if (succeeded(result))
          result = lowerProcessIndex(module, index);
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
