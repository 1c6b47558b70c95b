//===- MoEDialect.cpp - the moe dialect -----------------------------------===//

#include "moe/Dialect/MoE/IR/MoEDialect.h"
#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Dialect/MoE/IR/MoETypes.h"

#include "mlir/Dialect/Shard/IR/ShardDialect.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::moe;

#include "moe/Dialect/MoE/IR/MoEDialect.cpp.inc"

void MoEDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "moe/Dialect/MoE/IR/MoEOps.cpp.inc"
      >();
  registerTypes();
}
