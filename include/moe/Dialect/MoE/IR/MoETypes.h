//===- MoETypes.h - moe dialect types ---------------------------*- C++ -*-===//
#ifndef MOE_DIALECT_MOE_IR_MOETYPES_H
#define MOE_DIALECT_MOE_IR_MOETYPES_H

#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Types.h"

#include "moe/Dialect/MoE/IR/MoETypeInterfaces.h.inc"

#define GET_TYPEDEF_CLASSES
#include "moe/Dialect/MoE/IR/MoETypes.h.inc"

#endif
