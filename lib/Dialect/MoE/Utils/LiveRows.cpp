//===- LiveRows.cpp - which rows of an expert computation matter ----------===//

#include "moe/Dialect/MoE/Utils/LiveRows.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Bufferization/IR/Bufferization.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::moe;

RowBound LiveRows::groupsEnd(Value offsets) {
  auto type = dyn_cast<RankedTensorType>(offsets.getType());
  if (!type || type.getRank() != 1 || type.isDynamicDim(0))
    return {};
  if (auto s = offsets.getDefiningOp<SlotOffsetsOp>(); s && s.getPadTo() == 1)
    return RowBound{Value(), s.getCounts()};
  return RowBound{offsets, Value()};
}

int64_t LiveRows::groupPadding(Value offsets) {
  if (auto d = offsets.getDefiningOp<DispatchOp>();
      d && d.getOffsets() == offsets)
    return d.getPadTo();
  if (auto s = offsets.getDefiningOp<SlotOffsetsOp>())
    return s.getPadTo();
  return 1;
}

/// The rows of one scale block of a block-scaled `type` (MX blocks along
/// the rows, a blockwise FP8 tile's first size), 0 for other types.
static int64_t rowsPerBlock(Type type) {
  if (auto mx = dyn_cast<MXTensorType>(type))
    return mx.getAxis() == 0 ? mx.getBlockSize() : 1;
  if (auto fp8 = dyn_cast<FP8BlockTensorType>(type))
    return fp8.getBlock()[0];
  return 0;
}

/// Whether the scale blocks of a block-scaled `type` stay inside the rows
/// before bound `d`: blocks of one row, or of several with every group
/// padded to whole blocks.
static bool blocksWithinRows(Type type, RowBound d) {
  int64_t rows = rowsPerBlock(type);
  return rows == 1 || (rows > 1 && d.offsets &&
                       LiveRows::groupPadding(d.offsets) % rows == 0);
}

FailureOr<RowBound> LiveRows::boundOfExchangeBuffer(Operation *toBuffer) {
  RowBound found;
  // The buffer, cast to a dynamic shape, passed to runtime calls.
  for (Operation *cast : toBuffer->getResult(0).getUsers()) {
    if (!isa<memref::CastOp>(cast))
      return failure();
    for (OpOperand &use : cast->getResult(0).getUses()) {
      auto call = dyn_cast<func::CallOp>(use.getOwner());
      if (!call)
        return failure();
      auto callee = SymbolTable::lookupNearestSymbolFrom<func::FuncOp>(
          call, call.getCalleeAttr());
      unsigned i = use.getOperandNumber();
      if (!callee)
        return failure();
      if (callee.getArgAttr(i, kRowsUnreadAttr))
        continue;
      auto k = callee.getArgAttrOfType<IntegerAttr>(i, kRowsCountedByAttr);
      if (!k || k.getInt() < 0 || k.getInt() >= call.getNumOperands())
        return failure();
      // The counts as a tensor: the call reads a cast of the buffer of a
      // tensor, or of a buffer that became one (to_buffer(to_tensor(b))
      // folds to b).
      auto countsCast =
          call.getOperand(k.getInt()).getDefiningOp<memref::CastOp>();
      if (!countsCast)
        return failure();
      Value buffer = countsCast.getSource(), counts;
      if (auto tb = buffer.getDefiningOp<bufferization::ToBufferOp>())
        counts = tb.getTensor();
      else
        for (Operation *user : buffer.getUsers())
          if (auto tt = dyn_cast<bufferization::ToTensorOp>(user))
            counts = tt.getResult();
      if (!counts)
        return failure();
      RowBound b{Value(), counts};
      // Rows read by padded slot: the groups of the slot_offsets of these
      // counts with that padding and the call's number of ranks.
      if (auto m = call->getAttrOfType<IntegerAttr>(kRowsInSlotsPaddedToAttr)) {
        auto ranks = call.getNumOperands() > 4
                         ? call.getOperand(4).getDefiningOp<arith::ConstantOp>()
                         : arith::ConstantOp();
        auto ranksAttr =
            ranks ? dyn_cast<IntegerAttr>(ranks.getValue()) : IntegerAttr();
        b = RowBound();
        for (Operation *user : counts.getUsers())
          if (auto s = dyn_cast<SlotOffsetsOp>(user);
              s && ranksAttr && s.getPadTo() == m.getInt() &&
              s.getCounts().getType().getDimSize(0) ==
                  s.getNumSlots() * ranksAttr.getInt())
            b = groupsEnd(s.getOffsets());
        if (!b)
          return failure();
      }
      if (found && found != b)
        return failure();
      found = b;
    }
  }
  return found;
}

RowBound LiveRows::boundOf(Value v) {
  if (auto it = cache.find(v); it != cache.end())
    return it->second;
  // A cycle (through a region) proves nothing.
  if (!visiting.insert(v).second)
    return {};
  RowBound d = compute(v);
  visiting.erase(v);
  cache[v] = d;
  return d;
}

