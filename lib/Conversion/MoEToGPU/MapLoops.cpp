//===- MapLoops.cpp - linalg on buffers -> loops mapped to the GPU --------===//

#include "BufferAccesses.h"
#include "SingleThread.h"

#include "moe/Conversion/Passes.h"

#include "mlir/Analysis/SliceAnalysis.h"
#include "mlir/Dialect/Affine/IR/AffineOps.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Linalg/Transforms/Transforms.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/MemRef/Transforms/Transforms.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/SCF/Transforms/Transforms.h"
#include "mlir/Dialect/SCF/Utils/Utils.h"
#include "mlir/Dialect/Utils/StaticValueUtils.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/IR/Dominance.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mlir/Interfaces/ViewLikeInterface.h"
#include "mlir/Transforms/CSE.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"
#include "mlir/Transforms/LoopInvariantCodeMotionUtils.h"
#include "llvm/ADT/SmallBitVector.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEGPUMAPLOOPS
#include "moe/Conversion/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;

namespace {

/// Iterations of a thread's strided loop run together (see interleave).
constexpr int64_t kUnroll = 4;
/// Groups of vector iterations run together likewise.
constexpr int64_t kVectorUnroll = 2;

/// Known bounds [lo, hi] of an index value, where its definition gives them.
struct Range {
  std::optional<int64_t> lo, hi;
};

Range rangeOf(Value v, int depth = 0) {
  if (std::optional<int64_t> c = getConstantIntValue(v))
    return {*c, *c};
  Operation *def = v.getDefiningOp();
  if (!def || depth > 16)
    return {};
  auto sub = [&](Value x) { return rangeOf(x, depth + 1); };
  auto both = [](std::optional<int64_t> a, std::optional<int64_t> b,
                 auto f) -> std::optional<int64_t> {
    if (a && b)
      return f(*a, *b);
    return std::nullopt;
  };
  auto either = [](std::optional<int64_t> a, std::optional<int64_t> b,
                   auto f) -> std::optional<int64_t> {
    if (a && b)
      return f(*a, *b);
    return a ? a : b;
  };
  auto mn = [](int64_t a, int64_t b) { return std::min(a, b); };
  auto mx = [](int64_t a, int64_t b) { return std::max(a, b); };
  if (auto op = dyn_cast<arith::MinSIOp>(def)) {
    Range a = sub(op.getLhs()), b = sub(op.getRhs());
    return {both(a.lo, b.lo, mn), either(a.hi, b.hi, mn)};
  }
  if (auto op = dyn_cast<arith::MaxSIOp>(def)) {
    Range a = sub(op.getLhs()), b = sub(op.getRhs());
    return {either(a.lo, b.lo, mx), both(a.hi, b.hi, mx)};
  }
  if (auto op = dyn_cast<arith::AddIOp>(def)) {
    Range a = sub(op.getLhs()), b = sub(op.getRhs());
    auto add = [](int64_t x, int64_t y) { return x + y; };
    return {both(a.lo, b.lo, add), both(a.hi, b.hi, add)};
  }
  if (auto op = dyn_cast<arith::SubIOp>(def)) {
    Range a = sub(op.getLhs()), b = sub(op.getRhs());
    return {both(a.lo, b.hi, [](int64_t x, int64_t y) { return x - y; }),
            both(a.hi, b.lo, [](int64_t x, int64_t y) { return x - y; })};
  }
  // Division of a non-negative value by a positive constant.
  if (isa<arith::DivUIOp, arith::DivSIOp, arith::CeilDivSIOp,
          arith::CeilDivUIOp>(def)) {
    Range a = sub(def->getOperand(0));
    std::optional<int64_t> c = getConstantIntValue(def->getOperand(1));
    if (!a.lo || *a.lo < 0 || !c || *c <= 0)
      return {};
    bool ceil = isa<arith::CeilDivSIOp, arith::CeilDivUIOp>(def);
    auto div = [&](int64_t x) { return ceil ? (x + *c - 1) / *c : x / *c; };
    return {div(*a.lo),
            a.hi ? std::optional<int64_t>(div(*a.hi)) : std::nullopt};
  }
  if (auto op = dyn_cast<arith::MulIOp>(def)) {
    Range a = sub(op.getLhs()), b = sub(op.getRhs());
    if (a.lo && b.lo && *a.lo >= 0 && *b.lo >= 0) {
      auto mul = [](int64_t x, int64_t y) { return x * y; };
      return {*a.lo * *b.lo, both(a.hi, b.hi, mul)};
    }
    return {};
  }
  if (auto op = dyn_cast<memref::DimOp>(def)) {
    std::optional<int64_t> d = op.getConstantIndex();
    auto type = dyn_cast<MemRefType>(op.getSource().getType());
    if (!d || !type)
      return {};
    if (!type.isDynamicDim(*d))
      return {type.getDimSize(*d), type.getDimSize(*d)};
    if (auto view = op.getSource().getDefiningOp<memref::SubViewOp>()) {
      // A view's dimension is its size operand (counting past the
      // dimensions a rank-reducing view drops).
      llvm::SmallBitVector dropped = view.getDroppedDims();
      int64_t seen = -1;
      for (unsigned s = 0; s < dropped.size(); ++s) {
        if (dropped.test(s) || ++seen != *d)
          continue;
        OpFoldResult size = view.getMixedSizes()[s];
        if (std::optional<int64_t> c = getConstantIntValue(size))
          return {*c, *c};
        Range r = sub(cast<Value>(size));
        return {r.lo ? r.lo : std::optional<int64_t>(0), r.hi};
      }
    }
    return {0, std::nullopt};
  }
  return {};
}

using moe::detail::viewRoot;

/// The buffer a memref.load or memref.store accesses, and at which indices.
Value accessedMemRef(Operation *access) {
  if (auto load = dyn_cast<memref::LoadOp>(access))
    return load.getMemRef();
  return cast<memref::StoreOp>(access).getMemRef();
}
ValueRange accessIndices(Operation *access) {
  if (auto load = dyn_cast<memref::LoadOp>(access))
    return load.getIndices();
  return cast<memref::StoreOp>(access).getIndices();
}

/// Whether `root` (a viewRoot) is a buffer of its own: an allocation, a
/// global, or an argument of the function (which no allocation made inside
/// it can alias).
bool isDistinctBuffer(Value root) {
  if (auto arg = dyn_cast<BlockArgument>(root))
    return isa<FunctionOpInterface>(arg.getOwner()->getParentOp()) &&
           arg.getOwner()->isEntryBlock();
  return root.getDefiningOp<memref::AllocOp>() ||
         root.getDefiningOp<memref::AllocaOp>() ||
         root.getDefiningOp<memref::GetGlobalOp>();
}

/// Collapses of a buffer of static shape and identity layout become views
/// of the same memory with the collapsed shape (memref.reinterpret_cast).
/// Loads and stores through a collapse are folded into the buffer's own
/// indices (runOnOperation), each access dividing its flat index by the
/// dimensions: 64-bit divisions, a dozen instructions each where a
/// dimension is not a power of two (the global norm's sum of squares of a
/// [128, 2048, 1536] gradient spent more on them than on its loads).
/// Through the view they keep the flat index.
void collapsesAsViews(RewriterBase &rewriter, func::FuncOp func) {
  SmallVector<memref::CollapseShapeOp> collapses;
  func.walk([&](memref::CollapseShapeOp op) { collapses.push_back(op); });
  for (memref::CollapseShapeOp op : collapses) {
    MemRefType source = op.getSrcType(), result = op.getResultType();
    if (!source.hasStaticShape() || !source.getLayout().isIdentity() ||
        !result.getLayout().isIdentity())
      continue;
    SmallVector<int64_t> strides(result.getRank(), 1);
    for (int64_t d = result.getRank() - 2; d >= 0; --d)
      strides[d] = strides[d + 1] * result.getDimSize(d + 1);
    rewriter.setInsertionPoint(op);
    rewriter.replaceOpWithNewOp<memref::ReinterpretCastOp>(
        op, result, op.getSrc(), /*offset=*/0, result.getShape(), strides);
  }
}

/// Whether the strided loop's body may run `unroll` iterations with all
/// their loads before any of their stores: a straight line of loads,
/// stores and ops free of memory effects, where nothing stored can be
/// loaded: every stored buffer is an allocation, every loaded one a
/// distinct buffer (isDistinctBuffer), and no load reads a stored one.
/// (Updates in place, loading only the element they store, would be safe
/// too, but measured slower: the AdamW update of 400M parameters took 3.95
/// ms interleaved against 3.07 ms, at 86% of the copy rate, one iteration
/// at a time; the extra registers cost more occupancy than the loads in
/// flight gain.)
bool canInterleave(Block *body) {
  SmallVector<Value> loaded, stored;
  for (Operation &op : body->without_terminator()) {
    if (op.getNumRegions() != 0)
      return false;
    std::optional<moe::detail::BufferAccess> access =
        moe::detail::bufferAccess(&op);
    if (!access) {
      if (!isMemoryEffectFree(&op))
        return false;
      continue;
    }
    // (An atomic update reads what other iterations write.)
    if (access->reads && access->writes)
      return false;
    (access->reads ? loaded : stored).push_back(viewRoot(access->memref));
  }
  if (stored.empty() || !llvm::all_of(loaded, isDistinctBuffer))
    return false;
  return llvm::all_of(stored, [&](Value s) {
    return s.getDefiningOp<memref::AllocOp>() && !llvm::is_contained(loaded, s);
  });
}

/// Keeps a reduction loop's accumulator in a register:
///
///   scf.for ... { %a = memref.load %out[%i]; ...; memref.store %v, %out[%i] }
///
/// (what a bufferized linalg reduction lowers to, %i invariant in the loop)
/// becomes a load before the loop, %v carried as an iteration argument, and
/// one store after it. Otherwise every term's store may alias the next
/// terms' loads: a thread has one load in flight, and a sum of squares over
/// a large gradient runs at a third of the memory bandwidth. Only where
/// nothing else in the loop touches %out's buffer and every buffer the loop
/// reads or writes is a distinct one (isDistinctBuffer): the same loads and
/// stores of the same values happen in the same order, so results are
/// unchanged bit for bit.
void promoteAccumulator(RewriterBase &rewriter, scf::ForOp loop) {
  // Memory accesses in the loop (nested ones included); anything else with
  // memory effects leaves the loop as it is.
  SmallVector<Operation *> accesses;
  WalkResult walk = loop.getBody()->walk([&](Operation *op) {
    if (isa<memref::LoadOp, memref::StoreOp>(op)) {
      accesses.push_back(op);
      return WalkResult::advance();
    }
    if (op->getNumRegions() != 0 || isMemoryEffectFree(op))
      return WalkResult::advance();
    return WalkResult::interrupt();
  });
  if (walk.wasInterrupted())
    return;
  if (!llvm::all_of(accesses, [&](Operation *op) {
        return isDistinctBuffer(viewRoot(accessedMemRef(op)));
      }))
    return;
  for (Operation &op : *loop.getBody()) {
    auto store = dyn_cast<memref::StoreOp>(&op);
    if (!store ||
        !llvm::all_of(
            store.getIndices(),
            [&](Value i) { return loop.isDefinedOutsideOfLoop(i); }) ||
        !loop.isDefinedOutsideOfLoop(store.getMemRef()))
      continue;
    Value root = viewRoot(store.getMemRef());
    memref::LoadOp load;
    bool other = false;
    for (Operation *access : accesses) {
      if (access == store || viewRoot(accessedMemRef(access)) != root)
        continue;
      auto l = dyn_cast<memref::LoadOp>(access);
      if (!load && l && l->getBlock() == loop.getBody() &&
          l.getMemRef() == store.getMemRef() &&
          l.getIndices() == store.getIndices() && l->isBeforeInBlock(store))
        load = l;
      else
        other = true;
    }
    if (!load || other)
      continue;
    rewriter.setInsertionPoint(loop);
    Value init = memref::LoadOp::create(rewriter, load.getLoc(),
                                        store.getMemRef(), store.getIndices());
    Value stored = store.getValueToStore();
    FailureOr<LoopLikeOpInterface> grown = loop.replaceWithAdditionalYields(
        rewriter, init, /*replaceInitOperandUsesInLoop=*/false,
        [&](OpBuilder &, Location, ArrayRef<BlockArgument>) {
          return SmallVector<Value>{stored};
        });
    if (failed(grown))
      return;
    auto newLoop = cast<scf::ForOp>(grown->getOperation());
    rewriter.replaceAllUsesWith(load.getResult(),
                                newLoop.getRegionIterArgs().back());
    rewriter.setInsertionPointAfter(newLoop);
    memref::StoreOp::create(rewriter, store.getLoc(),
                            newLoop.getResults().back(), store.getMemRef(),
                            store.getIndices());
    rewriter.eraseOp(store);
    rewriter.eraseOp(load);
    return;
  }
}

/// promoteAccumulator on every loop inside a kernel-to-be (a parallel loop
/// or a launch), innermost first, after common index computations are
/// merged and loop-invariant ones hoisted (so a load and a store of one
/// element use the same index values, defined outside the loop).
void promoteAccumulators(RewriterBase &rewriter, func::FuncOp func) {
  DominanceInfo dominance(func);
  eliminateCommonSubExpressions(rewriter, dominance, func);
  SmallVector<scf::ForOp> loops;
  func.walk([&](scf::ForOp loop) { // (post-order: inner loops first)
    if (loop->getParentOfType<scf::ParallelOp>() ||
        loop->getParentOfType<gpu::LaunchOp>())
      loops.push_back(loop);
  });
  for (scf::ForOp loop : loops) {
    moveLoopInvariantCode(cast<LoopLikeOpInterface>(loop.getOperation()));
    promoteAccumulator(rewriter, loop);
  }
}

/// Runs `unroll` consecutive iterations of a thread's strided loop
///   scf.for %i = first to end step S { loads; arithmetic; stores }
/// together: their loads and arithmetic first, then their stores (in
/// order), then the last < unroll iterations as before. A thread then has
/// `unroll` loads in flight instead of one: a copy or gather of 4-byte
/// elements is bound by memory latency otherwise. Only where canInterleave.
void interleave(RewriterBase &rewriter, scf::ForOp loop, int64_t unroll) {
  if (!canInterleave(loop.getBody()))
    return;
  Location loc = loop.getLoc();
  rewriter.setInsertionPoint(loop);
  auto c = [&](int64_t v) -> Value {
    return arith::ConstantIndexOp::create(rewriter, loc, v);
  };
  Value first = loop.getLowerBound(), end = loop.getUpperBound(),
        step = loop.getStep();
  Value wide = arith::MulIOp::create(rewriter, loc, step, c(unroll));
  // Iterations i with i + (unroll - 1) S < end run together.
  Value mainEnd = arith::SubIOp::create(
      rewriter, loc, end,
      arith::MulIOp::create(rewriter, loc, step, c(unroll - 1)));
  auto main = scf::ForOp::create(rewriter, loc, first, mainEnd, wide);
  {
    OpBuilder::InsertionGuard guard(rewriter);
    rewriter.setInsertionPoint(main.getBody()->getTerminator());
    SmallVector<Operation *> stores;
    for (int64_t u = 0; u < unroll; ++u) {
      IRMapping map;
      Value iv = main.getInductionVar();
      if (u > 0)
        iv = arith::AddIOp::create(
            rewriter, loc, iv,
            arith::MulIOp::create(rewriter, loc, step, c(u)));
      map.map(loop.getInductionVar(), iv);
      for (Operation &op : loop.getBody()->without_terminator()) {
        Operation *copy = rewriter.clone(op, map);
        if (isa<memref::StoreOp, vector::StoreOp>(copy))
          stores.push_back(copy);
      }
    }
    for (Operation *store : stores)
      store->moveBefore(main.getBody()->getTerminator());
  }
  // The rest starts where the main loop stopped: first + n * unroll * S,
  // n = max(0, ceil((mainEnd - first) / (unroll * S))).
  Value trips = arith::MaxSIOp::create(
      rewriter, loc, c(0),
      arith::CeilDivSIOp::create(
          rewriter, loc, arith::SubIOp::create(rewriter, loc, mainEnd, first),
          wide));
  Value rest = arith::AddIOp::create(
      rewriter, loc, first, arith::MulIOp::create(rewriter, loc, trips, wide));
  rewriter.modifyOpInPlace(loop, [&] { loop.setLowerBound(rest); });
}

/// Whether `v` is iv + (terms independent of iv): one step of `iv` moves
/// `v` by one element. `moving`: iv and the values computed from it.
bool unitStepIn(Value v, Value iv, const DenseSet<Value> &moving,
                int depth = 0) {
  if (v == iv)
    return true;
  Operation *def = v.getDefiningOp();
  if (!def || !moving.contains(v) || depth > 32)
    return false;
  auto unit = [&](Value x) { return unitStepIn(x, iv, moving, depth + 1); };
  auto free = [&](Value x) { return !moving.contains(x); };
  if (auto add = dyn_cast<arith::AddIOp>(def))
    return (unit(add.getLhs()) && free(add.getRhs())) ||
           (free(add.getLhs()) && unit(add.getRhs()));
  if (auto sub = dyn_cast<arith::SubIOp>(def))
    return unit(sub.getLhs()) && free(sub.getRhs());
  if (auto linear = dyn_cast<affine::AffineLinearizeIndexOp>(def)) {
    // Row-major: the last index has stride 1.
    ValueRange indices = linear.getMultiIndex();
    return !indices.empty() && unit(indices.back()) &&
           llvm::all_of(indices.drop_back(), free);
  }
  if (auto apply = dyn_cast<affine::AffineApplyOp>(def)) {
    // Exactly one operand moves with iv, by one step, and the map's
    // coefficient of that operand is 1.
    AffineMap map = apply.getAffineMap();
    std::optional<unsigned> at;
    for (auto [i, operand] : llvm::enumerate(apply.getMapOperands())) {
      if (free(operand))
        continue;
      if (at || !unit(operand))
        return false;
      at = i;
    }
    if (!at)
      return false;
    unsigned dims = map.getNumDims();
    MLIRContext *ctx = def->getContext();
    AffineExpr x = *at < dims ? getAffineDimExpr(*at, ctx)
                              : getAffineSymbolExpr(*at - dims, ctx);
    AffineExpr e = map.getResult(0);
    AffineExpr step =
        simplifyAffineExpr(e.replace(x, x + 1) - e, dims, map.getNumSymbols());
    auto c = dyn_cast<AffineConstantExpr>(step);
    return c && c.getValue() == 1;
  }
  return false;
}

/// The order in which to flatten a parallel loop nest (the last dimension
/// varies fastest across threads): the dimensions as written, except that
/// the one that moves the innermost index of the most memory accesses by
/// one element goes last, so that a warp's accesses are coalesced. Each
/// access counts its executions per iteration (the trip counts of the
/// sequential loops around it, 16 where unknown). The column sums of a
/// norm's weight gradient, partial sums [columns, parts] of rows
/// [rows, columns], otherwise give adjacent threads adjacent parts, rows
/// apart.
std::vector<unsigned> coalescingOrder(scf::ParallelOp loop) {
  unsigned n = loop.getNumLoops();
  SmallVector<int64_t> weight(n, 0);
  // Per dimension, its induction variable and what is computed from it.
  SmallVector<DenseSet<Value>> moving(n);
  for (unsigned d = 0; d < n; ++d) {
    Value iv = loop.getInductionVars()[d];
    SetVector<Operation *> slice;
    getForwardSlice(iv, &slice);
    moving[d].insert(iv);
    for (Operation *op : slice)
      moving[d].insert(op->result_begin(), op->result_end());
  }
  loop.getBody()->walk([&](Operation *op) {
    Value memref;
    ValueRange indices;
    if (auto load = dyn_cast<memref::LoadOp>(op)) {
      memref = load.getMemRef();
      indices = load.getIndices();
    } else if (auto store = dyn_cast<memref::StoreOp>(op)) {
      memref = store.getMemRef();
      indices = store.getIndices();
    } else {
      return;
    }
    auto type = cast<MemRefType>(memref.getType());
    if (indices.empty() || !type.isLastDimUnitStride())
      return;
    int64_t executions = 1;
    for (Operation *p = op->getParentOp(); p != loop; p = p->getParentOp())
      if (auto inner = dyn_cast<scf::ForOp>(p)) {
        std::optional<APInt> trips = inner.getStaticTripCount();
        int64_t t = trips ? std::clamp<int64_t>(trips->getSExtValue(), 1,
                                                int64_t(1) << 20)
                          : 16;
        executions = std::min<int64_t>(executions * t, int64_t(1) << 40);
      }
    for (unsigned d = 0; d < n; ++d)
      if (unitStepIn(indices.back(), loop.getInductionVars()[d], moving[d]))
        weight[d] += executions;
  });
  std::vector<unsigned> order;
  unsigned best = n - 1;
  for (unsigned d = 0; d < n; ++d)
    if (weight[d] > weight[best])
      best = d;
  for (unsigned d = 0; d < n; ++d)
    if (d != best)
      order.push_back(d);
  order.push_back(best);
  return order;
}

/// How a value of a thread's loop body changes over a group of `width`
/// consecutive iterations whose first is a multiple of `width`.
enum class Lanes {
  /// The same in every iteration of the group.
  Uniform,
  /// k * width + l in the group's iteration l, for some k >= 0.
  Consecutive,
  /// Anything else.
  Varying,
};

/// Lanes of the values of a straight-line loop body whose induction
/// variable `iv` is non-negative, moves by one, and starts groups at
/// multiples of `width`.
class LaneKinds {
public:
  LaneKinds(Block *body, Value iv, int64_t width)
      : body(body), iv(iv), width(width) {}

