//===- SingleThread.h - host code moved into kernels ------------*- C++ -*-===//
//
// Private to lib/Conversion/MoEToGPU: what the loop mapping (ops without a
// parallel loop, trip counts read from memory) and the device-buffer pass
// (host loops over device buffers, values kernels use that the host reads
// from device memory) both do.
//
//===----------------------------------------------------------------------===//
#ifndef MOE_LIB_CONVERSION_MOETOGPU_SINGLETHREAD_H
#define MOE_LIB_CONVERSION_MOETOGPU_SINGLETHREAD_H

#include "mlir/Analysis/SliceAnalysis.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/Utils/StaticValueUtils.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

namespace mlir::moe::detail {

/// The ops outside `loop` that compute `v`, in order; with `clonable`, only
/// through ops that can be computed again anywhere (pure ops and loads,
/// without regions).
inline SetVector<Operation *> computationOf(Value v, Operation *loop,
                                            bool clonable) {
  BackwardSliceOptions options;
  options.omitBlockArguments = true;
  options.inclusive = true;
  options.filter = [&](Operation *op) {
    return !loop->isAncestor(op) &&
           (!clonable || (op->getNumRegions() == 0 &&
                          (isPure(op) || isa<memref::LoadOp>(op))));
  };
  SetVector<Operation *> slice;
  (void)getBackwardSlice(v, &slice, options);
  return slice;
}

/// `v` computed again at the start of `into` (inside `loop`): its
/// computation cloned (a trip count read from device memory is read again
/// inside the kernel, where that memory is readable).
inline Value recomputeInside(RewriterBase &rewriter, Value v, Operation *loop,
                             Block *into) {
  if (getConstantIntValue(v))
    return v;
  OpBuilder::InsertionGuard guard(rewriter);
  rewriter.setInsertionPointToStart(into);
  IRMapping map;
  for (Operation *op : computationOf(v, loop, /*clonable=*/true))
    rewriter.clone(*op, map);
  return map.lookupOrDefault(v);
}

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
