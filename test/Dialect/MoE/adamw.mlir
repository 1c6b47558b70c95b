// RUN: moe-opt %s -split-input-file -moe-autodiff -moe-adamw -verify-diagnostics | FileCheck %s
// RUN: moe-opt %s -split-input-file -moe-autodiff -moe-adamw -verify-diagnostics -moe-cpu-pipeline -o /dev/null

// @loss_grad becomes @loss_step: the moments of each differentiated argument
// (in argument order, first moments then second), the step's scalars; the
// loss, the norm, and the new values with the argument each updates.
// CHECK-LABEL: func.func @loss_step(
// CHECK-SAME: %[[X:[a-z0-9]+]]: tensor<4x8xf32> {moe.no_grad}
// CHECK-SAME: %[[W:[a-z0-9]+]]: tensor<8x2xf32>
// CHECK-SAME: %[[G:[a-z0-9]+]]: tensor<2xf32>
// CHECK-SAME: %[[MW:[a-z0-9]+]]: tensor<8x2xf32> {moe.state = "exp_avg", moe.state_of = 1 : i64}
// CHECK-SAME: %[[MG:[a-z0-9]+]]: tensor<2xf32> {moe.state = "exp_avg", moe.state_of = 2 : i64}
// CHECK-SAME: %[[VW:[a-z0-9]+]]: tensor<8x2xf32> {moe.state = "exp_avg_sq", moe.state_of = 1 : i64}
// CHECK-SAME: %[[VG:[a-z0-9]+]]: tensor<2xf32> {moe.state = "exp_avg_sq", moe.state_of = 2 : i64}
// CHECK-SAME: %[[S:[a-z0-9]+]]: tensor<8xf32> {moe.input = "adamw"})
// CHECK-SAME: -> (tensor<f32> {moe.loss}, tensor<f32> {moe.grad_norm},
// CHECK-SAME: tensor<8x2xf32> {moe.updates = 1 : i64}, tensor<2xf32> {moe.updates = 2 : i64},
// CHECK-SAME: tensor<8x2xf32> {moe.updates = 3 : i64}, tensor<2xf32> {moe.updates = 4 : i64},
// CHECK-SAME: tensor<8x2xf32> {moe.updates = 5 : i64}, tensor<2xf32> {moe.updates = 6 : i64})
// Sums of squares in f64, [rows / u, u, width] summed down the rows (u at a
// time), then across.
// CHECK: tensor.expand_shape %{{.*}} {{\[\[}}0, 1, 2]] output_shape [1, 1, 16] : tensor<16xf32> into tensor<1x1x16xf32>
// CHECK: arith.extf %{{.*}} : f32 to f64
// CHECK: -> tensor<16xf64>
// CHECK: -> tensor<f64>
// The norm and the clipping factor.
// CHECK: math.sqrt %{{.*}} : f64
// CHECK: arith.select
// CHECK: -> (tensor<f32>, tensor<f32>)
// The matrix decays; the vector does not.
// CHECK: linalg.generic
// CHECK-SAME: outs(%[[W]], %[[MW]], %[[VW]] : tensor<8x2xf32>, tensor<8x2xf32>, tensor<8x2xf32>)
// CHECK-COUNT-2: arith.mulf
// CHECK: math.sqrt
// CHECK: linalg.generic
// CHECK-SAME: outs(%[[G]], %[[MG]], %[[VG]] : tensor<2xf32>, tensor<2xf32>, tensor<2xf32>)
// CHECK-NEXT: ^bb0
// CHECK-NEXT: arith.mulf
// CHECK-NEXT: arith.constant 1.0
// CHECK-NOT: func.func @loss_grad
func.func @loss(%x: tensor<4x8xf32> {moe.no_grad}, %w: tensor<8x2xf32>, %g: tensor<2xf32>) -> tensor<f32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<4x2xf32>
  %z = linalg.fill ins(%zero : f32) outs(%e : tensor<4x2xf32>) -> tensor<4x2xf32>
  %h = linalg.matmul ins(%x, %w : tensor<4x8xf32>, tensor<8x2xf32>) outs(%z : tensor<4x2xf32>) -> tensor<4x2xf32>
  %n = moe.rms_norm %h, %g eps(1.0e-6) : tensor<4x2xf32>, tensor<2xf32> -> tensor<4x2xf32>
  %f = tensor.collapse_shape %n [[0, 1]] : tensor<4x2xf32> into tensor<8xf32>
  %r = tensor.expand_shape %f [[0, 1]] output_shape [1, 8] : tensor<8xf32> into tensor<1x8xf32>
  %ones = arith.constant dense<1.0> : tensor<8x1xf32>
  %e1 = tensor.empty() : tensor<1x1xf32>
  %z1 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<1x1xf32>) -> tensor<1x1xf32>
  %m = linalg.matmul ins(%r, %ones : tensor<1x8xf32>, tensor<8x1xf32>) outs(%z1 : tensor<1x1xf32>) -> tensor<1x1xf32>
  %l = tensor.collapse_shape %m [] : tensor<1x1xf32> into tensor<f32>
  return %l : tensor<f32>
}

