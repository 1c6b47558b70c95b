// RUN: moe-opt %s --convert-moe-to-linalg=parallel=true --canonicalize --moe-gpu-fuse-elementwise | FileCheck %s

// An MX weight only dequantized to bf16 (the Hopper GEMM operand): the
// quantized elements and their dequantization are one pass from f32 to
// bf16; the 8-bit tensor is never materialized. The block amax (a
// reduction) and the scales stay their own passes.
// CHECK-LABEL: func.func @weights(
// CHECK: %[[X:.*]] = tensor.expand_shape %arg0
// CHECK: %[[AMAX:.*]] = linalg.generic {{.*}}"reduction"]} ins(%[[X]] : tensor<4x2x32x128xf32>)
// CHECK: %[[S:.*]] = linalg.generic {{.*}} ins(%[[AMAX]] : tensor<4x2x128xf32>) outs(%{{.*}} : tensor<4x2x128xf8E8M0FNU>)
// CHECK: %[[BF:.*]] = linalg.generic {{.*}} ins(%[[X]], %[[S]], %[[S]] : tensor<4x2x32x128xf32>, tensor<4x2x128xf8E8M0FNU>, tensor<4x2x128xf8E8M0FNU>) outs(%{{.*}} : tensor<4x2x32x128xbf16>)
// CHECK-NOT: -> tensor<4x2x32x128xf8E4M3FN>
// CHECK: %[[OUT:.*]] = tensor.collapse_shape %[[BF]]
// CHECK: return %[[OUT]]
func.func @weights(%w: tensor<4x64x128xf32>) -> tensor<4x64x128xbf16> {
  %q = moe.quantize %w : tensor<4x64x128xf32> -> !moe.mx<4x64x128xf8E4M3FN, axis = 1>
  %d = moe.dequantize %q : !moe.mx<4x64x128xf8E4M3FN, axis = 1> -> tensor<4x64x128xbf16>
  return %d : tensor<4x64x128xbf16>
}

// The 8-bit elements are also a result: computed once, not fused.
// CHECK-LABEL: func.func @also_returned(
// CHECK: %[[Q:.*]] = linalg.generic {{.*}} outs(%{{.*}} : tensor<4x2x32x128xf8E4M3FN>)
// CHECK: linalg.generic {{.*}} ins(%[[Q]], %{{.*}} : tensor<4x2x32x128xf8E4M3FN>, tensor<4x2x128xf8E8M0FNU>)
func.func @also_returned(%w: tensor<4x64x128xf32>)
    -> (tensor<4x64x128xbf16>, tensor<4x64x128xf8E4M3FN>) {
  %q = moe.quantize %w : tensor<4x64x128xf32> -> !moe.mx<4x64x128xf8E4M3FN, axis = 1>
  %d = moe.dequantize %q : !moe.mx<4x64x128xf8E4M3FN, axis = 1> -> tensor<4x64x128xbf16>
  %data, %scales = moe.mx_unpack %q : !moe.mx<4x64x128xf8E4M3FN, axis = 1>
      -> tensor<4x64x128xf8E4M3FN>, tensor<4x2x128xf8E8M0FNU>
  return %d, %data : tensor<4x64x128xbf16>, tensor<4x64x128xf8E4M3FN>
}

// The combine's gradient as autodiff writes it, weights[t, k] * grad[t]
// over [T, K, H], re-sorted by a dispatch (a gather through a
// collapse_shape): the gather computes each product it reads, from the
// weights and the gradient; the [T, K, H] tensor is never materialized.
// CHECK-LABEL: func.func @weighted_gather(
// CHECK-NOT: tensor<16x2x64xf32>
// CHECK: linalg.generic
// CHECK: %[[W:.*]] = tensor.extract %arg0[%{{.*}}, %{{.*}}] : tensor<16x2xf32>
// CHECK: %[[G:.*]] = tensor.extract %arg1[%{{.*}}, %{{.*}}] : tensor<16x64xf32>
// CHECK: arith.mulf %[[W]], %[[G]] : f32
// CHECK-NOT: tensor<16x2x64xf32>
// CHECK: return
func.func @weighted_gather(%w: tensor<16x2xf32>, %g: tensor<16x64xf32>, %idx: tensor<16x2xi32>)
    -> tensor<32x64xf32> {
  %e = tensor.empty() : tensor<16x2x64xf32>
  %p = linalg.generic {indexing_maps = [affine_map<(t, k, h) -> (t, k)>, affine_map<(t, k, h) -> (t, h)>,
                                        affine_map<(t, k, h) -> (t, k, h)>],
                       iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%w, %g : tensor<16x2xf32>, tensor<16x64xf32>) outs(%e : tensor<16x2x64xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %m = arith.mulf %a, %b : f32
    linalg.yield %m : f32
  } -> tensor<16x2x64xf32>
  %c = tensor.collapse_shape %p [[0, 1], [2]] : tensor<16x2x64xf32> into tensor<32x64xf32>
  %i = tensor.collapse_shape %idx [[0, 1]] : tensor<16x2xi32> into tensor<32xi32>
  %i1 = tensor.expand_shape %i [[0, 1]] output_shape [32, 1] : tensor<32xi32> into tensor<32x1xi32>
  %s, %o, %n, %pos = moe.dispatch %c, %i1 experts(4)
      : tensor<32x64xf32>, tensor<32x1xi32> -> tensor<32x64xf32>, tensor<5xi32>, tensor<4xi32>, tensor<32x1xi32>
  return %s : tensor<32x64xf32>
}

