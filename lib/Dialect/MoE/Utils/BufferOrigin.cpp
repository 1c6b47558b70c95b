//===- BufferOrigin.cpp - the buffer a memref views -----------------------===//

#include "moe/Dialect/MoE/Utils/BufferOrigin.h"

#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mlir/Interfaces/ViewLikeInterface.h"

using namespace mlir;

Value mlir::moe::viewedBuffer(Value value) {
  while (Operation *def = value.getDefiningOp()) {
    if (auto view = dyn_cast<ViewLikeOpInterface>(def)) {
      value = view.getViewSource();
      continue;
    }
    if (auto metadata = dyn_cast<memref::ExtractStridedMetadataOp>(def)) {
      if (value != metadata.getBaseBuffer())
        return {};
      value = metadata.getSource();
      continue;
    }
    if (hasEffect<MemoryEffects::Allocate>(def, value))
      return value;
    return {};
  }
  return value;
}
