//===- SingleThread.h - running an op in a kernel of one thread -*- C++ -*-===//
//
// Private to lib/Conversion/MoEToGPU: what the loop mapping (ops without a
// parallel loop) and the device-buffer pass (host loops over device
// buffers) both do.
//
//===----------------------------------------------------------------------===//
#ifndef MOE_LIB_CONVERSION_MOETOGPU_SINGLETHREAD_H
#define MOE_LIB_CONVERSION_MOETOGPU_SINGLETHREAD_H

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/IR/PatternMatch.h"

namespace mlir::moe::detail {

/// Moves `op` (which has no results used outside it) into a `gpu.launch` of
/// one block of one thread, created where `op` was.
inline void wrapInSingleThreadKernel(RewriterBase &rewriter, Operation *op) {
  rewriter.setInsertionPoint(op);
  Location loc = op->getLoc();
  Value one = arith::ConstantIndexOp::create(rewriter, loc, 1);
  auto launch =
      gpu::LaunchOp::create(rewriter, loc, one, one, one, one, one, one);
  rewriter.setInsertionPointToEnd(&launch.getBody().front());
  auto terminator = gpu::TerminatorOp::create(rewriter, loc);
  op->moveBefore(terminator);
}

} // namespace mlir::moe::detail

#endif
