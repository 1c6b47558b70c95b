//===- TensorLiveness.cpp - bytes of live tensors along a block -----------===//

#include "moe/Dialect/MoE/Utils/TensorLiveness.h"

#include "moe/Dialect/MoE/IR/MoETypes.h"

#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Operation.h"

using namespace mlir;
using namespace mlir::moe;

int64_t mlir::moe::tensorBytes(Value value) {
  auto bytesOf = [](Type type) -> int64_t {
    auto tensor = dyn_cast<RankedTensorType>(type);
    if (!tensor || !tensor.hasStaticShape())
      return 0;
    Type elt = tensor.getElementType();
    int64_t bits = elt.isIndex()         ? 64
                   : elt.isIntOrFloat()  ? elt.getIntOrFloatBitWidth()
                                         : 0;
    return tensor.getNumElements() * llvm::divideCeil(bits, 8);
  };
  if (auto mx = dyn_cast<MXTensorType>(value.getType())) {
    if (ShapedType::isDynamicShape(mx.getShape()))
      return 0;
    return bytesOf(mx.getDataType()) + bytesOf(mx.getScalesType());
  }
  return bytesOf(value.getType());
}

BlockLiveness::BlockLiveness(Block &block,
                             llvm::function_ref<bool(Value)> counted) {
  unsigned n = 0;
  for (Operation &op : block)
    positions[&op] = n++;
  SmallVector<int64_t> delta(n + 1, 0);
  for (Operation &op : block) {
    unsigned def = positions[&op];
    for (Value v : op.getResults()) {
      int64_t bytes = tensorBytes(v);
      if (!bytes || (counted && !counted(v)))
        continue;
      unsigned last = def;
      for (Operation *user : v.getUsers())
        if (Operation *at = block.findAncestorOpInBlock(*user))
          last = std::max(last, positions[at]);
      delta[def] += bytes;
      delta[last + 1] -= bytes;
    }
  }
  live.resize(n);
  int64_t running = 0;
  for (unsigned i = 0; i < n; ++i)
    live[i] = running += delta[i];
}

int64_t BlockLiveness::peak() const { return peak(0, live.size()); }

int64_t BlockLiveness::peak(unsigned from, unsigned to) const {
  int64_t most = 0;
  for (unsigned i = from; i < to && i < live.size(); ++i)
    most = std::max(most, live[i]);
  return most;
}

void BlockLiveness::add(unsigned from, unsigned to, int64_t bytes) {
  for (unsigned i = from; i < to && i < live.size(); ++i)
    live[i] += bytes;
}
