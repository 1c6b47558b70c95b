//===- BufferAccesses.h - which buffer an op reads or writes ----*- C++ -*-===//
//
// Private to lib/Conversion/MoEToGPU: what the loop mapping (which loops
// may run iterations together) and the traffic report (the bytes a kernel
// moves) both ask of a memory access.
//
//===----------------------------------------------------------------------===//
#ifndef MOE_LIB_CONVERSION_MOETOGPU_BUFFERACCESSES_H
#define MOE_LIB_CONVERSION_MOETOGPU_BUFFERACCESSES_H

#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/Interfaces/ViewLikeInterface.h"

namespace mlir::moe::detail {

/// The buffer (allocation or argument) a memref is a view of.
inline Value viewRoot(Value memref) {
  while (auto view = memref.getDefiningOp<ViewLikeOpInterface>())
    memref = view.getViewSource();
  return memref;
}

/// A memref or vector load or store, or an atomic update: the memref it
/// accesses and whether it reads and writes it.
struct BufferAccess {
  Value memref;
  bool reads, writes;
};
inline std::optional<BufferAccess> bufferAccess(Operation *op) {
  if (auto load = dyn_cast<memref::LoadOp>(op))
    return BufferAccess{load.getMemRef(), true, false};
  if (auto load = dyn_cast<vector::LoadOp>(op))
    return BufferAccess{load.getBase(), true, false};
  if (auto store = dyn_cast<memref::StoreOp>(op))
    return BufferAccess{store.getMemRef(), false, true};
  if (auto store = dyn_cast<vector::StoreOp>(op))
    return BufferAccess{store.getBase(), false, true};
  if (auto rmw = dyn_cast<memref::AtomicRMWOp>(op))
    return BufferAccess{rmw.getMemref(), true, true};
  return std::nullopt;
}

} // namespace mlir::moe::detail

#endif
