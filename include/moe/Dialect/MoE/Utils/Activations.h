//===- Activations.h - scalar SwiGLU arithmetic as arith ops ----*- C++ -*-===//
//
// The one place moe.swiglu's and moe.swiglu_grad's element arithmetic is
// written down as IR. The CPU and GPU lowerings and the GPU GEMM kernel that
// computes SwiGLU in its epilogue all build it from these helpers, so they
// perform the same f32 operations in the same order.
//
//===----------------------------------------------------------------------===//
#ifndef MOE_DIALECT_MOE_UTILS_ACTIVATIONS_H
#define MOE_DIALECT_MOE_UTILS_ACTIVATIONS_H

#include "mlir/IR/Builders.h"

#include <utility>

namespace mlir::moe {

/// sigmoid(x) = 1 / (1 + exp(-x)), f32.
Value buildSigmoid(OpBuilder &b, Location loc, Value x);

/// silu(gate) * up = gate / (1 + exp(-gate)) * up, f32.
Value buildSwiglu(OpBuilder &b, Location loc, Value gate, Value up);

/// The gradients of silu(gate) * up given the result's gradient d, f32:
/// (d * up * s * (1 + gate * (1 - s)), d * gate * s) with s = sigmoid(gate).
std::pair<Value, Value> buildSwigluGrad(OpBuilder &b, Location loc, Value gate,
                                        Value up, Value d);

} // namespace mlir::moe

#endif
