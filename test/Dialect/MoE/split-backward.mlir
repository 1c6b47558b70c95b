// RUN: moe-opt %s -moe-autodiff -moe-split-backward | FileCheck %s
// RUN: moe-opt %s -moe-autodiff -moe-split-backward -moe-cpu-pipeline -o /dev/null

// A loss sum(out * dy) with bf16 arguments and output: the train step becomes
// the forward (the output, then the residuals the backward reads) and the
// backward (the arguments again, the residuals, the cotangent). The widened
// arguments are recomputed by the backward, not kept; the tanh's output is
// a residual (its gradient reads it), and the tanh is not computed twice.

// CHECK-LABEL: func.func @layer(
// CHECK-LABEL: func.func @layer_grad_forward(
// CHECK-SAME: %[[X:.*]]: tensor<8x4xbf16>, %[[W:.*]]: tensor<4x4xbf16>)
// CHECK-SAME: -> (tensor<8x4xbf16> {moe.output = "y"}, tensor<8x4xf32> {moe.residual = 0 : i64})
// CHECK: %[[T:.*]] = math.tanh
// CHECK: %[[Y:.*]] = arith.truncf %[[T]]
// CHECK-NOT: linalg.matmul
// CHECK: return %[[Y]], %[[T]] : tensor<8x4xbf16>, tensor<8x4xf32>

// CHECK-LABEL: func.func @layer_grad_backward(
// CHECK-SAME: %[[BX:.*]]: tensor<8x4xbf16>, %[[BW:.*]]: tensor<4x4xbf16>, %[[R:.*]]: tensor<8x4xf32> {moe.residual = 0 : i64}, %[[DY:.*]]: tensor<8x4xf32> {moe.cotangent})
// CHECK-SAME: -> (tensor<8x4xbf16> {moe.gradient_of = 0 : i64}, tensor<4x4xbf16> {moe.gradient_of = 1 : i64})
// CHECK-DAG: arith.extf %[[BX]]
// CHECK-DAG: arith.extf %[[BW]]
// CHECK-NOT: math.tanh
// CHECK: arith.mulf %[[R]], %[[R]]
// CHECK: return
// CHECK-NOT: func.func @layer_grad(

func.func @layer(%x: tensor<8x4xbf16>, %w: tensor<4x4xbf16>, %dy: tensor<8x4xf32> {moe.cotangent})
    -> (tensor<f32>, tensor<8x4xbf16> {moe.output = "y"}) {
  %xf = arith.extf %x : tensor<8x4xbf16> to tensor<8x4xf32>
  %wf = arith.extf %w : tensor<4x4xbf16> to tensor<4x4xf32>
  %c0 = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<8x4xf32>
  %z = linalg.fill ins(%c0 : f32) outs(%e : tensor<8x4xf32>) -> tensor<8x4xf32>
  %m = linalg.matmul ins(%xf, %wf : tensor<8x4xf32>, tensor<4x4xf32>) outs(%z : tensor<8x4xf32>) -> tensor<8x4xf32>
  %t = math.tanh %m : tensor<8x4xf32>
  %y = arith.truncf %t : tensor<8x4xf32> to tensor<8x4xbf16>
  %p = arith.mulf %t, %dy : tensor<8x4xf32>
  %ones = arith.constant dense<1.0> : tensor<1x8xf32>
  %e1 = tensor.empty() : tensor<1x4xf32>
  %z1 = linalg.fill ins(%c0 : f32) outs(%e1 : tensor<1x4xf32>) -> tensor<1x4xf32>
  %s = linalg.matmul ins(%ones, %p : tensor<1x8xf32>, tensor<8x4xf32>) outs(%z1 : tensor<1x4xf32>) -> tensor<1x4xf32>
  %ones4 = arith.constant dense<1.0> : tensor<4x1xf32>
  %e2 = tensor.empty() : tensor<1x1xf32>
  %z2 = linalg.fill ins(%c0 : f32) outs(%e2 : tensor<1x1xf32>) -> tensor<1x1xf32>
  %s2 = linalg.matmul ins(%s, %ones4 : tensor<1x4xf32>, tensor<4x1xf32>) outs(%z2 : tensor<1x1xf32>) -> tensor<1x1xf32>
  %loss = tensor.collapse_shape %s2 [] : tensor<1x1xf32> into tensor<f32>
  return %loss, %y : tensor<f32>, tensor<8x4xbf16>
}
