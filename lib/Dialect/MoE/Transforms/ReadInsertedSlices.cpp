//===- ReadInsertedSlices.cpp - reads of inserted tensors from the whole --===//
//
// -moe-read-inserted-slices: a tensor read after `tensor.insert_slice` put it
// into a larger one is read back from that one, so that one-shot
// bufferization does not copy it (see the pass description in Passes.td).
//
//===----------------------------------------------------------------------===//

#include "moe/Dialect/MoE/Transforms/Passes.h"

#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/Interfaces/DestinationStyleOpInterface.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEREADINSERTEDSLICES
#include "moe/Dialect/MoE/Transforms/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;

namespace {
struct MoEReadInsertedSlicesPass
    : moe::impl::MoEReadInsertedSlicesBase<MoEReadInsertedSlicesPass> {
  void runOnOperation() override {
    getOperation().walk([](tensor::InsertSliceOp insert) {
      Value part = insert.getSource();
      Block *block = insert->getBlock();
      for (OpOperand &use : llvm::make_early_inc_range(part.getUses())) {
        Operation *at = block->findAncestorOpInBlock(*use.getOwner());
        if (!at || at == insert.getOperation() || !insert->isBeforeInBlock(at))
          continue;
        // Reads only: writing into a view of the larger tensor would make
        // bufferization copy all of it.
        if (auto dps = dyn_cast<DestinationStyleOpInterface>(use.getOwner()))
          if (dps.isDpsInit(&use))
            continue;
        OpBuilder b(use.getOwner());
        use.set(tensor::ExtractSliceOp::create(
            b, insert.getLoc(), insert.getSourceType(), insert.getResult(),
            insert.getMixedOffsets(), insert.getMixedSizes(),
            insert.getMixedStrides()));
      }
    });
  }
};
} // namespace
