//===- MapLoops.cpp - linalg on buffers -> loops mapped to the GPU --------===//

#include "SingleThread.h"

#include "moe/Conversion/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Linalg/Transforms/Transforms.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
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
    for (scf::ParallelOp loop : outer)
      scf::tileParallelLoop(loop, {blockSize}, /*noMinMaxBounds=*/true);
  }
};
} // namespace
