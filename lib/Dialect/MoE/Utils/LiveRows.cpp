//===- LiveRows.cpp - which rows of an expert computation matter ----------===//

#include "moe/Dialect/MoE/Utils/LiveRows.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::moe;

DispatchOp LiveRows::dispatchOfOffsets(Value offsets) {
  auto d = offsets.getDefiningOp<DispatchOp>();
  return d && d.getOffsets() == offsets ? d : DispatchOp();
}

/// Whether an MX type's blocks stay inside rows [0, offsets[E]) of `d`:
/// blocks off the rows, or along the rows with every group padded to whole
/// blocks.
static bool blocksWithinRows(MXTensorType type, DispatchOp d) {
  return type.getAxis() != 0 || d.getPadTo() % type.getBlockSize() == 0;
}

DispatchOp LiveRows::boundOf(Value v) {
  if (auto it = cache.find(v); it != cache.end())
    return it->second;
  // A cycle (through a region) proves nothing.
  if (!visiting.insert(v).second)
    return {};
  DispatchOp d = compute(v);
  visiting.erase(v);
  cache[v] = d;
  return d;
}

DispatchOp LiveRows::compute(Value v) {
  auto shaped = dyn_cast<ShapedType>(v.getType());
  if (!shaped && !isa<MXTensorType>(v.getType()))
    return {};
  if (v.use_empty())
    return {};
  DispatchOp found;
  // Every use must bound v by the same dispatch.
  auto agree = [&](DispatchOp d) {
    if (!d || (found && found != d))
      return false;
    found = d;
    return true;
  };
  for (OpOperand &use : v.getUses()) {
    Operation *user = use.getOwner();
    unsigned i = use.getOperandNumber();
    bool ok =
        llvm::TypeSwitch<Operation *, bool>(user)
            // Groups of rows: reads rows inside [offsets[0], offsets[E]).
            .Case([&](GroupedMatmulOp op) {
              return i == 0 && agree(dispatchOfOffsets(op.getOffsets()));
            })
            .Case([&](GroupedMatmulWgradOp op) {
              return (i == 0 || i == 1) &&
                     agree(dispatchOfOffsets(op.getOffsets()));
            })
            .Case([&](GroupedMlpOp op) {
              return i == 0 && agree(dispatchOfOffsets(op.getOffsets()));
            })
            .Case([&](GroupedMlpBackwardOp op) {
              // With an f8 gemm_type the op quantizes x and dy in blocks of
              // 32 rows for the weight gradients.
              DispatchOp d = dispatchOfOffsets(op.getOffsets());
              std::optional<Type> gemm = op.getGemmType();
              bool rowBlocks =
                  gemm && isa<Float8E4M3FNType, Float8E5M2Type>(*gemm);
              return (i == 0 || i == 4) && d &&
                     (!rowBlocks || d.getPadTo() % 32 == 0) && agree(d);
            })
            .Case([&](ExpertsOp op) {
              return i == 0 && agree(dispatchOfOffsets(op.getOffsets()));
            })
            // Rows at the dispatch's positions, all inside its groups.
            .Case([&](CombineOp op) {
              auto d = op.getPositions().getDefiningOp<DispatchOp>();
              return i == 0 && d && d.getPositions() == op.getPositions() &&
                     agree(d);
            })
            // Row-local ops: row r of the result from row r of the operands.
            .Case<SwigluOp, SwigluGradOp>([&](Operation *op) {
              return agree(boundOf(op->getResult(0)));
            })
            .Case([&](QuantizeOp op) {
              DispatchOp d = boundOf(op.getResult());
              return d && blocksWithinRows(op.getType(), d) && agree(d);
            })
            .Case([&](DequantizeOp op) {
              DispatchOp d = boundOf(op.getResult());
              return d && blocksWithinRows(op.getInput().getType(), d) &&
                     agree(d);
            })
            .Case([&](MXUnpackOp op) {
              // Scales of row blocks have rows / block rows.
              if (op.getInput().getType().getAxis() == 0)
                return false;
              DispatchOp d = boundOf(op.getData());
              return d && d == boundOf(op.getScales()) && agree(d);
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
                  return agree(dispatchOfOffsets(call.getOperand(a)));
              return false;
            })
            .Default([](Operation *) { return false; });
    if (!ok)
      return {};
  }
  return found;
}

DispatchOp LiveRows::boundedOp(Operation *op) {
  DispatchOp d;
  if (auto dispatch = dyn_cast<DispatchOp>(op)) {
    d = boundOf(dispatch.getSorted());
    return d == dispatch ? d : DispatchOp();
  }
  if (isa<SwigluOp, SwigluGradOp>(op))
    d = boundOf(op->getResult(0));
  else if (auto q = dyn_cast<QuantizeOp>(op))
    d = q.getType().getAxis() != 0 ? boundOf(q.getResult()) : DispatchOp();
  else if (auto dq = dyn_cast<DequantizeOp>(op))
    d = dq.getInput().getType().getAxis() != 0 ? boundOf(dq.getResult())
                                               : DispatchOp();
  if (!d || !dominance.properlyDominates(d.getOperation(), op))
    return {};
  return d;
}
