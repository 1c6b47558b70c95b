//===- MapLoops.cpp - linalg on buffers -> loops mapped to the GPU --------===//

#include "SingleThread.h"

#include "moe/Conversion/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Linalg/Transforms/Transforms.h"
#include "mlir/Analysis/SliceAnalysis.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/MemRef/Transforms/Transforms.h"
#include "mlir/Dialect/Utils/StaticValueUtils.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/SCF/Transforms/Transforms.h"
#include "mlir/Dialect/SCF/Utils/Utils.h"
#include "mlir/IR/PatternMatch.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEGPUMAPLOOPS
#include "moe/Conversion/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;

namespace {

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
    return {div(*a.lo), a.hi ? std::optional<int64_t>(div(*a.hi))
                             : std::nullopt};
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
      // The sizes of a view of a static buffer are at most the buffer's.
      Range r = sub(view.getMixedSizes()[*d].dyn_cast<Value>());
      return {r.lo ? r.lo : std::optional<int64_t>(0), r.hi};
    }
    return {0, std::nullopt};
  }
  return {};
}

/// A loop nest whose trip count is read from memory (the rows an expert
/// computation needs, counted on the device) cannot size a launch on the
/// host. When that count has a static bound, launch for the bound: the
/// loop runs to it, and the bound check the tiling put in the body compares
/// against the count computed inside (its loads and arithmetic cloned there,
/// where the memory is the device's).
LogicalResult boundDynamicTripCount(RewriterBase &rewriter,
                                    scf::ParallelOp loop) {
  SmallVector<Value> ubs(loop.getUpperBound());
  bool changed = false;
  for (auto [d, ub] : llvm::enumerate(ubs)) {
    if (getConstantIntValue(ub))
      continue;
    std::optional<int64_t> hi = rangeOf(ub).hi;
    if (!hi)
      continue; // left as it is (computed on the host)
    // The count's computation, in order.
    BackwardSliceOptions options;
    options.omitBlockArguments = true;
    options.inclusive = true;
    options.filter = [&](Operation *op) {
      return !loop->isAncestor(op) && op->getNumRegions() == 0 &&
             (isPure(op) || isa<memref::LoadOp>(op));
    };
    SetVector<Operation *> slice;
    if (failed(getBackwardSlice(ub, &slice, options)))
      return loop.emitError("cannot trace the loop bound's computation");
    rewriter.setInsertionPointToStart(loop.getBody());
    IRMapping map;
    for (Operation *op : slice)
      rewriter.clone(*op, map);
    Value inside = map.lookupOrDefault(ub);
    rewriter.replaceUsesWithIf(ub, inside, [&](OpOperand &use) {
      return loop->isProperAncestor(use.getOwner());
    });
    rewriter.setInsertionPoint(loop);
    ubs[d] = arith::ConstantIndexOp::create(rewriter, loop.getLoc(), *hi);
    changed = true;
  }
  if (changed)
    rewriter.modifyOpInPlace(loop,
                             [&] { loop.getUpperBoundMutable().assign(ubs); });
  return success();
}

struct MoEGPUMapLoopsPass
    : moe::impl::MoEGPUMapLoopsBase<MoEGPUMapLoopsPass> {
  using MoEGPUMapLoopsBase::MoEGPUMapLoopsBase;

  void runOnOperation() override {
    func::FuncOp func = getOperation();
    IRRewriter rewriter(&getContext());
    if (blockSize < 1 || blockSize > 1024) {
      func.emitError("moe-gpu-map-loops: block-size must be in [1, 1024], got ")
          << blockSize;
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

    // Flatten every outermost parallel loop nest to one dimension and tile
    // it by the block size: tiles become blocks, the points of a tile the
    // threads of a block (with a bounds guard, so the thread loop has static
    // bounds whatever the problem size).
    SmallVector<scf::ParallelOp> outer;
    func.walk([&](scf::ParallelOp op) {
      if (!op->getParentOfType<scf::ParallelOp>())
        outer.push_back(op);
    });
    for (scf::ParallelOp loop : outer) {
      if (loop.getNumLoops() > 1) {
        std::vector<unsigned> all;
        for (unsigned i = 0; i < loop.getNumLoops(); ++i)
          all.push_back(i);
        mlir::collapseParallelLoops(rewriter, loop, {all});
      }
    }
    outer.clear();
    func.walk([&](scf::ParallelOp op) {
      if (!op->getParentOfType<scf::ParallelOp>())
        outer.push_back(op);
    });
    for (scf::ParallelOp loop : outer) {
      auto [tiles, points] =
          scf::tileParallelLoop(loop, {blockSize}, /*noMinMaxBounds=*/true);
      (void)points;
      if (failed(boundDynamicTripCount(rewriter, tiles)))
        return signalPassFailure();
    }
  }
};
} // namespace
