// RUN: moe-opt %s -moe-split-empty-tensors | FileCheck %s

// One tensor.empty per use, so that each destination bufferizes to its own
// buffer.
// CHECK-LABEL: func.func @two_destinations
// CHECK: %[[A:.*]] = tensor.empty() : tensor<4xf32>
// CHECK: %[[B:.*]] = tensor.empty() : tensor<4xf32>
// CHECK: linalg.fill ins(%arg0 : f32) outs(%[[B]]
// CHECK: linalg.fill ins(%arg1 : f32) outs(%[[A]]
func.func @two_destinations(%v: f32, %w: f32) -> (tensor<4xf32>, tensor<4xf32>) {
  %e = tensor.empty() : tensor<4xf32>
  %a = linalg.fill ins(%v : f32) outs(%e : tensor<4xf32>) -> tensor<4xf32>
  %b = linalg.fill ins(%w : f32) outs(%e : tensor<4xf32>) -> tensor<4xf32>
  return %a, %b : tensor<4xf32>, tensor<4xf32>
}