  Lanes of(Value v) {
    if (v == iv)
      return Lanes::Consecutive;
    Operation *def = v.getDefiningOp();
    if (!def || def->getBlock() != body)
      return Lanes::Uniform; // defined before the loop
    if (auto known = kinds.find(v); known != kinds.end())
      return known->second;
    // (compute looks up operands, which may grow the map: no iterator into
    // it is held across the call.)
    Lanes lanes = compute(def);
    kinds[v] = lanes;
    return lanes;
  }

  /// Whether every lane of `op`'s results is the same value.
  bool uniform(Operation *op) {
    return op->getNumResults() != 0 &&
           llvm::all_of(op->getResults(),
                        [&](Value r) { return of(r) == Lanes::Uniform; });
  }

private:
  /// A uniform, non-negative multiple of `width`.
  bool alignedOffset(Value v) {
    std::function<bool(Value)> multiple = [&](Value x) {
      if (std::optional<int64_t> c = getConstantIntValue(x))
        return *c % width == 0;
      if (auto mul = x.getDefiningOp<arith::MulIOp>())
        return multiple(mul.getLhs()) || multiple(mul.getRhs());
      if (auto add = x.getDefiningOp<arith::AddIOp>())
        return multiple(add.getLhs()) && multiple(add.getRhs());
      return false;
    };
    Range r = rangeOf(v);
    return of(v) == Lanes::Uniform && r.lo && *r.lo >= 0 && multiple(v);
  }

