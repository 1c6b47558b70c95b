// RUN: moe-opt %s --moe-gpu-split-reductions | FileCheck %s
// RUN: moe-opt %s --moe-gpu-split-reductions="min-terms=100000" | FileCheck %s --check-prefix=SHORT

// A dot product: 1024 partial sums of 64 terms, then their sum.
// CHECK-LABEL: func.func @dot
// CHECK: tensor.expand_shape {{.*}} into tensor<1x1024x64xf32>
// CHECK: linalg.generic {{.*}} iterator_types = ["parallel", "parallel", "parallel", "reduction"]
// CHECK-SAME: outs(%{{.*}} : tensor<1x1x1024xf32>)
// CHECK: linalg.generic {{.*}} iterator_types = ["parallel", "parallel", "reduction"]
// CHECK-SAME: outs(%{{.*}} : tensor<1x1xf32>)
// Below min-terms the op stays.
// SHORT-LABEL: func.func @dot
// SHORT: linalg.matmul
func.func @dot(%a: tensor<1x65536xf32>, %b: tensor<65536x1xf32>) -> tensor<1x1xf32> {
  %c0 = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<1x1xf32>
  %z = linalg.fill ins(%c0 : f32) outs(%e : tensor<1x1xf32>) -> tensor<1x1xf32>
  %m = linalg.matmul ins(%a, %b : tensor<1x65536xf32>, tensor<65536x1xf32>) outs(%z : tensor<1x1xf32>) -> tensor<1x1xf32>
  return %m : tensor<1x1xf32>
}

// Enough parallel work around the reduction: left alone.
// CHECK-LABEL: func.func @rows
// CHECK: linalg.matmul
// CHECK-NOT: tensor.expand_shape
func.func @rows(%a: tensor<65536x4096xf32>, %b: tensor<4096x1xf32>) -> tensor<65536x1xf32> {
  %c0 = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<65536x1xf32>
  %z = linalg.fill ins(%c0 : f32) outs(%e : tensor<65536x1xf32>) -> tensor<65536x1xf32>
  %m = linalg.matmul ins(%a, %b : tensor<65536x4096xf32>, tensor<4096x1xf32>) outs(%z : tensor<65536x1xf32>) -> tensor<65536x1xf32>
  return %m : tensor<65536x1xf32>
}

// Some parallel work: split to about `threads` (2^17) partial sums, here
// 4096 rows x 32 partial sums of 2048 terms.
// CHECK-LABEL: func.func @few_rows
// CHECK: tensor.expand_shape {{.*}} into tensor<4096x32x2048xf32>
// CHECK: outs(%{{.*}} : tensor<4096x1x32xf32>)
func.func @few_rows(%a: tensor<4096x65536xf32>, %b: tensor<65536x1xf32>) -> tensor<4096x1xf32> {
  %c0 = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<4096x1xf32>
  %z = linalg.fill ins(%c0 : f32) outs(%e : tensor<4096x1xf32>) -> tensor<4096x1xf32>
  %m = linalg.matmul ins(%a, %b : tensor<4096x65536xf32>, tensor<65536x1xf32>) outs(%z : tensor<4096x1xf32>) -> tensor<4096x1xf32>
  return %m : tensor<4096x1xf32>
}

// A hidden-size norm's weight gradient over 4096 tokens: 2048 columns, each
// 64 partial sums of 64 rows.
// CHECK-LABEL: func.func @norm_columns
// CHECK: tensor.expand_shape {{.*}} into tensor<64x64x2048xf32>
// CHECK: outs(%{{.*}} : tensor<2048x64xf32>)
func.func @norm_columns(%a: tensor<4096x2048xf32>) -> tensor<2048xf32> {
  %c0 = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<2048xf32>
  %z = linalg.fill ins(%c0 : f32) outs(%e : tensor<2048xf32>) -> tensor<2048xf32>
  %s = linalg.generic {indexing_maps = [affine_map<(h, r) -> (r, h)>, affine_map<(h, r) -> (h)>],
                       iterator_types = ["parallel", "reduction"]} ins(%a : tensor<4096x2048xf32>) outs(%z : tensor<2048xf32>) {
  ^bb0(%x: f32, %acc: f32):
    %sum = arith.addf %acc, %x : f32
    linalg.yield %sum : f32
  } -> tensor<2048xf32>
  return %s : tensor<2048xf32>
}

// A combiner under a select is not a recognized reduction: left alone.
// CHECK-LABEL: func.func @guarded
// CHECK: linalg.generic
// CHECK-NOT: tensor.expand_shape
func.func @guarded(%a: tensor<65536xf32>) -> tensor<f32> {
  %c0 = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<f32>
  %z = linalg.fill ins(%c0 : f32) outs(%e : tensor<f32>) -> tensor<f32>
  %s = linalg.generic {indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> ()>],
                       iterator_types = ["reduction"]} ins(%a : tensor<65536xf32>) outs(%z : tensor<f32>) {
  ^bb0(%x: f32, %acc: f32):
    %pos = arith.cmpf ogt, %x, %c0 : f32
    %sum = arith.addf %acc, %x : f32
    %r = arith.select %pos, %sum, %acc : f32
    linalg.yield %r : f32
  } -> tensor<f32>
  return %s : tensor<f32>
}

// Column sums of many rows (a norm's weight gradient): 128 columns, each
// 1024 partial sums of 128 rows, then their sum.
// CHECK-LABEL: func.func @columns
// CHECK: tensor.expand_shape {{.*}} into tensor<1024x128x128xf32>
// CHECK: linalg.generic {{.*}} iterator_types = ["parallel", "parallel", "reduction"]
// CHECK-SAME: outs(%{{.*}} : tensor<128x1024xf32>)
// CHECK: linalg.generic {{.*}} iterator_types = ["parallel", "reduction"]
// CHECK-SAME: outs(%{{.*}} : tensor<128xf32>)
func.func @columns(%a: tensor<131072x128xf32>) -> tensor<128xf32> {
  %c0 = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<128xf32>
  %z = linalg.fill ins(%c0 : f32) outs(%e : tensor<128xf32>) -> tensor<128xf32>
  %s = linalg.generic {indexing_maps = [affine_map<(h, r) -> (r, h)>, affine_map<(h, r) -> (h)>],
                       iterator_types = ["parallel", "reduction"]} ins(%a : tensor<131072x128xf32>) outs(%z : tensor<128xf32>) {
  ^bb0(%x: f32, %acc: f32):
    %sum = arith.addf %acc, %x : f32
    linalg.yield %sum : f32
  } -> tensor<128xf32>
  return %s : tensor<128xf32>
}
