//===- MoEOps.h - moe dialect operations ------------------------*- C++ -*-===//
#ifndef MOE_DIALECT_MOE_IR_MOEOPS_H
#define MOE_DIALECT_MOE_IR_MOEOPS_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/ControlFlowInterfaces.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "moe/Dialect/MoE/IR/MoEDialect.h"
#include "moe/Dialect/MoE/IR/MoETypes.h"

#include "moe/Dialect/MoE/IR/MoEEnums.h.inc"

#define GET_OP_CLASSES
#include "moe/Dialect/MoE/IR/MoEOps.h.inc"

#endif
