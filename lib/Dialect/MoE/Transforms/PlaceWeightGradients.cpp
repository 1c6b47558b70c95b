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
#include "llvm/ADT/MapVector.h"
#include "llvm/Support/MathExtras.h"

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

/// The most of a range of values, in constant time (a sparse table).
class RangeMax {
public:
  explicit RangeMax(ArrayRef<int64_t> values) {
    levels.emplace_back(values.begin(), values.end());
    for (size_t w = 1; 2 * w <= values.size(); w *= 2) {
      const SmallVector<int64_t> &prev = levels.back();
      SmallVector<int64_t> next(prev.size() - w);
      for (size_t i = 0; i < next.size(); ++i)
        next[i] = std::max(prev[i], prev[i + w]);
      levels.push_back(std::move(next));
    }
  }
  /// The most of values [from, to]; requires from <= to.
  int64_t max(size_t from, size_t to) const {
    unsigned k = llvm::Log2_64(to - from + 1);
    return std::max(levels[k][from], levels[k][to + 1 - (size_t(1) << k)]);
  }

private:
  SmallVector<SmallVector<int64_t>> levels;
};

/// Moves `wgrad` (with its bf16 roundings, groupOf) before the op in (the
/// op after it, lastPlace] where the most bytes live at once over the
/// stretch from there to lastPlace is least; it stays where it is unless a
/// place is strictly better.
///
/// The bytes are BlockLiveness's of the block with the group moved to each
/// place, found without moving it: the buffers the group neither defines
/// nor reads live where they do wherever it goes (summed once), and each of
/// the few it touches lives over an interval whose ends follow the group.
/// A place then costs a few range maxima, so a train step of many layers
/// places its weight gradients in time linear in its length, not cubic.
void place(GroupedMatmulWgradOp wgrad) {
  std::optional<SmallVector<Operation *>> found = groupOf(wgrad);
  if (!found)
    return;
  SmallVector<Operation *> group = *found;
  Block *block = group.front()->getBlock();
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

  // The block's other ops by index; the group sits in the gap before one
  // of them. A point of the block is (gap, rank): the group's k-th op at
  // gap j is (j, k), the other op i is (i, g), after the group at its gap.
  unsigned g = group.size();
  using Point = std::pair<unsigned, unsigned>;
  DenseMap<Operation *, unsigned> rank, index;
  for (auto [k, member] : llvm::enumerate(group))
    rank[member] = k;
  SmallVector<Operation *> others;
  for (Operation &o : *block)
    if (!rank.count(&o)) {
      index[&o] = others.size();
      others.push_back(&o);
    }
  unsigned n = others.size(), first = index.lookup(head),
           last = index.lookup(end);

  // Each buffer (BlockLiveness's rules): its owner, and the last op among
  // the others and among the group that defines or reads a view of it.
  struct Buffer {
    Operation *owner = nullptr;
    std::optional<unsigned> lastOther, lastMember;
  };
  llvm::MapVector<Value, Buffer> buffers;
  auto note = [&](Buffer &b, Operation *at) {
    auto it = rank.find(at);
    std::optional<unsigned> &slot =
        it != rank.end() ? b.lastMember : b.lastOther;
    unsigned at_ = it != rank.end() ? it->second : index.lookup(at);
    slot = slot ? std::max(*slot, at_) : at_;
  };
  forEachBufferReach(*block, [&](Value buffer, Operation *at) {
    Buffer &b = buffers[buffer];
    b.owner = buffer.getDefiningOp();
    note(b, at);
  });

  // The untouched buffers' bytes at each other op (base) and across the
  // gap before it (across); the touched ones' sizes and ends.
  struct Touched {
    int64_t bytes;
    std::optional<unsigned> ownerRank, ownerIndex, lastOther, lastMember;
  };
  SmallVector<Touched> touched;
  SmallVector<int64_t> base(n + 1, 0), across(n + 1, 0);
  for (auto &[buffer, b] : buffers) {
    int64_t bytes = tensorBytes(buffer);
    if (!bytes || !counted(buffer))
      continue;
    auto ownerRank = rank.find(b.owner);
    if (ownerRank != rank.end() || b.lastMember) {
      Touched t{bytes, std::nullopt, std::nullopt, b.lastOther, b.lastMember};
      if (ownerRank != rank.end())
        t.ownerRank = ownerRank->second;
      else
        t.ownerIndex = index.lookup(b.owner);
      touched.push_back(t);
      continue;
    }
    unsigned def = index.lookup(b.owner), lastUse = *b.lastOther;
    base[def] += bytes;
    base[lastUse + 1] -= bytes;
    across[def + 1] += bytes;
    across[lastUse + 1] -= bytes;
  }
  for (unsigned i = 1; i <= n; ++i) {
    base[i] += base[i - 1];
    across[i] += across[i - 1];
  }
  base.pop_back();
  RangeMax baseMax(base);

  // The most bytes live at once over the stretch with the group at gap j.
  auto cost = [&](unsigned j) {
    auto defOf = [&](const Touched &t) {
      return t.ownerRank ? Point{j, *t.ownerRank} : Point{*t.ownerIndex, g};
    };
    auto lastOf = [&](const Touched &t) {
      Point p{0, 0};
      if (t.lastOther)
        p = Point{*t.lastOther, g};
      if (t.lastMember)
        p = std::max(p, Point{j, *t.lastMember});
      return std::max(p, defOf(t));
    };
    int64_t most = 0;
    // The group's own ops.
    for (unsigned k = 0; k < g; ++k) {
      int64_t bytes = across[j];
      for (const Touched &t : touched)
        if (defOf(t) <= Point{j, k} && Point{j, k} <= lastOf(t))
          bytes += t.bytes;
      most = std::max(most, bytes);
    }
    // The other ops of the stretch: a touched buffer is live over the
    // others [from, to]; between the ends of those intervals the sum of
    // touched bytes is constant.
    SmallVector<std::tuple<unsigned, unsigned, int64_t>> spans;
    SmallVector<unsigned> cuts{first, last + 1};
    for (const Touched &t : touched) {
      auto [dj, dk] = defOf(t);
      auto [lj, lk] = lastOf(t);
      unsigned from = dj, to = lk == g ? lj + 1 : lj; // [from, to)
      if (from >= to)
        continue;
      spans.push_back({from, to, t.bytes});
      for (unsigned c : {from, to})
        if (c > first && c <= last)
          cuts.push_back(c);
    }
    llvm::sort(cuts);
    for (unsigned c = 0; c + 1 < cuts.size(); ++c) {
      unsigned from = cuts[c], to = cuts[c + 1];
      if (from == to)
        continue;
      int64_t bytes = baseMax.max(from, to - 1);
      for (auto [sFrom, sTo, sBytes] : spans)
        if (sFrom <= from && to <= sTo)
          bytes += sBytes;
      most = std::max(most, bytes);
    }
    return most;
  };
  int64_t best = cost(first);
  unsigned bestPlace = first;
  for (unsigned j = first + 1; j <= last; ++j)
    if (int64_t c = cost(j); c < best) {
      best = c;
      bestPlace = j;
    }
  moveBefore(group, others[bestPlace]);
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