// A bf16 weight widened to f32 and rounded back to bf16 for two GEMM
// operands (the bf16 recipe on a bf16 argument): both roundings are the
// argument itself, and the f32 tensor is never written.
// CHECK-LABEL: func.func @round_trip(
// CHECK-SAME: %[[W:.*]]: tensor<4x64x128xbf16>
// CHECK-NOT: linalg.generic
// CHECK: return %[[W]], %[[W]]
func.func @round_trip(%w: tensor<4x64x128xbf16>)
    -> (tensor<4x64x128xbf16>, tensor<4x64x128xbf16>) {
  %f = arith.extf %w : tensor<4x64x128xbf16> to tensor<4x64x128xf32>
  %e = tensor.empty() : tensor<4x64x128xbf16>
  %r1 = linalg.generic {indexing_maps = [affine_map<(a, b, c) -> (a, b, c)>, affine_map<(a, b, c) -> (a, b, c)>],
                        iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%f : tensor<4x64x128xf32>) outs(%e : tensor<4x64x128xbf16>) {
  ^bb0(%in: f32, %out: bf16):
    %t = arith.truncf %in : f32 to bf16
    linalg.yield %t : bf16
  } -> tensor<4x64x128xbf16>
  %r2 = linalg.generic {indexing_maps = [affine_map<(a, b, c) -> (a, b, c)>, affine_map<(a, b, c) -> (a, b, c)>],
                        iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%f : tensor<4x64x128xf32>) outs(%e : tensor<4x64x128xbf16>) {
  ^bb0(%in: f32, %out: bf16):
    %t = arith.truncf %in : f32 to bf16
    linalg.yield %t : bf16
  } -> tensor<4x64x128xbf16>
  return %r1, %r2 : tensor<4x64x128xbf16>, tensor<4x64x128xbf16>
}

// Rounded to another type (f16): a real rounding, kept.
// CHECK-LABEL: func.func @not_a_round_trip(
// CHECK: linalg.generic
// CHECK: arith.truncf %{{.*}} : f32 to f16
func.func @not_a_round_trip(%w: tensor<64xbf16>) -> tensor<64xf16> {
  %f = arith.extf %w : tensor<64xbf16> to tensor<64xf32>
  %e = tensor.empty() : tensor<64xf16>
  %r = linalg.generic {indexing_maps = [affine_map<(a) -> (a)>, affine_map<(a) -> (a)>],
                       iterator_types = ["parallel"]}
      ins(%f : tensor<64xf32>) outs(%e : tensor<64xf16>) {
  ^bb0(%in: f32, %out: f16):
    %t = arith.truncf %in : f32 to f16
    linalg.yield %t : f16
  } -> tensor<64xf16>
  return %r : tensor<64xf16>
}

