//===- TensorLiveness.h - bytes of live tensors along a block ---*- C++ -*-===//
//
// Before bufferization, each statically shaped tensor that an op of a block
// defines becomes a buffer, and -moe-buffer-lifetimes frees it after the
// last op of the block that reaches it. This estimates those buffers at
// tensor level, so that passes that order or pair ops can keep a step's
// peak memory from growing: a destination-style op writes into its init's
// buffer (a new one for a tensor.empty), a reshape or cast is its source's
// buffer, a use inside an op's regions counts at that op, and block
// arguments belong to the caller and are not counted.
//
//===----------------------------------------------------------------------===//
#ifndef MOE_DIALECT_MOE_UTILS_TENSORLIVENESS_H
#define MOE_DIALECT_MOE_UTILS_TENSORLIVENESS_H

#include "mlir/IR/Block.h"
#include "mlir/IR/BuiltinTypeInterfaces.h"
#include "mlir/IR/Value.h"
#include "mlir/Support/LLVM.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/STLFunctionalExtras.h"

namespace mlir::moe {

/// Bytes of a statically shaped tensor or memref of integer, index (8 bytes)
/// or float elements; none for anything else.
std::optional<int64_t> shapedBytes(ShapedType type);

/// Bytes of the buffer `value` becomes: a statically shaped ranked tensor of
/// integer, index or float elements, or an MX tensor (data and scales); 0
/// for anything else.
int64_t tensorBytes(Value value);

/// The value whose buffer `value` is (bufferization's in-place rules, the
/// common cases): a reshape or cast is its source's buffer, a destination-
/// style op's result its init's, unless the init is a tensor.empty (then the
/// result is a buffer of its own).
Value bufferOf(Value value);

/// The ops of `block` each of its buffers reaches, by the rules above: for
/// every tensor result `v` of an op of the block (not a tensor.empty) whose
/// buffer bufferOf(v) is defined in the block, calls `reach(buffer, at)`
/// with the op defining `v`, the buffer's owner and the block ancestor of
/// every user of `v` (in that order; an op can come more than once). The
/// buffer lives from its owner to the last of them.
void forEachBufferReach(Block &block,
                        llvm::function_ref<void(Value, Operation *)> reach);

/// The live tensor bytes of a block, op by op. `counted`, if given, says
/// which values become buffers (a caller knows of values a later fusion
/// never materializes).
class BlockLiveness {
public:
  explicit BlockLiveness(Block &block,
                         llvm::function_ref<bool(Value)> counted = nullptr);

  /// The position of `op` (an op of the block) in it.
  unsigned position(Operation *op) const { return positions.lookup(op); }
  /// Bytes live while the op at position `i` runs: what ops at or before it
  /// define and it or a later op reads.
  int64_t at(unsigned i) const { return live[i]; }
  /// The most bytes live at once.
  int64_t peak() const;
  /// The most bytes live at once over positions [from, to).
  int64_t peak(unsigned from, unsigned to) const;
  /// Adds `bytes` at positions [from, to) (a value made live longer).
  void add(unsigned from, unsigned to, int64_t bytes);
  /// The position of the last op that reads `buffer` (a bufferOf value of
  /// the block) or a value that is that buffer; none for a value that is no
  /// buffer of the block (an argument's, a tensor.empty).
  std::optional<unsigned> lastUse(Value buffer) const;

private:
  llvm::DenseMap<Operation *, unsigned> positions;
  llvm::DenseMap<Value, unsigned> lastUses;
  SmallVector<int64_t> live;
};

} // namespace mlir::moe

#endif // MOE_DIALECT_MOE_UTILS_TENSORLIVENESS_H
