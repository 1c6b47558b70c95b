// RUN: moe-opt %s -split-input-file -moe-autodiff -verify-diagnostics

// What -moe-autodiff refuses, with the op or function at fault.

// expected-error @+1 {{-moe-autodiff: no loss function (a function returning one tensor<f32>) in the module}}
module {
  func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
    return %x : tensor<4xf32>
  }
}

// -----

func.func @experts(%x: tensor<8x4xf32>, %w: tensor<2x4x4xf32>, %off: tensor<3xi32>) -> tensor<f32> {
  // expected-error @+1 {{-moe-autodiff: run -moe-group-experts first}}
  %y = moe.experts %x, %off weights(%w : tensor<2x4x4xf32>) : tensor<8x4xf32>, tensor<3xi32> -> tensor<8x4xf32> {
  ^bb0(%t: tensor<?x4xf32>, %we: tensor<4x4xf32>):
    %c0 = arith.constant 0.0 : f32
    %i0 = arith.constant 0 : index
    %d = tensor.dim %t, %i0 : tensor<?x4xf32>
    %e = tensor.empty(%d) : tensor<?x4xf32>
    %z = linalg.fill ins(%c0 : f32) outs(%e : tensor<?x4xf32>) -> tensor<?x4xf32>
    %m = linalg.matmul ins(%t, %we : tensor<?x4xf32>, tensor<4x4xf32>) outs(%z : tensor<?x4xf32>) -> tensor<?x4xf32>
    moe.yield %m : tensor<?x4xf32>
  }
  %l = tensor.collapse_shape %y [] : tensor<8x4xf32> into tensor<f32>
  return %l : tensor<f32>
}

// -----

func.func @quantized(%x: tensor<32x32xf32>, %w: tensor<2x32x32xf32>, %off: tensor<3xi32>) -> tensor<f32> {
  %q = moe.quantize %w : tensor<2x32x32xf32> -> !moe.mx<2x32x32xf8E4M3FN, axis = 1>
  // expected-error @+1 {{-moe-autodiff: block-scaled operands have no gradient}}
  %y = moe.grouped_matmul %x, %q, %off : tensor<32x32xf32>, !moe.mx<2x32x32xf8E4M3FN, axis = 1>, tensor<3xi32> -> tensor<32x32xf32>
  %c = arith.constant dense<1.0> : tensor<1x32xf32>
  %c0 = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<1x32xf32>
  %z = linalg.fill ins(%c0 : f32) outs(%e : tensor<1x32xf32>) -> tensor<1x32xf32>
  %m = linalg.matmul ins(%c, %y : tensor<1x32xf32>, tensor<32x32xf32>) outs(%z : tensor<1x32xf32>) -> tensor<1x32xf32>
  %ones = arith.constant dense<1.0> : tensor<32x1xf32>
  %e1 = tensor.empty() : tensor<1x1xf32>
  %z1 = linalg.fill ins(%c0 : f32) outs(%e1 : tensor<1x1xf32>) -> tensor<1x1xf32>
  %s = linalg.matmul ins(%m, %ones : tensor<1x32xf32>, tensor<32x1xf32>) outs(%z1 : tensor<1x1xf32>) -> tensor<1x1xf32>
  %l = tensor.collapse_shape %s [] : tensor<1x1xf32> into tensor<f32>
  return %l : tensor<f32>
}

// -----

// expected-error @+1 {{-moe-autodiff: a symbol named 'f_grad' already exists}}
func.func @f(%x: tensor<1xf32>) -> tensor<f32> {
  %c = tensor.collapse_shape %x [] : tensor<1xf32> into tensor<f32>
  return %c : tensor<f32>
}
func.func @f_grad() {
  return
}

// -----

func.func private @external(tensor<1xf32>) -> tensor<1xf32>

func.func @calls_external(%x: tensor<1xf32>) -> tensor<f32> {
  // expected-error @+1 {{-moe-autodiff: the loss depends on a call of a function without a body}}
  %y = func.call @external(%x) : (tensor<1xf32>) -> tensor<1xf32>
  %l = tensor.collapse_shape %y [] : tensor<1xf32> into tensor<f32>
  return %l : tensor<f32>
}

// -----

// expected-error @+1 {{-moe-autodiff: a recursive call}}
func.func private @recurse(%x: tensor<1xf32>) -> tensor<1xf32> {
  // expected-error @+1 {{-moe-autodiff: cannot differentiate the called function}}
  %y = func.call @recurse(%x) : (tensor<1xf32>) -> tensor<1xf32>
  return %y : tensor<1xf32>
}

func.func @calls_recursive(%x: tensor<1xf32>) -> tensor<f32> {
  // expected-error @+1 {{-moe-autodiff: cannot differentiate the called function}}
  %y = func.call @recurse(%x) : (tensor<1xf32>) -> tensor<1xf32>
  %l = tensor.collapse_shape %y [] : tensor<1xf32> into tensor<f32>
  return %l : tensor<f32>
}
