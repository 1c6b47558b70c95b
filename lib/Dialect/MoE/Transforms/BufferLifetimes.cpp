//===- BufferLifetimes.cpp - allocate at first use, free after last -------===//
//
// Bufferization allocates where a tensor was created and ownership-based
// deallocation frees at the end of the allocating block. This pass moves each
// allocation down to its first use and each dealloc up to just after the last
// op of the block that can reach the buffer (see -moe-buffer-lifetimes in
// Passes.td for what "reach" means).
//
//===----------------------------------------------------------------------===//

#include "moe/Dialect/MoE/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mlir/Interfaces/ViewLikeInterface.h"
#include "llvm/ADT/DenseSet.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEBUFFERLIFETIMES
#include "moe/Dialect/MoE/Transforms/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;

namespace {

/// The allocation `value` is, or is a view of (through view-like ops and
/// memref.extract_strided_metadata's base buffer); null when it is neither.
Value allocationOf(Value value) {
  while (Operation *def = value.getDefiningOp()) {
    if (auto view = dyn_cast<ViewLikeOpInterface>(def)) {
      value = view.getViewSource();
      continue;
    }
    if (auto metadata = dyn_cast<memref::ExtractStridedMetadataOp>(def)) {
      if (value != metadata.getBaseBuffer())
        return {};
      value = metadata.getSource();
      continue;
    }
    if (hasEffect<MemoryEffects::Allocate>(def, value))
      return value;
    return {};
  }
  return {};
}

/// The last op of `block` that reaches `buffer` (uses it or a value computed
/// from it, at any depth), ignoring `except`. Fails when something reaches it
/// outside `block`; null when nothing reaches it.
FailureOr<Operation *> lastReach(Value buffer, Block *block,
                                 Operation *except) {
  SmallVector<Value> work{buffer};
  llvm::DenseSet<Value> seen{buffer};
  Operation *last = nullptr;
  while (!work.empty()) {
    Value value = work.pop_back_val();
    for (OpOperand &use : value.getUses()) {
      Operation *user = use.getOwner();
      if (user == except)
        continue;
      Operation *at = block->findAncestorOpInBlock(*user);
      if (!at)
        return failure();
      if (!last || last->isBeforeInBlock(at))
        last = at;
      // What is computed inside `at` leaves it only through its results.
      // (Loaded elements too: the GPU lowering moves a host-level load of a
      // count into every kernel whose bounds use it, where it reads the
      // buffer again.)
      for (Value result : at->getResults())
        if (seen.insert(result).second)
          work.push_back(result);
    }
  }
  return last;
}

/// The first op of `block` that uses `buffer` (directly: whatever is
/// computed from it comes later), or null.
Operation *firstUse(Value buffer, Block *block) {
  Operation *first = nullptr;
  for (Operation *user : buffer.getUsers()) {
    Operation *at = block->findAncestorOpInBlock(*user);
    if (at && (!first || at->isBeforeInBlock(first)))
      first = at;
  }
  return first;
}

struct BufferLifetimesPass
    : moe::impl::MoEBufferLifetimesBase<BufferLifetimesPass> {
  void runOnOperation() override {
    SmallVector<memref::DeallocOp> deallocs;
    getOperation().walk(
        [&](memref::DeallocOp dealloc) { deallocs.push_back(dealloc); });
    for (memref::DeallocOp dealloc : deallocs) {
      Value buffer = allocationOf(dealloc.getMemref());
      Block *block = dealloc->getBlock();
      if (!buffer || buffer.getDefiningOp()->getBlock() != block)
        continue;
      Operation *allocation = buffer.getDefiningOp();
      FailureOr<Operation *> last = lastReach(buffer, block, dealloc);
      if (failed(last))
        continue;
      // The allocation at its first use (its size operands are defined
      // before it, so they still dominate it).
      if (Operation *first = firstUse(buffer, block);
          first && first != dealloc && allocation->isBeforeInBlock(first))
        allocation->moveBefore(first);
      Operation *after = *last ? *last : allocation;
      if (after->isBeforeInBlock(dealloc))
        dealloc->moveAfter(after);
    }
  }
};

} // namespace
