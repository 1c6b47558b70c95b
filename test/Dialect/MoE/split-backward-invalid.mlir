// RUN: moe-opt %s -split-input-file -moe-split-backward -verify-diagnostics

// What -moe-split-backward refuses, with the op or function at fault.

func.func @depends(%x: tensor<4xf32>, %dy: tensor<4xf32> {moe.cotangent})
    -> (tensor<f32> {moe.loss}, tensor<4xf32> {moe.output = "y"}, tensor<4xf32> {moe.gradient_of = 0 : i64}) {
  // expected-error @+1 {{-moe-split-backward: an output depends on a cotangent through this op}}
  %y = arith.mulf %x, %dy : tensor<4xf32>
  %l = arith.constant dense<0.0> : tensor<f32>
  return %l, %y, %dy : tensor<f32>, tensor<4xf32>, tensor<4xf32>
}

// -----

// expected-error @+1 {{-moe-split-backward: no result marked moe.output (the forward would return nothing)}}
func.func @no_output(%x: tensor<4xf32>, %dy: tensor<4xf32> {moe.cotangent})
    -> (tensor<f32> {moe.loss}, tensor<4xf32> {moe.gradient_of = 0 : i64}) {
  %l = arith.constant dense<0.0> : tensor<f32>
  return %l, %dy : tensor<f32>, tensor<4xf32>
}

// -----

// expected-error @+1 {{-moe-split-backward: result #1 is neither an output, a gradient nor the loss}}
func.func @stray(%x: tensor<4xf32>, %dy: tensor<4xf32> {moe.cotangent})
    -> (tensor<f32> {moe.loss}, tensor<4xf32>) {
  %l = arith.constant dense<0.0> : tensor<f32>
  return %l, %x : tensor<f32>, tensor<4xf32>
}
