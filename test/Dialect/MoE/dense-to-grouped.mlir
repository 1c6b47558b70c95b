// RUN: moe-opt %s -split-input-file -moe-dense-to-grouped | FileCheck %s
// RUN: moe-opt %s -moe-dense-to-grouped -moe-autodiff -moe-quantize | FileCheck %s --check-prefix=GRAD
// RUN: moe-opt %s -moe-dense-to-grouped -moe-autodiff "-moe-quantize=dense=mxfp8" | FileCheck %s --check-prefix=MX
// RUN: not moe-opt %s -moe-quantize=dense=fp16 2>&1 | FileCheck %s --check-prefix=BAD

// x @ w: one group of all rows, w viewed as [1, K, N].
// CHECK-LABEL: func.func @loss(
// CHECK-SAME: %[[X:[a-z0-9]+]]: tensor<64x128xf32>, %[[W:[a-z0-9]+]]: tensor<128x256xf32>, %[[H:[a-z0-9]+]]: tensor<512x256xf32>
// CHECK-DAG: %[[OFF:.*]] = arith.constant dense<[0, 64]> : tensor<2xi32>
// CHECK-DAG: %[[W3:.*]] = tensor.expand_shape %[[W]] {{\[\[}}0, 1], [2]] output_shape [1, 128, 256]
// CHECK: %[[Y:.*]] = moe.grouped_matmul %[[X]], %[[W3]], %[[OFF]] {moe.dense} : tensor<64x128xf32>, tensor<1x128x256xf32>, tensor<2xi32> -> tensor<64x256xf32>
// y @ transpose(h): h read transposed, not copied.
// CHECK: %[[H3:.*]] = tensor.expand_shape %[[H]] {{\[\[}}0, 1], [2]] output_shape [1, 512, 256]
// CHECK: moe.grouped_matmul %[[Y]], %[[H3]], %{{.*}} transpose_rhs {moe.dense} : tensor<64x256xf32>, tensor<1x512x256xf32>, tensor<2xi32> -> tensor<64x512xf32>
// CHECK-NOT: linalg.matmul

// Gradients are dense GEMMs too, rounded to bf16 (the default dense
// precision) even under -moe-quantize's default mxfp8 recipe.
// GRAD-LABEL: func.func @loss_grad(
// GRAD: moe.grouped_matmul {{.*}} {moe.dense} : tensor<64x512xbf16>, tensor<1x512x256xbf16>, tensor<2xi32> -> tensor<64x256xf32>
// GRAD: moe.grouped_matmul_wgrad {{.*}} {moe.dense} : tensor<64x512xbf16>, tensor<64x256xbf16>, tensor<2xi32> -> tensor<1x512x256xf32>
// GRAD: moe.grouped_matmul {{.*}} transpose_rhs {moe.dense} : tensor<64x256xbf16>, tensor<1x128x256xbf16>, tensor<2xi32> -> tensor<64x128xf32>
// GRAD: moe.grouped_matmul_wgrad {{.*}} {moe.dense} : tensor<64x128xbf16>, tensor<64x256xbf16>, tensor<2xi32> -> tensor<1x128x256xf32>
// MX-LABEL: func.func @loss_grad(
// MX: moe.grouped_matmul_wgrad {{.*}} {moe.dense} : !moe.mx<64x512xf8E4M3FN, axis = 0>
// BAD: unknown dense precision 'fp16' (expected 'bf16', 'mxfp8' or 'fp8-blockwise')
func.func @loss(%x: tensor<64x128xf32>, %w: tensor<128x256xf32>, %h: tensor<512x256xf32>, %labels: tensor<64xi32>) -> tensor<f32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<64x256xf32>
  %z = linalg.fill ins(%zero : f32) outs(%e : tensor<64x256xf32>) -> tensor<64x256xf32>
  %y = linalg.matmul ins(%x, %w : tensor<64x128xf32>, tensor<128x256xf32>) outs(%z : tensor<64x256xf32>) -> tensor<64x256xf32>
  %et = tensor.empty() : tensor<256x512xf32>
  %ht = linalg.transpose ins(%h : tensor<512x256xf32>) outs(%et : tensor<256x512xf32>) permutation = [1, 0]
  %e2 = tensor.empty() : tensor<64x512xf32>
  %z2 = linalg.fill ins(%zero : f32) outs(%e2 : tensor<64x512xf32>) -> tensor<64x512xf32>
  %l = linalg.matmul ins(%y, %ht : tensor<64x256xf32>, tensor<256x512xf32>) outs(%z2 : tensor<64x512xf32>) -> tensor<64x512xf32>
  %s = moe.cross_entropy %l, %labels : tensor<64x512xf32>, tensor<64xi32> -> tensor<f32>
  return %s : tensor<f32>
}

// -----

// A matmul accumulating into a non-zero tensor, or of dynamic shape, stays.
// CHECK-LABEL: func.func @kept(
// CHECK-COUNT-2: linalg.matmul
// CHECK-NOT: moe.grouped_matmul
func.func @kept(%x: tensor<8x16xf32>, %w: tensor<16x4xf32>, %c: tensor<8x4xf32>,
                %d: tensor<?x16xf32>, %cd: tensor<?x4xf32>) -> (tensor<8x4xf32>, tensor<?x4xf32>) {
  %y = linalg.matmul ins(%x, %w : tensor<8x16xf32>, tensor<16x4xf32>) outs(%c : tensor<8x4xf32>) -> tensor<8x4xf32>
  %zero = arith.constant 0.0 : f32
  %z = linalg.fill ins(%zero : f32) outs(%cd : tensor<?x4xf32>) -> tensor<?x4xf32>
  %v = linalg.matmul ins(%d, %w : tensor<?x16xf32>, tensor<16x4xf32>) outs(%z : tensor<?x4xf32>) -> tensor<?x4xf32>
  return %y, %v : tensor<8x4xf32>, tensor<?x4xf32>
}
