//===- BufferOrigin.h - the buffer a memref views ---------------*- C++ -*-===//
//
// After bufferization a memref value is an allocation, an argument, or a view
// of one of those (a subview, a reshape, a cast, the base buffer that
// memref.extract_strided_metadata returns). Passes that place or split
// deallocations ask which buffer a value views.
//
//===----------------------------------------------------------------------===//
#ifndef MOE_DIALECT_MOE_UTILS_BUFFERORIGIN_H
#define MOE_DIALECT_MOE_UTILS_BUFFERORIGIN_H

#include "mlir/IR/Value.h"

namespace mlir::moe {

/// The buffer `value` is, or is a view of: followed through view-like ops and
/// memref.extract_strided_metadata's base buffer up to a value that its op
/// allocates or a block argument. Null when the chain ends anywhere else (a
/// call's result, a loaded memref, another result of the metadata op).
Value viewedBuffer(Value value);

} // namespace mlir::moe

#endif // MOE_DIALECT_MOE_UTILS_BUFFERORIGIN_H