  Lanes compute(Operation *def) {
    auto allUniform = [&](ValueRange values) {
      return llvm::all_of(values,
                          [&](Value x) { return of(x) == Lanes::Uniform; });
    };
    // k * width + l divided by, or modulo, a positive multiple of width.
    auto byMultiple = [&]() {
      std::optional<int64_t> c = getConstantIntValue(def->getOperand(1));
      return of(def->getOperand(0)) == Lanes::Consecutive && c && *c > 0 &&
             *c % width == 0;
    };
    if (auto add = dyn_cast<arith::AddIOp>(def)) {
      Value a = add.getLhs(), b = add.getRhs();
      if (allUniform({a, b}))
        return Lanes::Uniform;
      if ((of(a) == Lanes::Consecutive && alignedOffset(b)) ||
          (of(b) == Lanes::Consecutive && alignedOffset(a)))
        return Lanes::Consecutive;
      return Lanes::Varying;
    }
    if (isa<arith::RemSIOp, arith::RemUIOp>(def) && byMultiple())
      return Lanes::Consecutive;
    if (isa<arith::DivSIOp, arith::DivUIOp, arith::FloorDivSIOp>(def) &&
        byMultiple())
      return Lanes::Uniform;
    if (auto load = dyn_cast<memref::LoadOp>(def))
      return allUniform(load.getIndices()) ? Lanes::Uniform : Lanes::Varying;
    if (isMemoryEffectFree(def) && allUniform(def->getOperands()))
      return Lanes::Uniform;
    return Lanes::Varying;
  }

