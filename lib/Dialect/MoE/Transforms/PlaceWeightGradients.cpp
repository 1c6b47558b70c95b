//===- PlaceWeightGradients.cpp - weight gradients where memory is low ----===//
//
// Moves each moe.grouped_matmul_wgrad down its block to where the fewest
// tensor bytes are live at once between it and its first reader (see
// -moe-place-weight-gradients in Passes.td).
//
//===----------------------------------------------------------------------===//

#include "moe/Dialect/MoE/Transforms/Passes.h"
#include "moe/Dialect/MoE/Utils/TensorLiveness.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEPLACEWEIGHTGRADIENTS
#include "moe/Dialect/MoE/Transforms/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

namespace {

/// The last op `op` may move down to (it then runs just before it): the
/// first op after it that reads its result, has memory effects, or
/// exchanges rows; null when there is none (a block without terminator).
Operation *lastPlace(Operation *op) {
  Block *block = op->getBlock();
  for (Operation *q = op->getNextNode(); q; q = q->getNextNode()) {
    bool reads = llvm::any_of(op->getResults(), [&](Value r) {
      return llvm::any_of(r.getUsers(), [&](Operation *user) {
        return block->findAncestorOpInBlock(*user) == q;
      });
    });
    if (reads || isa<AllToAllOp>(q) || !isMemoryEffectFree(q))
      return q;
  }
  return nullptr;
}

/// Moves `wgrad` before the op in (its next op, lastPlace] where the most
/// bytes live at once over the stretch from its next op to lastPlace is
/// least; it stays where it is unless a place is strictly better.
void place(GroupedMatmulWgradOp wgrad) {
  Operation *op = wgrad.getOperation();
  Operation *head = op->getNextNode();
  Operation *end = lastPlace(op);
  if (!head || !end || head == end)
    return;
  Block *block = op->getBlock();
  // The stretch's bytes: from its first op (the wgrad or `head`) to `end`.
  auto cost = [&] {
    BlockLiveness live(*block);
    Operation *first = op->isBeforeInBlock(head) ? op : head;
    return live.peak(live.position(first), live.position(end) + 1);
  };
  int64_t best = cost();
  Operation *bestPlace = head;
  for (Operation *q = head->getNextNode(); q; q = q->getNextNode()) {
    op->moveBefore(q);
    if (int64_t c = cost(); c < best) {
      best = c;
      bestPlace = q;
    }
    if (q == end)
      break;
  }
  op->moveBefore(bestPlace);
}

struct PlaceWeightGradientsPass
    : moe::impl::MoEPlaceWeightGradientsBase<PlaceWeightGradientsPass> {
  void runOnOperation() override {
    SmallVector<GroupedMatmulWgradOp> wgrads;
    getOperation().walk([&](GroupedMatmulWgradOp op) { wgrads.push_back(op); });
    for (GroupedMatmulWgradOp op : wgrads)
      place(op);
  }
};

} // namespace
