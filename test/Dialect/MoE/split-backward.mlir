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

// An MoE layer: the expert MLP's output ([tokens x top-k, hidden], the
// largest tensor of the layer) is not a residual. The backward dispatches
// the tokens again and recomputes the MLP from the same operands as its
// gradient (after -moe-expand-grouped-mlp on the GPU, only the down
// projection is new work); the residuals are the router's logits, indices
// and weights.

// CHECK-LABEL: func.func @moe_layer_grad_forward(
// CHECK-SAME: -> (tensor<8x32xf32> {moe.output = "y"}, tensor<8x4xf32> {moe.residual = 0 : i64}, tensor<8x2xi32> {moe.residual = 1 : i64}, tensor<8x2xf32> {moe.residual = 2 : i64})
// CHECK: moe.grouped_mlp
// CHECK: %[[OUT:.*]] = moe.combine
// CHECK: return %[[OUT]], %{{.*}}, %{{.*}}, %{{.*}} : tensor<8x32xf32>, tensor<8x4xf32>, tensor<8x2xi32>, tensor<8x2xf32>

// CHECK-LABEL: func.func @moe_layer_grad_backward(
// CHECK-SAME: %[[X:[^:]*]]: tensor<8x32xf32>, %{{[^:]*}}: tensor<32x4xf32>, %[[W1:[^:]*]]: tensor<4x32x32xf32>, %[[W2:[^:]*]]: tensor<4x16x32xf32>, %{{[^:]*}}: tensor<8x4xf32> {moe.residual = 0 : i64}, %[[IDX:[^:]*]]: tensor<8x2xi32> {moe.residual = 1 : i64}
// CHECK: %[[ROWS:.*]], %[[OFF:.*]], %{{.*}}, %[[POS:.*]] = moe.dispatch %[[X]], %[[IDX]]
// CHECK: %[[Y:.*]] = moe.grouped_mlp %[[ROWS]], %[[W1]], %[[W2]], %[[OFF]]
// CHECK: moe.combine_grad %[[Y]], %[[POS]]
// CHECK: moe.grouped_mlp_backward %[[ROWS]], %[[W1]], %[[W2]], %[[OFF]]
// CHECK-NOT: func.func @moe_layer_grad(

func.func @moe_layer(%x: tensor<8x32xf32>, %router_w: tensor<32x4xf32>, %w1: tensor<4x32x32xf32>,
                     %w2: tensor<4x16x32xf32>, %dy: tensor<8x32xf32> {moe.cotangent})
    -> (tensor<f32>, tensor<8x32xf32> {moe.output = "y"}) {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<8x4xf32>
  %z = linalg.fill ins(%zero : f32) outs(%e : tensor<8x4xf32>) -> tensor<8x4xf32>
  %logits = linalg.matmul ins(%x, %router_w : tensor<8x32xf32>, tensor<32x4xf32>)
                          outs(%z : tensor<8x4xf32>) -> tensor<8x4xf32>
  %idx, %w = moe.router %logits top_k(2) softmax norm_topk_prob
      : tensor<8x4xf32> -> tensor<8x2xi32>, tensor<8x2xf32>
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4)
      : tensor<8x32xf32>, tensor<8x2xi32>
      -> tensor<16x32xf32>, tensor<5xi32>, tensor<4xi32>, tensor<8x2xi32>
  %y = moe.grouped_mlp %s, %w1, %w2, %o
      : tensor<16x32xf32>, tensor<4x32x32xf32>, tensor<4x16x32xf32>, tensor<5xi32> -> tensor<16x32xf32>
  %out = moe.combine %y, %w, %p
      : tensor<16x32xf32>, tensor<8x2xf32>, tensor<8x2xi32> -> tensor<8x32xf32>
  %prod = arith.mulf %out, %dy : tensor<8x32xf32>
  %ones_c = arith.constant dense<1.0> : tensor<32x1xf32>
  %er = tensor.empty() : tensor<8x1xf32>
  %zr = linalg.fill ins(%zero : f32) outs(%er : tensor<8x1xf32>) -> tensor<8x1xf32>
  %rows = linalg.matmul ins(%prod, %ones_c : tensor<8x32xf32>, tensor<32x1xf32>) outs(%zr : tensor<8x1xf32>) -> tensor<8x1xf32>
  %flat = tensor.collapse_shape %rows [[0, 1]] : tensor<8x1xf32> into tensor<8xf32>
  %row = tensor.expand_shape %flat [[0, 1]] output_shape [1, 8] : tensor<8xf32> into tensor<1x8xf32>
  %ones_r = arith.constant dense<1.0> : tensor<8x1xf32>
  %e1 = tensor.empty() : tensor<1x1xf32>
  %z1 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<1x1xf32>) -> tensor<1x1xf32>
  %m = linalg.matmul ins(%row, %ones_r : tensor<1x8xf32>, tensor<8x1xf32>) outs(%z1 : tensor<1x1xf32>) -> tensor<1x1xf32>
  %loss = tensor.collapse_shape %m [] : tensor<1x1xf32> into tensor<f32>
  return %loss, %out : tensor<f32>, tensor<8x32xf32>
}
