// RUN: moe-opt %s -moe-dense-to-grouped -moe-autodiff -moe-quantize=recipe=bf16 -canonicalize -cse -moe-reuse-forward-values | FileCheck %s

// A layer called twice: -moe-autodiff splits it once into a forward and a
// backward whose residual is the f32 square; after -moe-quantize both round
// the square and the weight to bf16. -moe-reuse-forward-values makes the
// backward read the forward's bf16 values: they become the residuals (the
// f32 square is no longer one), and every call passes them.

// CHECK-LABEL: func.func private @layer_forward(
// CHECK-SAME: -> (tensor<64x32xf32> {moe.output = "result0"}, tensor<64x32xbf16> {moe.residual = 0 : i64}, tensor<1x32x32xbf16> {moe.residual = 1 : i64})
// CHECK-LABEL: func.func private @layer_backward(
// CHECK-SAME: %{{.*}}: tensor<64x32xf32>, %{{.*}}: tensor<32x32xf32>, %[[SQ:.*]]: tensor<64x32xbf16> {moe.residual = 0 : i64}, %[[W:.*]]: tensor<1x32x32xbf16> {moe.residual = 1 : i64}, %{{.*}}: tensor<64x32xf32> {moe.cotangent})
// CHECK-SAME: attributes {moe.forward = @layer_forward}
// CHECK-NOT: arith.mulf %arg0, %arg0
// CHECK: return
// CHECK-LABEL: func.func @loss_grad(
// CHECK: %[[A:.*]]:3 = call @layer_forward(%arg0, %arg1) {no_inline}
// CHECK: %[[B:.*]]:3 = call @layer_forward(%[[A]]#0, %arg2) {no_inline}
// CHECK: %[[G:.*]]:2 = call @layer_backward(%[[A]]#0, %arg2, %[[B]]#1, %[[B]]#2, %{{.*}}) {no_inline}
// CHECK: call @layer_backward(%arg0, %arg1, %[[A]]#1, %[[A]]#2, %[[G]]#0) {no_inline}
func.func private @layer(%x: tensor<64x32xf32>, %w: tensor<32x32xf32>) -> tensor<64x32xf32> {
  %c0 = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<64x32xf32>
  %z = linalg.fill ins(%c0 : f32) outs(%e : tensor<64x32xf32>) -> tensor<64x32xf32>
  %sq = arith.mulf %x, %x : tensor<64x32xf32>
  %m = linalg.matmul ins(%sq, %w : tensor<64x32xf32>, tensor<32x32xf32>) outs(%z : tensor<64x32xf32>) -> tensor<64x32xf32>
  %y = arith.addf %m, %x : tensor<64x32xf32>
  return %y : tensor<64x32xf32>
}
func.func @loss(%x: tensor<64x32xf32>, %w0: tensor<32x32xf32>, %w1: tensor<32x32xf32>) -> tensor<f32> {
  %a = func.call @layer(%x, %w0) {no_inline} : (tensor<64x32xf32>, tensor<32x32xf32>) -> tensor<64x32xf32>
  %b = func.call @layer(%a, %w1) {no_inline} : (tensor<64x32xf32>, tensor<32x32xf32>) -> tensor<64x32xf32>
  %s = tensor.extract_slice %b[0, 0] [1, 1] [1, 1] : tensor<64x32xf32> to tensor<1x1xf32>
  %l = tensor.collapse_shape %s [] : tensor<1x1xf32> into tensor<f32>
  return %l : tensor<f32>
}