// A sum over rows of a large tensor (the combine of the expert rows'
// gradients), read where the backward ends: fused there, it would hold the
// rows across the op that makes a large result in between (a weight
// gradient), raising the peak of live tensors, so it is not fused and the
// rows die at the sum. Without the op in between the pair fuses.
// rows = x @ y (a tensor of the block, not the caller's); sum[t, h] =
// rows[8 k + t, h] over k (the rows read inside its body).
// CHECK-LABEL: func.func @held_across(
// CHECK: %[[ROWS:.*]] = linalg.matmul
// CHECK: %[[SUM:.*]] = linalg.generic {{.*}} outs(%{{.*}} : tensor<8x32xf32>)
// CHECK: tensor.extract %[[ROWS]]
// CHECK: %[[BIG:.*]] = linalg.generic {{.*}} outs(%{{.*}} : tensor<128x128xf32>)
// CHECK: %[[OUT:.*]] = linalg.generic {{.*}} ins(%[[SUM]], %{{.*}} : tensor<8x32xf32>, tensor<8x32xf32>) outs(%{{.*}} : tensor<8x32xbf16>)
// CHECK: return %[[OUT]], %[[BIG]]
// CHECK-LABEL: func.func @adjacent(
// CHECK: linalg.matmul
// CHECK-NOT: outs(%{{.*}} : tensor<8x32xf32>)
// CHECK: %[[OUT:.*]] = linalg.generic {{.*}} outs(%{{.*}} : tensor<8x32xbf16>)
// CHECK: tensor.extract
// CHECK: return %[[OUT]]
func.func @held_across(%x: tensor<64x16xf32>, %y: tensor<16x32xf32>, %d: tensor<8x32xf32>, %w: tensor<128x128xf32>)
    -> (tensor<8x32xbf16>, tensor<128x128xf32>) {
  %er = tensor.empty() : tensor<64x32xf32>
  %rows = linalg.matmul ins(%x, %y : tensor<64x16xf32>, tensor<16x32xf32>)
                        outs(%er : tensor<64x32xf32>) -> tensor<64x32xf32>
  %es = tensor.empty() : tensor<8x32xf32>
  %sum = linalg.generic {indexing_maps = [affine_map<(t, h) -> (t, h)>], iterator_types = ["parallel", "parallel"]}
      outs(%es : tensor<8x32xf32>) {
  ^bb0(%o: f32):
    %t = linalg.index 0 : index
    %h = linalg.index 1 : index
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %c8 = arith.constant 8 : index
    %zero = arith.constant 0.0 : f32
    %acc = scf.for %k = %c0 to %c8 step %c1 iter_args(%a = %zero) -> f32 {
      %r0 = arith.muli %k, %c8 : index
      %r = arith.addi %r0, %t : index
      %v = tensor.extract %rows[%r, %h] : tensor<64x32xf32>
      %n = arith.addf %a, %v : f32
      scf.yield %n : f32
    }
    linalg.yield %acc : f32
  } -> tensor<8x32xf32>
  %e2 = tensor.empty() : tensor<128x128xf32>
  %big = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
                         iterator_types = ["parallel", "parallel"]}
      ins(%w : tensor<128x128xf32>) outs(%e2 : tensor<128x128xf32>) {
  ^bb0(%a: f32, %o: f32):
    %m = arith.mulf %a, %a : f32
    linalg.yield %m : f32
  } -> tensor<128x128xf32>
  %eo = tensor.empty() : tensor<8x32xbf16>
  %out = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>,
                                          affine_map<(i, j) -> (i, j)>],
                         iterator_types = ["parallel", "parallel"]}
      ins(%sum, %d : tensor<8x32xf32>, tensor<8x32xf32>) outs(%eo : tensor<8x32xbf16>) {
  ^bb0(%a: f32, %b: f32, %o: bf16):
    %m = arith.addf %a, %b : f32
    %t = arith.truncf %m : f32 to bf16
    linalg.yield %t : bf16
  } -> tensor<8x32xbf16>
  return %out, %big : tensor<8x32xbf16>, tensor<128x128xf32>
}
func.func @adjacent(%x: tensor<64x16xf32>, %y: tensor<16x32xf32>, %d: tensor<8x32xf32>) -> tensor<8x32xbf16> {
  %er = tensor.empty() : tensor<64x32xf32>
  %rows = linalg.matmul ins(%x, %y : tensor<64x16xf32>, tensor<16x32xf32>)
                        outs(%er : tensor<64x32xf32>) -> tensor<64x32xf32>
  %es = tensor.empty() : tensor<8x32xf32>
  %sum = linalg.generic {indexing_maps = [affine_map<(t, h) -> (t, h)>], iterator_types = ["parallel", "parallel"]}
      outs(%es : tensor<8x32xf32>) {
  ^bb0(%o: f32):
    %t = linalg.index 0 : index
    %h = linalg.index 1 : index
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %c8 = arith.constant 8 : index
    %zero = arith.constant 0.0 : f32
    %acc = scf.for %k = %c0 to %c8 step %c1 iter_args(%a = %zero) -> f32 {
      %r0 = arith.muli %k, %c8 : index
      %r = arith.addi %r0, %t : index
      %v = tensor.extract %rows[%r, %h] : tensor<64x32xf32>
      %n = arith.addf %a, %v : f32
      scf.yield %n : f32
    }
    linalg.yield %acc : f32
  } -> tensor<8x32xf32>
  %eo = tensor.empty() : tensor<8x32xbf16>
  %out = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>,
                                          affine_map<(i, j) -> (i, j)>],
                         iterator_types = ["parallel", "parallel"]}
      ins(%sum, %d : tensor<8x32xf32>, tensor<8x32xf32>) outs(%eo : tensor<8x32xbf16>) {
  ^bb0(%a: f32, %b: f32, %o: bf16):
    %m = arith.addf %a, %b : f32
    %t = arith.truncf %m : f32 to bf16
    linalg.yield %t : bf16
  } -> tensor<8x32xbf16>
  return %out : tensor<8x32xbf16>
}
