//===- UpdateArgumentsInPlace.cpp - state updated in its own buffers ------===//
//
// -moe-update-arguments-in-place: a result with `moe.updates = i` is written
// into argument i's buffer and leaves the signature (see Passes.td).
//
//===----------------------------------------------------------------------===//

#include "moe/Dialect/MoE/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "llvm/ADT/BitVector.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEUPDATEARGUMENTSINPLACE
#include "moe/Dialect/MoE/Transforms/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;

namespace {

/// `v` without the casts that keep its buffer.
Value stripCasts(Value v) {
  while (auto cast = v.getDefiningOp<memref::CastOp>())
    v = cast.getSource();
  return v;
}

struct UpdateArgumentsInPlacePass
    : moe::impl::MoEUpdateArgumentsInPlaceBase<UpdateArgumentsInPlacePass> {
  void runOnOperation() override {
    func::FuncOp f = getOperation();
    if (f.isExternal())
      return;
    llvm::BitVector drop(f.getNumResults());
    for (unsigned r = 0; r < f.getNumResults(); ++r)
      if (f.getResultAttr(r, "moe.updates"))
        drop.set(r);
    if (drop.none())
      return;
    if (!f.isPublic() || !f.getBody().hasOneBlock()) {
      f.emitOpError("-moe-update-arguments-in-place: a function updating its "
                    "arguments must be public and have one block");
      return signalPassFailure();
    }
    if (auto uses = SymbolTable::getSymbolUses(f, f->getParentOp());
        uses && !uses->empty()) {
      f.emitOpError("-moe-update-arguments-in-place: a function updating its "
                    "arguments must have no callers");
      return signalPassFailure();
    }
    auto ret = cast<func::ReturnOp>(f.getBody().front().getTerminator());
    OpBuilder b(ret);
    for (unsigned r : drop.set_bits()) {
      int64_t i = f.getResultAttrOfType<IntegerAttr>(r, "moe.updates").getInt();
      if (i < 0 || i >= int64_t(f.getNumArguments())) {
        f.emitOpError("-moe-update-arguments-in-place: result ")
            << r << " updates argument " << i << ", which does not exist";
        return signalPassFailure();
      }
      Value arg = f.getArgument(i);
      Value value = ret.getOperand(r);
      if (!isa<MemRefType>(arg.getType()) || arg.getType() != value.getType()) {
        f.emitOpError("-moe-update-arguments-in-place: result ")
            << r << " (" << value.getType() << ") cannot update argument " << i
            << " (" << arg.getType() << "); run after bufferization";
        return signalPassFailure();
      }
      if (stripCasts(value) != arg)
        memref::CopyOp::create(b, ret.getLoc(), value, arg);
    }
    SmallVector<Value> kept;
    for (unsigned r = 0; r < f.getNumResults(); ++r)
      if (!drop.test(r))
        kept.push_back(ret.getOperand(r));
    func::ReturnOp::create(b, ret.getLoc(), kept);
    ret.erase();
    if (failed(f.eraseResults(drop)))
      return signalPassFailure();
  }
};

} // namespace