// -----

// An expert shard's squares are summed over its grid's ranks; a shard
// without a grid is refused.
// expected-error@+1 {{argument 0 is an expert shard (moe.expert_shard) without the grid of its ranks}}
func.func @loss(%w: tensor<2x4x4xf32> {moe.expert_shard = {experts = 4 : i64, local_experts = 2 : i64}}) -> tensor<f32> {
  %c = tensor.collapse_shape %w [[0, 1, 2]] : tensor<2x4x4xf32> into tensor<32xf32>
  %row = tensor.expand_shape %c [[0, 1]] output_shape [1, 32] : tensor<32xf32> into tensor<1x32xf32>
  %col = tensor.expand_shape %c [[0, 1]] output_shape [32, 1] : tensor<32xf32> into tensor<32x1xf32>
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<1x1xf32>
  %z = linalg.fill ins(%zero : f32) outs(%e : tensor<1x1xf32>) -> tensor<1x1xf32>
  %m = linalg.matmul ins(%row, %col : tensor<1x32xf32>, tensor<32x1xf32>) outs(%z : tensor<1x1xf32>) -> tensor<1x1xf32>
  %l = tensor.collapse_shape %m [] : tensor<1x1xf32> into tensor<f32>
  return %l : tensor<f32>
}

// -----

// With its grid: the shard's sum of squares is summed over the ranks (the
// other parameters' gradients are the same on every rank).
// CHECK-LABEL: func.func @sharded_step(
// CHECK: %[[SQ:.*]] = linalg.generic {{.*}} ins(%{{.*}} : tensor<32xf64>) outs(%{{.*}} : tensor<f64>)
// CHECK: %[[ALL:.*]] = shard.all_reduce %[[SQ]] on @ep grid_axes = [0] : tensor<f64> -> tensor<f64>
// CHECK: linalg.generic {{.*}} ins(%[[ALL]], %{{.*}} : tensor<f64>, tensor<f32>)
// CHECK: math.sqrt
shard.grid @ep(shape = 2)
func.func @sharded(%w: tensor<2x4x4xf32> {moe.expert_shard = {experts = 4 : i64, grid = "ep", local_experts = 2 : i64}}) -> tensor<f32> {
  %c = tensor.collapse_shape %w [[0, 1, 2]] : tensor<2x4x4xf32> into tensor<32xf32>
  %row = tensor.expand_shape %c [[0, 1]] output_shape [1, 32] : tensor<32xf32> into tensor<1x32xf32>
  %col = tensor.expand_shape %c [[0, 1]] output_shape [32, 1] : tensor<32xf32> into tensor<32x1xf32>
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<1x1xf32>
  %z = linalg.fill ins(%zero : f32) outs(%e : tensor<1x1xf32>) -> tensor<1x1xf32>
  %m = linalg.matmul ins(%row, %col : tensor<1x32xf32>, tensor<32x1xf32>) outs(%z : tensor<1x1xf32>) -> tensor<1x1xf32>
  %l = tensor.collapse_shape %m [] : tensor<1x1xf32> into tensor<f32>
  return %l : tensor<f32>
}

// -----