  Block *body;
  Value iv;
  int64_t width;
  DenseMap<Value, Lanes> kinds;
};

/// The memory accesses of a loop body that vectorizeLoop turns into vector
/// loads and stores, `width` elements each.
struct VectorPlan {
  int64_t width = 1;
  SmallPtrSet<Operation *, 8> vectorized;
};

/// Bytes of an element a vector access can hold (integers and floats of
/// whole bytes), else 0.
int64_t vectorElementBytes(Type type) {
  if (!isa<IntegerType, FloatType>(type) || type.getIntOrFloatBitWidth() % 8)
    return 0;
  return type.getIntOrFloatBitWidth() / 8;
}

/// Whether an access of `type` at indices whose last is consecutive and
/// whose others are uniform starts its group at a multiple of `width`
/// elements from the buffer's aligned pointer (vectorizeLoop checks that
/// pointer's alignment at run time).
bool alignedLayout(MemRefType type, int64_t width) {
  SmallVector<int64_t> strides;
  int64_t offset;
  if (type.getRank() == 0 || failed(type.getStridesAndOffset(strides, offset)))
    return false;
  if (strides.back() != 1 || ShapedType::isDynamic(offset) || offset % width)
    return false;
  return llvm::all_of(ArrayRef(strides).drop_back(), [&](int64_t s) {
    return !ShapedType::isDynamic(s) && s % width == 0;
  });
}

/// The widest vectors (at most `vectorBytes` an access) in which a thread
/// can run groups of `width` consecutive iterations of the loop `body`
/// (induction variable `iv`, starting at a non-negative multiple of the
/// width, step 1): every access whose innermost index moves with the
/// iterations (Lanes::Consecutive, the other indices uniform) becomes one
/// vector access of the group, the rest stays scalar, once for the group
/// where uniform. Every store must become a vector store, every buffer be
/// distinct (isDistinctBuffer), and a stored buffer be loaded only at the
/// element the iteration stores (an update in place): the group's loads
/// then run before its stores without reading what another iteration
/// stored. Width 1: none.
VectorPlan planVectors(Block *body, Value iv, int64_t vectorBytes) {
  SmallVector<Operation *> accesses;
  for (Operation &op : body->without_terminator()) {
    if (op.getNumRegions() != 0)
      return {};
    if (isa<memref::LoadOp, memref::StoreOp>(op))
      accesses.push_back(&op);
    else if (!isMemoryEffectFree(&op))
      return {};
  }
  // Every buffer distinct; a stored one loaded and stored at one element.
  DenseMap<Value, Operation *> storeOf;
  for (Operation *op : accesses) {
    Value root = viewRoot(accessedMemRef(op));
    if (!isDistinctBuffer(root))
      return {};
    if (isa<memref::StoreOp>(op) && !storeOf.try_emplace(root, op).second) {
      Operation *first = storeOf.lookup(root);
      if (accessedMemRef(first) != accessedMemRef(op) ||
          accessIndices(first) != accessIndices(op))
        return {};
    }
  }
  for (Operation *op : accesses) {
    Operation *store = storeOf.lookup(viewRoot(accessedMemRef(op)));
    if (isa<memref::LoadOp>(op) && store &&
        (accessedMemRef(store) != accessedMemRef(op) ||
         accessIndices(store) != accessIndices(op)))
      return {};
  }
  for (int64_t width = vectorBytes; width >= 2; width /= 2) {
    LaneKinds lanes(body, iv, width);
    VectorPlan plan{width, {}};
    bool fits = true;
    for (Operation *op : accesses) {
      ValueRange indices = accessIndices(op);
      auto type = cast<MemRefType>(accessedMemRef(op).getType());
      bool consecutive =
          !indices.empty() && lanes.of(indices.back()) == Lanes::Consecutive &&
          llvm::all_of(indices.drop_back(),
                       [&](Value i) { return lanes.of(i) == Lanes::Uniform; });
      int64_t bytes = vectorElementBytes(type.getElementType());
      if (consecutive && bytes && bytes * width <= vectorBytes &&
          alignedLayout(type, width))
        plan.vectorized.insert(op);
      else if (consecutive || isa<memref::StoreOp>(op))
        fits = false; // too wide, or a store that stays scalar
    }
    if (fits && !plan.vectorized.empty())
      return plan;
  }
  return {};
}

/// Runs a thread's strided loop (from mapToGrid, `linear` the thread's
/// index in the grid, iterations from `lb` by one)
///
///   scf.for %i = lb + linear to end step S { body }
///
/// as groups of plan.width consecutive iterations, each with vector loads
/// and stores (planVectors), thread `linear` taking the groups at
/// lb + linear * width, then every S * width after it; the iterations past
/// the last whole group stay in the scalar loop. The vectors are aligned
/// to their size, so the groups run where every vectorized buffer's pointer
/// is; otherwise (a caller's view at an odd offset) the scalar loop runs
/// everything. The same operations on the same elements: results are
/// unchanged bit for bit.
scf::ForOp vectorizeLoop(RewriterBase &rewriter, scf::ForOp loop, int64_t lbC,
                         Value linear, const VectorPlan &plan) {
  int64_t width = plan.width;
  Location loc = loop.getLoc();
  rewriter.setInsertionPoint(loop);
  auto c = [&](int64_t v) -> Value {
    return arith::ConstantIndexOp::create(rewriter, loc, v);
  };
  Value lb = c(lbC);
  // Every vectorized buffer aligned to its vectors.
  Value aligned = arith::ConstantIntOp::create(rewriter, loc, 1, 1);
  DenseSet<Value> checked;
  for (Operation &op : *loop.getBody()) {
    if (!plan.vectorized.contains(&op) ||
        !checked.insert(accessedMemRef(&op)).second)
      continue;
    auto type = cast<MemRefType>(accessedMemRef(&op).getType());
    Value pointer = memref::ExtractAlignedPointerAsIndexOp::create(
        rewriter, loc, accessedMemRef(&op));
    Value misalignment = arith::RemUIOp::create(
        rewriter, loc, pointer,
        c(width * vectorElementBytes(type.getElementType())));
    aligned = arith::AndIOp::create(
        rewriter, loc, aligned,
        arith::CmpIOp::create(rewriter, loc, arith::CmpIPredicate::eq,
                              misalignment, c(0)));
  }
  Value end = loop.getUpperBound(), step = loop.getStep();
  Value groups = arith::DivSIOp::create(
      rewriter, loc,
      arith::MaxSIOp::create(
          rewriter, loc, arith::SubIOp::create(rewriter, loc, end, lb), c(0)),
      c(width));
  Value groupsEnd = arith::SelectOp::create(
      rewriter, loc, aligned,
      arith::AddIOp::create(
          rewriter, loc, lb,
          arith::MulIOp::create(rewriter, loc, groups, c(width))),
      lb);
  Value first = arith::AddIOp::create(
      rewriter, loc, lb,
      arith::MulIOp::create(rewriter, loc, linear, c(width)));
  auto vectorLoop =
      scf::ForOp::create(rewriter, loc, first, groupsEnd,
                         arith::MulIOp::create(rewriter, loc, step, c(width)));
  {
    OpBuilder::InsertionGuard guard(rewriter);
    rewriter.setInsertionPoint(vectorLoop.getBody()->getTerminator());
    LaneKinds kinds(loop.getBody(), loop.getInductionVar(), width);
    SmallVector<IRMapping> lanes(width);
    Value start = vectorLoop.getInductionVar();
    for (int64_t l = 0; l < width; ++l)
      lanes[l].map(
          loop.getInductionVar(),
          l == 0
              ? start
              : arith::AddIOp::create(rewriter, loc, start, c(l)).getResult());
    auto firstLane = [&](ValueRange values) {
      return llvm::map_to_vector(
          values, [&](Value v) { return lanes[0].lookupOrDefault(v); });
    };
    for (Operation &op : loop.getBody()->without_terminator()) {
      if (plan.vectorized.contains(&op)) {
        auto type = cast<MemRefType>(accessedMemRef(&op).getType());
        auto vectorType = VectorType::get({width}, type.getElementType());
        llvm::MaybeAlign alignment(width *
                                   vectorElementBytes(type.getElementType()));
        if (auto load = dyn_cast<memref::LoadOp>(op)) {
          Value vector = vector::LoadOp::create(
              rewriter, loc, vectorType, load.getMemRef(),
              firstLane(load.getIndices()), /*nontemporal=*/false, alignment);
          for (int64_t l = 0; l < width; ++l)
            lanes[l].map(load.getResult(),
                         vector::ExtractOp::create(rewriter, loc, vector, l)
                             .getResult());
          continue;
        }
        auto store = cast<memref::StoreOp>(op);
        SmallVector<Value> elements;
        for (int64_t l = 0; l < width; ++l)
          elements.push_back(lanes[l].lookupOrDefault(store.getValueToStore()));
        Value vector =
            vector::FromElementsOp::create(rewriter, loc, vectorType, elements);
        vector::StoreOp::create(rewriter, loc, vector, store.getMemRef(),
                                firstLane(store.getIndices()),
                                /*nontemporal=*/false, alignment);
        continue;
      }
      if (kinds.uniform(&op)) {
        Operation *once = rewriter.clone(op, lanes[0]);
        for (int64_t l = 1; l < width; ++l)
          lanes[l].map(op.getResults(), once->getResults());
        continue;
      }
      for (int64_t l = 0; l < width; ++l)
        rewriter.clone(op, lanes[l]);
    }
  }
  // The scalar loop takes what follows the groups.
  rewriter.modifyOpInPlace(loop, [&] {
    loop.setLowerBound(arith::AddIOp::create(rewriter, loc, groupsEnd, linear));
  });
  return vectorLoop;
}

/// Maps a one-dimensional parallel loop onto a grid: `blocks` blocks of
/// `threads` threads, each thread striding over the iterations
///
///   scf.parallel (%b) = (0) to (blocks) {          // GPU blocks
///     scf.parallel (%t) = (0) to (threads) {       // threads of a block
///       scf.for %i = lb + (b * threads + t) * step to ub
///                    step blocks * threads * step { body }
///
/// with `blocks` the trip count's static bound over `threads`, at most
/// `maxBlocks`: consecutive threads take consecutive iterations (coalesced
/// accesses), a large loop does not launch a block per few hundred
/// iterations, and a trip count read from device memory (the rows an
/// expert computation needs, counted on the device) is read inside the
/// kernel, the launch sized by its bound. Loops without a static bound keep
/// one block per `threads` iterations with a bounds check (their bound is
/// computed on the host; one read from memory is an error). Returns failure
/// with a diagnostic.
LogicalResult mapToGrid(RewriterBase &rewriter, scf::ParallelOp loop,
                        int64_t threads, int64_t maxBlocks,
                        int64_t vectorBytes) {
  Value lb = loop.getLowerBound()[0], ub = loop.getUpperBound()[0],
        step = loop.getStep()[0];
  std::optional<int64_t> lbC = getConstantIntValue(lb),
                         stepC = getConstantIntValue(step), hi = rangeOf(ub).hi;
  if (!lbC || !stepC || *stepC <= 0 || !hi || loop.getNumResults() != 0) {
    // The bound is computed on the host: it must not read memory there.
    if (llvm::any_of(moe::detail::computationOf(ub, loop, /*clonable=*/false),
                     [](Operation *op) { return isa<memref::LoadOp>(op); }))
      return loop.emitError("the trip count of this loop is read from "
                            "memory and has no static bound to size its "
                            "launch on the host");
    scf::tileParallelLoop(loop, {threads}, /*noMinMaxBounds=*/true);
    return success();
  }
  int64_t trips = std::max<int64_t>(0, (*hi - *lbC + *stepC - 1) / *stepC);
  // Groups of consecutive iterations in vectors where the accesses allow;
  // a thread then takes a group where it took an iteration.
  VectorPlan plan;
  if (*stepC == 1 && *lbC >= 0 && vectorBytes >= 2)
    plan = planVectors(loop.getBody(), loop.getInductionVars()[0], vectorBytes);
  if (*lbC % plan.width)
    plan = {};
  int64_t units = (trips + plan.width - 1) / plan.width;
  int64_t blocks =
      std::clamp<int64_t>((units + threads - 1) / threads, 1, maxBlocks);
  Location loc = loop.getLoc();
  auto c = [&](int64_t v) -> Value {
    return arith::ConstantIndexOp::create(rewriter, loc, v);
  };
  rewriter.setInsertionPoint(loop);
  auto grid = scf::ParallelOp::create(rewriter, loc, ValueRange{c(0)},
                                      ValueRange{c(blocks)}, ValueRange{c(1)});
  rewriter.setInsertionPointToStart(grid.getBody());
  auto block =
      scf::ParallelOp::create(rewriter, loc, ValueRange{c(0)},
                              ValueRange{c(threads)}, ValueRange{c(1)});
  rewriter.setInsertionPointToStart(block.getBody());
  Value end = moe::detail::recomputeInside(rewriter, ub, loop, block.getBody());
  Value b = grid.getInductionVars()[0], t = block.getInductionVars()[0];
  Value linear = arith::AddIOp::create(
      rewriter, loc, arith::MulIOp::create(rewriter, loc, b, c(threads)), t);
  Value first = arith::AddIOp::create(
      rewriter, loc, c(*lbC),
      arith::MulIOp::create(rewriter, loc, linear, c(*stepC)));
  auto strided = scf::ForOp::create(rewriter, loc, first, end,
                                    c(blocks * threads * *stepC));
  // The loop's body, on the strided iterations.
  Block *body = loop.getBody();
  Block *into = strided.getBody();
  into->getOperations().splice(into->begin(), body->getOperations(),
                               body->begin(), std::prev(body->end()));
  rewriter.replaceAllUsesWith(body->getArgument(0), strided.getInductionVar());
  rewriter.replaceUsesWithIf(ub, end, [&](OpOperand &use) {
    return strided->isProperAncestor(use.getOwner());
  });
  rewriter.eraseOp(loop);
  // (The plan's operations moved into the strided loop with the body.)
  if (plan.width > 1) {
    scf::ForOp groups = vectorizeLoop(rewriter, strided, *lbC, linear, plan);
    if (units > blocks * threads)
      interleave(rewriter, groups, kVectorUnroll);
  }
  // Threads with several iterations run them kUnroll at a time (with
  // vectors: those past the groups, or all where the buffers are not
  // aligned to the vectors).
  if (trips > blocks * threads)
    interleave(rewriter, strided, kUnroll);
  return success();
}

struct MoEGPUMapLoopsPass : moe::impl::MoEGPUMapLoopsBase<MoEGPUMapLoopsPass> {
  using MoEGPUMapLoopsBase::MoEGPUMapLoopsBase;

