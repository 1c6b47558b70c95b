//===- ReadOnlyArguments.cpp - compiled functions never write inputs ------===//
//
// -moe-read-only-arguments: every tensor argument of a function with a body
// is marked `bufferization.writable = false`, so one-shot bufferization
// copies instead of writing into a caller's buffer; those it updates
// (moe.updates on a result) are marked writable.
//
//===----------------------------------------------------------------------===//

#include "moe/Dialect/MoE/Transforms/Passes.h"

#include "mlir/Dialect/Bufferization/IR/Bufferization.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEREADONLYARGUMENTS
#include "moe/Dialect/MoE/Transforms/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;

namespace {
struct MoEReadOnlyArgumentsPass
    : moe::impl::MoEReadOnlyArgumentsBase<MoEReadOnlyArgumentsPass> {
  void runOnOperation() override {
    getOperation().walk([](func::FuncOp f) {
      if (f.isExternal())
        return;
      // Arguments the function updates (moe.updates on a result) are
      // written in place.
      llvm::SmallDenseSet<int64_t> updated;
      for (unsigned r = 0; r < f.getNumResults(); ++r)
        if (auto u = f.getResultAttrOfType<IntegerAttr>(r, "moe.updates"))
          updated.insert(u.getInt());
      for (unsigned i = 0; i < f.getNumArguments(); ++i)
        if (isa<TensorType>(f.getArgument(i).getType()))
          f.setArgAttr(i,
                       bufferization::BufferizationDialect::kWritableAttrName,
                       BoolAttr::get(f.getContext(), updated.contains(i)));
    });
  }
};
} // namespace
