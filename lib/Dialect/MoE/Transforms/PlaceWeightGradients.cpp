//===- PlaceWeightGradients.cpp - weight gradients where memory is low ----===//
//
// Moves each moe.grouped_matmul_wgrad down its block to where the fewest
// tensor bytes are live at once between it and its first reader (see
// -moe-place-weight-gradients in Passes.td).
//
//===----------------------------------------------------------------------===//

#include "moe/Dialect/MoE/Transforms/GemmRecipe.h"
#include "moe/Dialect/MoE/Transforms/Passes.h"
#include "moe/Dialect/MoE/Utils/TensorLiveness.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEPLACEWEIGHTGRADIENTS
#include "moe/Dialect/MoE/Transforms/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

namespace {

/// A weight-gradient GEMM and, when every use of its result rounds it to
/// bf16, the reshapes and roundings that do (the kernel then writes bf16
/// itself, -moe-gpu-dedicated-kernels): placed together, right after one
/// another, as the kernel runs them. Null when a rounding reads a value
/// defined after the GEMM other than a tensor.empty (which moves up).
std::optional<SmallVector<Operation *>> groupOf(GroupedMatmulWgradOp wgrad) {
  Operation *op = wgrad.getOperation();
  Block *block = op->getBlock();
  SmallVector<Operation *> group{op};
  if (!onlyRoundedToBF16(wgrad.getResult()))
    return group;
  llvm::SmallPtrSet<Operation *, 8> members{op};
  SmallVector<Operation *> chain;
  SmallVector<Value> work{wgrad.getResult()};
  while (!work.empty())
    for (Operation *user : work.pop_back_val().getUsers()) {
      if (user->getBlock() != block || !members.insert(user).second)
        continue;
      chain.push_back(user);
      if (isa<tensor::ExpandShapeOp, tensor::CollapseShapeOp>(user))
        work.push_back(user->getResult(0));
    }
  llvm::sort(chain,
             [](Operation *a, Operation *b) { return a->isBeforeInBlock(b); });
  for (Operation *member : chain)
    for (Value v : member->getOperands()) {
      Operation *def = v.getDefiningOp();
      if (!def || members.contains(def) || def->getBlock() != block ||
          def->isBeforeInBlock(op))
        continue;
      if (!isa<tensor::EmptyOp>(def))
        return std::nullopt;
      def->moveBefore(op);
    }
  llvm::append_range(group, chain);
  return group;
}

/// Moves `group` to run just before `q`, in its order.
void moveBefore(ArrayRef<Operation *> group, Operation *q) {
  for (Operation *member : group)
    member->moveBefore(q);
}

/// The last op `group` may move down to (it then runs just before it): the
/// first op after it that reads one of its results, has memory effects, or
/// exchanges rows; null when there is none (a block without terminator).
Operation *lastPlace(ArrayRef<Operation *> group) {
  Block *block = group.front()->getBlock();
  llvm::SmallPtrSet<Operation *, 8> members(group.begin(), group.end());
  for (Operation *q = group.back()->getNextNode(); q; q = q->getNextNode()) {
    bool reads = llvm::any_of(group, [&](Operation *member) {
      return llvm::any_of(member->getUsers(), [&](Operation *user) {
        Operation *at = block->findAncestorOpInBlock(*user);
        return at == q && !members.contains(at);
      });
    });
    if (reads || isa<AllToAllOp>(q) || !isMemoryEffectFree(q))
      return q;
  }
  return nullptr;
}

/// Moves `wgrad` (with its bf16 roundings, groupOf) before the op in (the
/// op after it, lastPlace] where the most bytes live at once over the
/// stretch from there to lastPlace is least; it stays where it is unless a
/// place is strictly better.
void place(GroupedMatmulWgradOp wgrad) {
  std::optional<SmallVector<Operation *>> found = groupOf(wgrad);
  if (!found)
    return;
  SmallVector<Operation *> group = *found;
  Operation *op = group.front();
  Block *block = op->getBlock();
  // The roundings run right after the GEMM, as its kernel does them.
  moveBefore(group, group.back()->getNextNode());
  Operation *head = group.back()->getNextNode();
  Operation *end = lastPlace(group);
  if (!head || !end || head == end)
    return;
  // A weight gradient only rounded to bf16 is written in bf16 by its
  // kernel: its f32 tensor never exists.
  auto counted = [&](Value v) {
    return !(group.size() > 1 && v == wgrad.getResult());
  };
  // The stretch's bytes: from its first op (the group's or `head`) to `end`.
  auto cost = [&] {
    BlockLiveness live(*block, counted);
    Operation *first = op->isBeforeInBlock(head) ? op : head;
    return live.peak(live.position(first), live.position(end) + 1);
  };
  int64_t best = cost();
  Operation *bestPlace = head;
  for (Operation *q = head->getNextNode(); q; q = q->getNextNode()) {
    moveBefore(group, q);
    if (int64_t c = cost(); c < best) {
      best = c;
      bestPlace = q;
    }
    if (q == end)
      break;
  }
  moveBefore(group, bestPlace);
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