  void runOnOperation() override {
    func::FuncOp func = getOperation();
    IRRewriter rewriter(&getContext());
    if (blockSize < 1 || blockSize > 1024) {
      func.emitError("moe-gpu-map-loops: block-size must be in [1, 1024], got ")
          << int64_t(blockSize);
      return signalPassFailure();
    }
    if (maxBlocks < 1 || maxBlocks > (int64_t(1) << 31) - 1) {
      func.emitError("moe-gpu-map-loops: max-blocks must be in [1, 2^31 - 1], "
                     "got ")
          << int64_t(maxBlocks);
      return signalPassFailure();
    }

    if (vectorBytes >= 2 &&
        (!llvm::isPowerOf2_64(vectorBytes) || vectorBytes > 128)) {
      func.emitError("moe-gpu-map-loops: vector-bytes must be a power of two "
                     "up to 128 (or below 2 for scalar accesses), got ")
          << int64_t(vectorBytes);
      return signalPassFailure();
    }

    // linalg -> scf.parallel (+ sequential reduction loops inside).
    SmallVector<linalg::LinalgOp> linalgOps;
    func.walk([&](linalg::LinalgOp op) {
      if (!op->getParentOfType<gpu::LaunchOp>())
        linalgOps.push_back(op);
    });
    for (linalg::LinalgOp op : linalgOps) {
      if (!op.hasPureBufferSemantics()) {
        op.emitError("expects bufferized linalg ops (run one-shot-bufferize "
                     "first)");
        return signalPassFailure();
      }
      // An op without a parallel loop (a reduction to a scalar, a copy of
      // a 0-d buffer) runs in a kernel of one thread; left on the host it
      // would read device memory.
      if (op.getNumParallelLoops() == 0)
        moe::detail::wrapInSingleThreadKernel(rewriter, op);
      rewriter.setInsertionPoint(op);
      if (failed(linalg::linalgOpToParallelLoops(rewriter, op))) {
        op.emitError("could not be turned into parallel loops");
        return signalPassFailure();
      }
      rewriter.eraseOp(op);
    }
    collapsesAsViews(rewriter, func);
    // Loads and stores through views (the rows [0, n) of a buffer that an
    // op computes) go to the buffer itself, and sizes of views are the
    // values they were made from: the views, sized on the host, are then
    // not needed in kernels.
    {
      RewritePatternSet fold(&getContext());
      memref::populateFoldMemRefAliasOpPatterns(fold);
      memref::populateResolveRankedShapedTypeResultDimsPatterns(fold);
      memref::DimOp::getCanonicalizationPatterns(fold, &getContext());
      if (failed(applyPatternsGreedily(func, std::move(fold))))
        return signalPassFailure();
    }

    // Reduction loops keep their accumulators in registers.
    promoteAccumulators(rewriter, func);

    // Flatten every outermost parallel loop nest to one dimension, the
    // dimension that keeps accesses coalesced varying fastest
    // (coalescingOrder), and tile it by the block size: tiles become
    // blocks, the points of a tile the threads of a block (with a bounds
    // guard, so the thread loop has static bounds whatever the problem
    // size).
    SmallVector<scf::ParallelOp> outer;
    func.walk([&](scf::ParallelOp op) {
      if (!op->getParentOfType<scf::ParallelOp>())
        outer.push_back(op);
    });
    for (scf::ParallelOp loop : outer) {
      if (loop.getNumLoops() > 1)
        mlir::collapseParallelLoops(rewriter, loop, {coalescingOrder(loop)});
    }
    outer.clear();
    func.walk([&](scf::ParallelOp op) {
      if (!op->getParentOfType<scf::ParallelOp>())
        outer.push_back(op);
    });
    for (scf::ParallelOp loop : outer)
      if (failed(mapToGrid(rewriter, loop, blockSize, maxBlocks, vectorBytes)))
        return signalPassFailure();
  }
};
} // namespace
