// The optimizer inside a train step (-moe-autodiff, then -moe-adamw: global
// norm clipping and AdamW, updating the parameters and both moments in
// place) on the GPU against the CPU (scripts/gpu-check.sh runs the passes of
// the GPU-CHECK-PASSES line first). moert-check gives the step realistic
// optimizer scalars and non-negative second moments, and compares the
// loss, the gradient norm and every updated argument. The GPU sums matmuls
// and the norm's squares in another order and takes tanh from libdevice:
// the loss and norm agree to a few ulps; an update divides by
// sqrt(v) + eps, which turns the gradient's relative differences into
// absolute ones of about 1e-7 on parameters of order 1.
// GPU-CHECK-PASSES: -moe-autodiff -moe-adamw
// RUN: moe-opt %s -moe-autodiff -moe-adamw | moe-compile - --target=sm_90a --verify-ptx -o %t.so | FileCheck %s
// CHECK: ptxas accepted 45 kernel modules for sm_90a
// RUN: moe-opt %s -moe-autodiff -moe-adamw | moe-compile - --target=cpu -o %t.cpu.so

// w2's 384 x 383 and g's 383 (prime) elements: sums of squares of one row
// of 65536 or fewer, and of 383 rows of one element.
func.func @loss(%x: tensor<256x512xf32> {moe.no_grad}, %w: tensor<512x384xf32>, %g: tensor<383xf32>, %w2: tensor<384x383xf32>) -> tensor<f32>
    attributes {moe.test_tolerance = [1.0e-5, 1.0e-4]} {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<256x384xf32>
  %z = linalg.fill ins(%zero : f32) outs(%e : tensor<256x384xf32>) -> tensor<256x384xf32>
  %h = linalg.matmul ins(%x, %w : tensor<256x512xf32>, tensor<512x384xf32>) outs(%z : tensor<256x384xf32>) -> tensor<256x384xf32>
  %e2 = tensor.empty() : tensor<256x383xf32>
  %z2 = linalg.fill ins(%zero : f32) outs(%e2 : tensor<256x383xf32>) -> tensor<256x383xf32>
  %h2 = linalg.matmul ins(%h, %w2 : tensor<256x384xf32>, tensor<384x383xf32>) outs(%z2 : tensor<256x383xf32>) -> tensor<256x383xf32>
  %n = moe.rms_norm %h2, %g eps(1.0e-6) : tensor<256x383xf32>, tensor<383xf32> -> tensor<256x383xf32>
  %t = math.tanh %n : tensor<256x383xf32>
  %f = tensor.collapse_shape %t [[0, 1]] : tensor<256x383xf32> into tensor<98048xf32>
  %r = tensor.expand_shape %f [[0, 1]] output_shape [1, 98048] : tensor<98048xf32> into tensor<1x98048xf32>
  %ones = arith.constant dense<1.0e-2> : tensor<98048x1xf32>
  %e1 = tensor.empty() : tensor<1x1xf32>
  %z1 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<1x1xf32>) -> tensor<1x1xf32>
  %m = linalg.matmul ins(%r, %ones : tensor<1x98048xf32>, tensor<98048x1xf32>) outs(%z1 : tensor<1x1xf32>) -> tensor<1x1xf32>
  %l = tensor.collapse_shape %m [] : tensor<1x1xf32> into tensor<f32>
  return %l : tensor<f32>
}
