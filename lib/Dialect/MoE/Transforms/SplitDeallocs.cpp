//===- SplitDeallocs.cpp - free distinct allocations on their own ---------===//
//
// Ownership-based deallocation ends each block with one bufferization.dealloc
// of every buffer the block allocated, retaining the values it returns. A
// buffer that no other operand of that dealloc can alias is freed on its own,
// under its own condition, and adds nothing to the retained values' ownership.
// Upstream's simplification finds this by asking alias analysis about every
// pair of operands: quadratic in the operands, and a train step's dealloc has
// thousands (tens of seconds for a 48-layer model). Here an operand is split
// off when the buffer it views is an allocation that no other operand views;
// operands whose buffer is unknown leave their dealloc to the simplification.
//
//===----------------------------------------------------------------------===//

#include "moe/Dialect/MoE/Transforms/Passes.h"
#include "moe/Dialect/MoE/Utils/BufferOrigin.h"

#include "mlir/Dialect/Bufferization/IR/Bufferization.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOESPLITDEALLOCS
#include "moe/Dialect/MoE/Transforms/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;

namespace {

struct SplitDeallocsPass : moe::impl::MoESplitDeallocsBase<SplitDeallocsPass> {
  void runOnOperation() override {
    SmallVector<bufferization::DeallocOp> deallocs;
    getOperation().walk(
        [&](bufferization::DeallocOp op) { deallocs.push_back(op); });
    for (bufferization::DeallocOp dealloc : deallocs)
      split(dealloc);
  }

  static void split(bufferization::DeallocOp dealloc) {
    // The buffer of each operand, memrefs first, and how many operands
    // view each. An unknown buffer may alias any of them, and so may a
    // block argument other than the function's (a loop's iteration
    // argument, a successor's operand).
    SmallVector<Value> buffers;
    DenseMap<Value, unsigned> viewers;
    for (ValueRange values : {dealloc.getMemrefs(), dealloc.getRetained()})
      for (Value value : values) {
        Value buffer = moe::viewedBuffer(value);
        if (!buffer)
          return;
        if (auto arg = dyn_cast<BlockArgument>(buffer))
          if (!arg.getOwner()->isEntryBlock() ||
              !isa<func::FuncOp>(arg.getOwner()->getParentOp()))
            return;
        buffers.push_back(buffer);
        ++viewers[buffer];
      }
    SmallVector<Value> keptMemrefs, keptConditions;
    OpBuilder builder(dealloc);
    for (auto [i, memref, condition] :
         llvm::enumerate(dealloc.getMemrefs(), dealloc.getConditions())) {
      // An allocation (not an argument, which may alias other arguments)
      // that is this operand's alone.
      if (buffers[i].getDefiningOp() && viewers[buffers[i]] == 1) {
        bufferization::DeallocOp::create(builder, dealloc.getLoc(), memref,
                                         condition, ValueRange());
        continue;
      }
      keptMemrefs.push_back(memref);
      keptConditions.push_back(condition);
    }
    dealloc.getMemrefsMutable().assign(keptMemrefs);
    dealloc.getConditionsMutable().assign(keptConditions);
  }
};

} // namespace
