// RUN: moe-opt %s --moe-gpu-split-reductions | FileCheck %s
// RUN: moe-opt %s --moe-gpu-split-reductions="min-terms=100000" | FileCheck %s --check-prefix=SHORT
// RUN: moe-opt %s --moe-gpu-split-reductions="min-row-terms=16777216" | FileCheck %s --check-prefix=SHORT_ROWS

// A dot product: 1024 partial sums of 64 terms, then their sum. Partial sum
// p takes terms p + 1024 j: the terms [64, 1024], the partial sums' loop
// (parallel, d2) before the reduction (d3).
// CHECK-DAG: #[[DOTA:.+]] = affine_map<(d0, d1, d2, d3) -> (d0, d3, d2)>
// CHECK-DAG: #[[ROWA:.+]] = affine_map<(d0, d1, d2) -> (d0, d2, d1)>
// CHECK-LABEL: func.func @dot
// CHECK: tensor.expand_shape {{.*}} into tensor<1x64x1024xf32>
// CHECK: linalg.generic {indexing_maps = [#[[DOTA]], {{.*}} iterator_types = ["parallel", "parallel", "parallel", "reduction"]
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
// CHECK: tensor.expand_shape {{.*}} into tensor<4096x2048x32xf32>
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
// CHECK: iterator_types = ["parallel", "parallel", "reduction"]
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
// CHECK: tensor.expand_shape {{.*}} into tensor<128x1024x128xf32>
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

// Many short rows along memory (an RMSNorm's sums of squares per head):
// 8 partial sums of 16 terms a row, p + 8 j, so 8 adjacent threads read 32
// adjacent bytes; then the sums of 8.
// CHECK-LABEL: func.func @short_rows
// CHECK: tensor.expand_shape {{.*}} into tensor<65536x16x8xf32>
// CHECK: linalg.generic {indexing_maps = [#[[ROWA]], {{.*}} iterator_types = ["parallel", "parallel", "reduction"]
// CHECK-SAME: outs(%{{.*}} : tensor<65536x8xf32>)
// CHECK: outs(%{{.*}} : tensor<65536xf32>)
// Below min-row-terms they stay.
// SHORT_ROWS-LABEL: func.func @short_rows
// SHORT_ROWS-NOT: tensor.expand_shape
func.func @short_rows(%a: tensor<65536x128xf32>) -> tensor<65536xf32> {
  %c0 = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<65536xf32>
  %z = linalg.fill ins(%c0 : f32) outs(%e : tensor<65536xf32>) -> tensor<65536xf32>
  %s = linalg.generic {indexing_maps = [affine_map<(r, h) -> (r, h)>, affine_map<(r, h) -> (r)>],
                       iterator_types = ["parallel", "reduction"]} ins(%a : tensor<65536x128xf32>) outs(%z : tensor<65536xf32>) {
  ^bb0(%x: f32, %acc: f32):
    %sq = arith.mulf %x, %x : f32
    %sum = arith.addf %acc, %sq : f32
    linalg.yield %sum : f32
  } -> tensor<65536xf32>
  return %s : tensor<65536xf32>
}

// Short reductions down columns (read across rows): splitting would not
// make the reads adjacent; left alone.
// CHECK-LABEL: func.func @short_columns
// CHECK-NOT: tensor.expand_shape
func.func @short_columns(%a: tensor<128x65536xf32>) -> tensor<65536xf32> {
  %c0 = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<65536xf32>
  %z = linalg.fill ins(%c0 : f32) outs(%e : tensor<65536xf32>) -> tensor<65536xf32>
  %s = linalg.generic {indexing_maps = [affine_map<(c, r) -> (r, c)>, affine_map<(c, r) -> (c)>],
                       iterator_types = ["parallel", "reduction"]} ins(%a : tensor<128x65536xf32>) outs(%z : tensor<65536xf32>) {
  ^bb0(%x: f32, %acc: f32):
    %sum = arith.addf %acc, %x : f32
    linalg.yield %sum : f32
  } -> tensor<65536xf32>
  return %s : tensor<65536xf32>
}

// Attention scores over grouped KV heads (key head h floordiv 8): an indexing
// map that is not a projected permutation, which linalg::splitReduction does
// not split correctly; left alone.
// CHECK-LABEL: func.func @grouped_heads
// CHECK-NOT: tensor.expand_shape
func.func @grouped_heads(%q: tensor<1024x32x128xf32>, %k: tensor<1024x4x128xf32>) -> tensor<32x1024x1024xf32> {
  %c0 = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<32x1024x1024xf32>
  %z = linalg.fill ins(%c0 : f32) outs(%e : tensor<32x1024x1024xf32>) -> tensor<32x1024x1024xf32>
  %s = linalg.generic {indexing_maps = [affine_map<(h, i, j, d) -> (i, h, d)>,
                                        affine_map<(h, i, j, d) -> (j, h floordiv 8, d)>,
                                        affine_map<(h, i, j, d) -> (h, i, j)>],
                       iterator_types = ["parallel", "parallel", "parallel", "reduction"]}
      ins(%q, %k : tensor<1024x32x128xf32>, tensor<1024x4x128xf32>) outs(%z : tensor<32x1024x1024xf32>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %m = arith.mulf %x, %y : f32
    %sum = arith.addf %acc, %m : f32
    linalg.yield %sum : f32
  } -> tensor<32x1024x1024xf32>
  return %s : tensor<32x1024x1024xf32>
}
