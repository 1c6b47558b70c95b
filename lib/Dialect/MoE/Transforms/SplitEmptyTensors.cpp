//===- SplitEmptyTensors.cpp - one tensor.empty per use -------------------===//
//
// -moe-split-empty-tensors: each use of a `tensor.empty` gets its own, so
// that one-shot bufferization gives each destination its own buffer, freed
// after its own last use (see the pass description in Passes.td).
//
//===----------------------------------------------------------------------===//

#include "moe/Dialect/MoE/Transforms/Passes.h"

#include "mlir/Dialect/Tensor/IR/Tensor.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOESPLITEMPTYTENSORS
#include "moe/Dialect/MoE/Transforms/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;

namespace {
struct MoESplitEmptyTensorsPass
    : moe::impl::MoESplitEmptyTensorsBase<MoESplitEmptyTensorsPass> {
  void runOnOperation() override {
    getOperation().walk([](tensor::EmptyOp empty) {
      SmallVector<OpOperand *> uses = llvm::map_to_vector(
          empty->getUses(), [](OpOperand &use) { return &use; });
      OpBuilder b(empty->getContext());
      b.setInsertionPointAfter(empty);
      for (OpOperand *use : llvm::drop_begin(uses))
        use->set(b.clone(*empty)->getResult(0));
    });
  }
};
} // namespace