// Experts spread over axis 1 of a data x expert grid: the squares are summed
// over that axis (the copies on axis 0 hold the same gradients).
// CHECK-LABEL: func.func @sharded_2d_step(
// CHECK: %[[SQ:.*]] = linalg.generic {{.*}} ins(%{{.*}} : tensor<32xf64>) outs(%{{.*}} : tensor<f64>)
// CHECK: shard.all_reduce %[[SQ]] on @dpep grid_axes = [1] : tensor<f64> -> tensor<f64>
shard.grid @dpep(shape = 2x2)
func.func @sharded_2d(%w: tensor<2x4x4xf32> {moe.expert_shard = {axis = 1 : i64, experts = 4 : i64, grid = "dpep", local_experts = 2 : i64}}) -> tensor<f32> {
  %c = tensor.collapse_shape %w [[0, 1, 2]] : tensor<2x4x4xf32> into tensor<32xf32>
  %row = tensor.expand_shape %c [[0, 1]] output_shape [1, 32] : tensor<32xf32> into tensor<1x32xf32>
  %col = tensor.expand_shape %c [[0, 1]] output_shape [32, 1] : tensor<32xf32> into tensor<32x1xf32>
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<1x1xf32>
  %z = linalg.fill ins(%zero : f32) outs(%e : tensor<1x1xf32>) -> tensor<1x1xf32>
  %m = linalg.matmul ins(%row, %col : tensor<1x32xf32>, tensor<32x1xf32>) outs(%z : tensor<1x1xf32>) -> tensor<1x1xf32>
  %l = tensor.collapse_shape %m [] : tensor<1x1xf32> into tensor<f32>
  return %l : tensor<f32>
}

// -----

shard.grid @ep(shape = 2)
// expected-error@+1 {{argument 0 is an expert shard over axis 1 of the 1-d grid @ep}}
func.func @bad_axis(%w: tensor<2x4x4xf32> {moe.expert_shard = {axis = 1 : i64, experts = 4 : i64, grid = "ep", local_experts = 2 : i64}}) -> tensor<f32> {
  %c = tensor.collapse_shape %w [[0, 1, 2]] : tensor<2x4x4xf32> into tensor<32xf32>
  %row = tensor.expand_shape %c [[0, 1]] output_shape [1, 32] : tensor<32xf32> into tensor<1x32xf32>
  %col = tensor.expand_shape %c [[0, 1]] output_shape [32, 1] : tensor<32xf32> into tensor<32x1xf32>
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<1x1xf32>
  %z = linalg.fill ins(%zero : f32) outs(%e : tensor<1x1xf32>) -> tensor<1x1xf32>
  %m = linalg.matmul ins(%row, %col : tensor<1x32xf32>, tensor<32x1xf32>) outs(%z : tensor<1x1xf32>) -> tensor<1x1xf32>
  %l = tensor.collapse_shape %m [] : tensor<1x1xf32> into tensor<f32>
  return %l : tensor<f32>
}

// -----

// Outputs of the loss function (moe.output) pass through both passes: after
// the gradients in @loss_grad, after the loss and the norm in @loss_step.
// CHECK-LABEL: func.func @counted(
// CHECK-LABEL: func.func @counted_step(
// CHECK-SAME: -> (tensor<f32> {moe.loss}, tensor<f32> {moe.grad_norm}, tensor<4xi32> {moe.output = "picks"}, tensor<1x4xf32> {moe.updates = 0 : i64}
// CHECK: return %{{.*}}, %{{.*}}, %arg1, %{{.*}}, %{{.*}}, %{{.*}} :
func.func @counted(%w: tensor<1x4xf32>, %picks: tensor<4xi32>) -> (tensor<f32>, tensor<4xi32> {moe.output = "picks"}) {
  %c = tensor.collapse_shape %w [[0, 1]] : tensor<1x4xf32> into tensor<4xf32>
  %col = tensor.expand_shape %c [[0, 1]] output_shape [4, 1] : tensor<4xf32> into tensor<4x1xf32>
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<1x1xf32>
  %z = linalg.fill ins(%zero : f32) outs(%e : tensor<1x1xf32>) -> tensor<1x1xf32>
  %m = linalg.matmul ins(%w, %col : tensor<1x4xf32>, tensor<4x1xf32>) outs(%z : tensor<1x1xf32>) -> tensor<1x1xf32>
  %l = tensor.collapse_shape %m [] : tensor<1x1xf32> into tensor<f32>
  return %l, %picks : tensor<f32>, tensor<4xi32>
}
