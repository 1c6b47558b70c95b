//===- SinkIndexComputations.cpp - index values into the launches -------===//
//
// Clones the constants and index computations a gpu.launch body reads from
// above into the body, so that outlining does not turn them into kernel
// parameters (see -moe-gpu-sink-index-computations in Passes.td). Each
// launch costs a walk of its own body: the replaced uses are found there,
// not among every use of a value (a constant of a train step is read by
// thousands of ops, and visiting them for each launch made this quadratic
// in the step's length).
//
//===----------------------------------------------------------------------===//

#include "moe/Conversion/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/Matchers.h"
#include "mlir/Transforms/RegionUtils.h"
#include "llvm/ADT/SetVector.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEGPUSINKINDEXCOMPUTATIONS
#include "moe/Conversion/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;

namespace {

/// Ops worth a copy in each kernel: no side effects, cheap, and usually
/// what a kernel's bounds and indices are made of.
bool isIndexComputation(Operation *op) {
  return matchPattern(op, m_Constant()) ||
         isa<memref::DimOp, arith::SelectOp, arith::CmpIOp>(op);
}

/// Adds `op` to `sunk` after the ops its operands need, if every operand is
/// a value the kernel has anyway (`read`, or a result of an op already in
/// `sunk`) or a result of an index computation that can be sunk too.
bool collect(Operation *op, const llvm::SetVector<Value> &read,
             llvm::SetVector<Operation *> &sunk) {
  if (sunk.contains(op))
    return true;
  if (!isIndexComputation(op))
    return false;
  for (Value operand : op->getOperands()) {
    Operation *def = operand.getDefiningOp();
    if (def && sunk.contains(def))
      continue;
    if ((!def || !collect(def, read, sunk)) && !read.contains(operand))
      return false;
  }
  sunk.insert(op);
  return true;
}

void sinkInto(gpu::LaunchOp launch) {
  Region &body = launch.getBody();
  llvm::SetVector<Value> read;
  getUsedValuesDefinedAbove(body, read);
  llvm::SetVector<Operation *> sunk;
  for (Value v : read)
    if (Operation *def = v.getDefiningOp())
      (void)collect(def, read, sunk);
  if (sunk.empty())
    return;
  // Copies at the top of the body, defs before uses.
  IRMapping copies;
  OpBuilder b(body);
  SmallPtrSet<Operation *, 16> cloned;
  for (Operation *op : sunk)
    cloned.insert(b.clone(*op, copies));
  // The body's own uses of the originals read the copies.
  body.walk([&](Operation *op) {
    if (cloned.contains(op))
      return;
    for (OpOperand &use : op->getOpOperands())
      if (Value copy = copies.lookupOrNull(use.get()))
        use.set(copy);
  });
}

struct MoEGPUSinkIndexComputationsPass
    : moe::impl::MoEGPUSinkIndexComputationsBase<
          MoEGPUSinkIndexComputationsPass> {
  void runOnOperation() override {
    getOperation().walk([](gpu::LaunchOp launch) { sinkInto(launch); });
  }
};

} // namespace