RowBound LiveRows::compute(Value v) {
  auto shaped = dyn_cast<ShapedType>(v.getType());
  if (!shaped && !isa<BlockScaledType>(v.getType()))
    return {};
  if (v.use_empty())
    return {};
  RowBound found;
  // Every use must bound v the same way.
  auto agree = [&](RowBound d) {
    if (!d || (found && found != d))
      return false;
    found = d;
    return true;
  };
  auto byGroups = [](Value offsets) { return groupsEnd(offsets); };
  for (OpOperand &use : v.getUses()) {
    Operation *user = use.getOwner();
    unsigned i = use.getOperandNumber();
    bool ok =
        llvm::TypeSwitch<Operation *, bool>(user)
            // Groups of rows: reads rows inside [offsets[0], offsets[E]).
            .Case([&](GroupedMatmulOp op) {
              return i == 0 && agree(byGroups(op.getOffsets()));
            })
            .Case([&](GroupedMatmulWgradOp op) {
              return (i == 0 || i == 1) && agree(byGroups(op.getOffsets()));
            })
            .Case([&](GroupedMlpOp op) {
              return i == 0 && agree(byGroups(op.getOffsets()));
            })
            .Case([&](GroupedMlpBackwardOp op) {
              // With an f8 gemm_type the op quantizes x and dy in blocks of
              // 32 rows for the weight gradients.
              std::optional<Type> gemm = op.getGemmType();
              bool rowBlocks =
                  gemm && isa<Float8E4M3FNType, Float8E5M2Type>(*gemm);
              return (i == 0 || i == 4) &&
                     (!rowBlocks || groupPadding(op.getOffsets()) % 32 == 0) &&
                     agree(byGroups(op.getOffsets()));
            })
            .Case([&](ExpertsOp op) {
              return i == 0 && agree(byGroups(op.getOffsets()));
            })
            // Rows at the dispatch's positions, all inside its groups.
            .Case([&](CombineOp op) {
              auto d = op.getPositions().getDefiningOp<DispatchOp>();
              return i == 0 && d && d.getPositions() == op.getPositions() &&
                     agree(byGroups(d.getOffsets()));
            })
            // Row-local ops: row r of the result from row r of the operands.
            .Case<SwigluOp, SwigluGradOp>(
                [&](Operation *op) { return agree(boundOf(op->getResult(0))); })
            // Blocks of several rows: all rows, unless every group is
            // padded to whole blocks (then the blocks past the last group
            // hold only rows nothing reads).
            .Case([&](QuantizeOp op) {
              RowBound d = boundOf(op.getResult());
              return d && blocksWithinRows(op.getType(), d) && agree(d);
            })
            .Case([&](DequantizeOp op) {
              RowBound d = boundOf(op.getResult());
              return d && blocksWithinRows(op.getInput().getType(), d) &&
                     agree(d);
            })
            .Case([&](MXUnpackOp op) {
              // Scales of row blocks have rows / block rows.
              if (rowsPerBlock(op.getInput().getType()) != 1)
                return false;
              RowBound d = boundOf(op.getData());
              return d && d == boundOf(op.getScales()) && agree(d);
            })
            // The buffer an exchange sends: its first sum(counts) rows.
            .Case([&](bufferization::ToBufferOp op) {
              FailureOr<RowBound> d = boundOfExchangeBuffer(op);
              // An empty bound: only calls that read nothing of it.
              return succeeded(d) && (!*d || agree(*d));
            })
            // Generated kernels declaring their grouped row arguments.
            .Case([&](func::CallOp call) {
              auto callee = SymbolTable::lookupNearestSymbolFrom<func::FuncOp>(
                  call, call.getCalleeAttr());
              if (!callee || callee.isExternal() ||
                  !callee.getArgAttr(i, kGroupRowsAttr))
                return false;
              for (unsigned a = 0; a < callee.getNumArguments(); ++a)
                if (callee.getArgAttr(a, kGroupOffsetsAttr))
                  return agree(byGroups(call.getOperand(a)));
              return false;
            })
            .Default([](Operation *) { return false; });
    if (!ok)
      return {};
  }
  return found;
}

RowBound LiveRows::boundedOp(Operation *op) {
  RowBound d;
  if (auto dispatch = dyn_cast<DispatchOp>(op)) {
    d = boundOf(dispatch.getSorted());
    return d && d == groupsEnd(dispatch.getOffsets()) ? d : RowBound();
  }
  if (isa<SwigluOp, SwigluGradOp, CombineOp>(op))
    d = boundOf(op->getResult(0));
  else if (auto q = dyn_cast<QuantizeOp>(op)) {
    d = rowsPerBlock(q.getType()) == 1 ? boundOf(q.getResult()) : RowBound();
  } else if (auto dq = dyn_cast<DequantizeOp>(op)) {
    d = rowsPerBlock(dq.getInput().getType()) == 1 ? boundOf(dq.getResult())
                                                   : RowBound();
  }
  if (!d)
    return {};
  bool available =
      dominance.properlyDominates(d.offsets ? d.offsets : d.counts, op);
  return available ? d : RowBound();
}
