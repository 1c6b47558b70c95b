//===- TensorLiveness.cpp - bytes of live tensors along a block -----------===//

#include "moe/Dialect/MoE/Utils/TensorLiveness.h"

#include "moe/Dialect/MoE/IR/MoETypes.h"

#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Operation.h"
#include "mlir/Interfaces/DestinationStyleOpInterface.h"

using namespace mlir;
using namespace mlir::moe;

std::optional<int64_t> mlir::moe::shapedBytes(ShapedType type) {
  if (!type || !type.hasStaticShape())
    return std::nullopt;
  Type elt = type.getElementType();
  // index: 64 bits on every target the pipelines lower to.
  int64_t bits = elt.isIndex()        ? 64
                 : elt.isIntOrFloat() ? elt.getIntOrFloatBitWidth()
                                      : 0;
  if (!bits)
    return std::nullopt;
  return type.getNumElements() * int64_t(llvm::divideCeil(bits, 8));
}

int64_t mlir::moe::tensorBytes(Value value) {
  auto bytesOf = [](Type type) {
    auto tensor = dyn_cast<RankedTensorType>(type);
    return tensor ? shapedBytes(tensor).value_or(0) : 0;
  };
  if (auto scaled = dyn_cast<BlockScaledType>(value.getType())) {
    if (ShapedType::isDynamicShape(scaled.getShape()))
      return 0;
    return bytesOf(scaled.getDataType()) + bytesOf(scaled.getScalesType());
  }
  return bytesOf(value.getType());
}

Value mlir::moe::bufferOf(Value value) {
  while (Operation *def = value.getDefiningOp()) {
    if (isa<tensor::CollapseShapeOp, tensor::ExpandShapeOp, tensor::CastOp>(
            def)) {
      value = def->getOperand(0);
      continue;
    }
    auto dps = dyn_cast<DestinationStyleOpInterface>(def);
    auto result = dyn_cast<OpResult>(value);
    if (!dps || !result || result.getResultNumber() >= dps.getNumDpsInits())
      break;
    Value init = dps.getDpsInitOperand(result.getResultNumber())->get();
    if (init.getDefiningOp<tensor::EmptyOp>())
      break;
    value = init;
  }
  return value;
}

void mlir::moe::forEachBufferReach(
    Block &block, llvm::function_ref<void(Value, Operation *)> reach) {
  for (Operation &op : block)
    for (Value v : op.getResults()) {
      if (!isa<RankedTensorType, MXTensorType>(v.getType()) ||
          isa<tensor::EmptyOp>(op))
        continue;
      Value buffer = bufferOf(v);
      Operation *owner = buffer.getDefiningOp();
      if (!owner || owner->getBlock() != &block)
        continue;
      reach(buffer, &op);
      reach(buffer, owner);
      for (Operation *user : v.getUsers())
        if (Operation *at = block.findAncestorOpInBlock(*user))
          reach(buffer, at);
    }
}

BlockLiveness::BlockLiveness(Block &block,
                             llvm::function_ref<bool(Value)> counted) {
  unsigned n = 0;
  for (Operation &op : block)
    positions[&op] = n++;
  // Each buffer: defined where its value is, live until the last use of
  // any value that is that buffer.
  forEachBufferReach(block, [&](Value buffer, Operation *at) {
    unsigned p = positions[at];
    auto [it, inserted] = lastUses.try_emplace(buffer, p);
    if (!inserted)
      it->second = std::max(it->second, p);
  });
  SmallVector<int64_t> delta(n + 1, 0);
  for (auto [buffer, last] : lastUses) {
    int64_t bytes = tensorBytes(buffer);
    if (!bytes || (counted && !counted(buffer)))
      continue;
    delta[positions[buffer.getDefiningOp()]] += bytes;
    delta[last + 1] -= bytes;
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

std::optional<unsigned> BlockLiveness::lastUse(Value buffer) const {
  auto it = lastUses.find(buffer);
  if (it == lastUses.end())
    return std::nullopt;
  return it->second;
}

void BlockLiveness::add(unsigned from, unsigned to, int64_t bytes) {
  for (unsigned i = from; i < to && i < live.size(); ++i)
    live[i] += bytes;
}
