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
#include "moe/Dialect/MoE/Utils/BufferOrigin.h"
#include "moe/Dialect/MoE/Utils/TensorLiveness.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/Support/FormatVariadic.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEBUFFERLIFETIMES
#define GEN_PASS_DEF_MOEBUFFERREPORT
#include "moe/Dialect/MoE/Transforms/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;

namespace {

/// The allocation `value` is, or is a view of; null when it is neither (a
/// view of an argument, or of something else).
Value allocationOf(Value value) {
  Value buffer = moe::viewedBuffer(value);
  return buffer && buffer.getDefiningOp() ? buffer : Value();
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

/// Moves `op` to just before `to` in its block. Operation::moveBefore
/// splices, which invalidates the order of the whole block, so the next
/// isBeforeInBlock renumbers every op of it: a pass over the block per move,
/// quadratic over a train step's thousands of buffers. Removed and inserted
/// again, only `op` loses its number and takes one between its neighbors'.
void moveInBlock(Operation *op, Block::iterator to) {
  if (to == op->getIterator())
    return;
  Block *block = op->getBlock();
  op->remove();
  block->getOperations().insert(to, op);
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
      // Only plain heap allocations move: an alloca is freed by its scope
      // and other allocating ops may carry side effects of their own.
      auto allocation =
          buffer ? buffer.getDefiningOp<memref::AllocOp>() : memref::AllocOp();
      if (!allocation || allocation->getBlock() != block)
        continue;
      FailureOr<Operation *> last = lastReach(buffer, block, dealloc);
      if (failed(last))
        continue;
      // The allocation at its first use (its size operands are defined
      // before it, so they still dominate it).
      if (Operation *first = firstUse(buffer, block);
          first && first != dealloc && allocation->isBeforeInBlock(first))
        moveInBlock(allocation, first->getIterator());
      Operation *after = *last ? *last : allocation.getOperation();
      if (after->isBeforeInBlock(dealloc))
        moveInBlock(dealloc, std::next(after->getIterator()));
    }
  }
};

/// `bytes` as KiB / MiB / GiB with two decimals.
std::string formatBytes(int64_t bytes) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? llvm::formatv("{0} B", bytes).str()
                : llvm::formatv("{0:F2} {1}", v, units[u]).str();
}

struct BufferReportPass : moe::impl::MoEBufferReportBase<BufferReportPass> {
  static constexpr unsigned kLargest = 5;

  void runOnOperation() override {
    func::FuncOp func = getOperation();
    if (func.isExternal())
      return;
    llvm::MapVector<Value, int64_t> live;
    int64_t current = 0, peak = 0, dynamicCount = 0;
    SmallVector<std::pair<Value, int64_t>> atPeak;
    Operation *peakAt = nullptr;
    func.walk<WalkOrder::PreOrder>([&](Operation *op) {
      if (auto alloc = dyn_cast<memref::AllocOp>(op)) {
        std::optional<int64_t> size = moe::shapedBytes(alloc.getType());
        int64_t bytes = size.value_or(0);
        if (!size)
          ++dynamicCount;
        live[alloc.getResult()] = bytes;
        current += bytes;
        if (current > peak) {
          peak = current;
          peakAt = op;
          atPeak.assign(live.begin(), live.end());
        }
      } else if (auto dealloc = dyn_cast<memref::DeallocOp>(op)) {
        Value buffer = allocationOf(dealloc.getMemref());
        auto it = buffer ? live.find(buffer) : live.end();
        if (it != live.end()) {
          current -= it->second;
          live.erase(it);
        }
      }
    });
    std::string text = llvm::formatv("buffers of @{0}: ", func.getSymName());
    if (!peakAt) {
      text += "none with a static size";
    } else {
      llvm::stable_sort(atPeak,
                        [](auto &a, auto &b) { return a.second > b.second; });
      text += llvm::formatv("peak {0} ({1} live) at {2}; largest:",
                            formatBytes(peak), atPeak.size(), peakAt->getLoc())
                  .str();
      for (auto [i, entry] :
           llvm::enumerate(ArrayRef(atPeak).take_front(kLargest)))
        text += llvm::formatv("{0} {1} {2}", i ? "," : "",
                              formatBytes(entry.second), entry.first.getType())
                    .str();
    }
    if (dynamicCount)
      text += llvm::formatv("; not counted: {0} of dynamic size or element "
                            "type",
                            dynamicCount)
                  .str();
    func.emitRemark(text);
  }
};

} // namespace
