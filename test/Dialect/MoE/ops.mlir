// RUN: moe-opt %s | moe-opt | FileCheck %s
// RUN: moe-opt %s --mlir-print-op-generic | moe-opt | FileCheck %s

// Round trip of every moe op and of the !moe.mx type, in all their forms:
// printed (custom) form and generic form must both parse back to the same IR.

//===----------------------------------------------------------------------===//
// moe.router
//===----------------------------------------------------------------------===//

// CHECK-LABEL: func.func @router_forms
// CHECK-SAME: (%[[L:.*]]: tensor<16x8xf32>, %[[LB:.*]]: tensor<?x128xbf16>)
func.func @router_forms(%logits: tensor<16x8xf32>, %lbf16: tensor<?x128xbf16>) {
  // CHECK: moe.router %[[L]] top_k(2) softmax : tensor<16x8xf32> -> tensor<16x2xi32>, tensor<16x2xf32>
  %i0, %w0 = moe.router %logits top_k(2) softmax
      : tensor<16x8xf32> -> tensor<16x2xi32>, tensor<16x2xf32>
  // CHECK: moe.router %[[L]] top_k(2) softmax norm_topk_prob : tensor<16x8xf32> -> tensor<16x2xi32>, tensor<16x2xf32>
  %i1, %w1 = moe.router %logits top_k(2) softmax norm_topk_prob
      : tensor<16x8xf32> -> tensor<16x2xi32>, tensor<16x2xf32>
  // CHECK: moe.router %[[L]] bias(%{{.*}} : tensor<8xf32>) top_k(2) sigmoid norm_topk_prob : tensor<16x8xf32> -> tensor<16x2xi32>, tensor<16x2xf32>
  %bias = arith.constant dense<0.5> : tensor<8xf32>
  %ib, %wb = moe.router %logits bias(%bias : tensor<8xf32>) top_k(2) sigmoid norm_topk_prob
      : tensor<16x8xf32> -> tensor<16x2xi32>, tensor<16x2xf32>
  // CHECK: moe.router %[[L]] top_k(3) softmax softmax_after_topk : tensor<16x8xf32> -> tensor<16x3xi64>, tensor<16x3xf32>
  %i2, %w2 = moe.router %logits top_k(3) softmax softmax_after_topk
      : tensor<16x8xf32> -> tensor<16x3xi64>, tensor<16x3xf32>
  // CHECK: moe.router %[[L]] top_k(4) softmax softmax_after_topk norm_topk_prob : tensor<16x8xf32> -> tensor<16x4xi32>, tensor<16x4xf32>
  %i3, %w3 = moe.router %logits top_k(4) softmax softmax_after_topk norm_topk_prob
      : tensor<16x8xf32> -> tensor<16x4xi32>, tensor<16x4xf32>
  // CHECK: moe.router %[[L]] top_k(8) sigmoid : tensor<16x8xf32> -> tensor<16x8xi32>, tensor<16x8xf32>
  %i4, %w4 = moe.router %logits top_k(8) sigmoid
      : tensor<16x8xf32> -> tensor<16x8xi32>, tensor<16x8xf32>
  // CHECK: moe.router %[[L]] top_k(1) sigmoid norm_topk_prob : tensor<16x8xf32> -> tensor<16x1xi32>, tensor<16x1xf32>
  %i5, %w5 = moe.router %logits top_k(1) sigmoid norm_topk_prob
      : tensor<16x8xf32> -> tensor<16x1xi32>, tensor<16x1xf32>
  // Dynamic token count, bf16 logits, DeepSeek-V3-sized expert count.
  // CHECK: moe.router %[[LB]] top_k(8) sigmoid norm_topk_prob : tensor<?x128xbf16> -> tensor<?x8xi32>, tensor<?x8xf32>
  %i6, %w6 = moe.router %lbf16 top_k(8) sigmoid norm_topk_prob
      : tensor<?x128xbf16> -> tensor<?x8xi32>, tensor<?x8xf32>
  // A discardable attribute survives the round trip.
  // CHECK: moe.router %[[L]] top_k(2) softmax {tag = "layer0"} : tensor<16x8xf32> -> tensor<16x2xi32>, tensor<16x2xf32>
  %i7, %w7 = moe.router %logits top_k(2) softmax {tag = "layer0"}
      : tensor<16x8xf32> -> tensor<16x2xi32>, tensor<16x2xf32>
  return
}

//===----------------------------------------------------------------------===//
// moe.dispatch
//===----------------------------------------------------------------------===//

// CHECK-LABEL: func.func @dispatch_forms
// CHECK-SAME: (%[[X:.*]]: tensor<6x16xbf16>, %[[IDX:.*]]: tensor<6x2xi32>, %[[IDX64:.*]]: tensor<6x2xi64>)
func.func @dispatch_forms(%x: tensor<6x16xbf16>, %idx: tensor<6x2xi32>,
                          %idx64: tensor<6x2xi64>) {
  // Dropless: 6 tokens x 2 slots = 12 rows.
  // CHECK: moe.dispatch %[[X]], %[[IDX]] experts(4) : tensor<6x16xbf16>, tensor<6x2xi32> -> tensor<12x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  %s0, %o0, %c0, %p0 = moe.dispatch %x, %idx experts(4)
      : tensor<6x16xbf16>, tensor<6x2xi32>
      -> tensor<12x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  // More rows than needed is fine.
  // CHECK: moe.dispatch %[[X]], %[[IDX64]] experts(4) : tensor<6x16xbf16>, tensor<6x2xi64> -> tensor<20x16xbf16>, tensor<5xi64>, tensor<4xi64>, tensor<6x2xi64>
  %s1, %o1, %c1, %p1 = moe.dispatch %x, %idx64 experts(4)
      : tensor<6x16xbf16>, tensor<6x2xi64>
      -> tensor<20x16xbf16>, tensor<5xi64>, tensor<4xi64>, tensor<6x2xi64>
  // Capacity ceil(1.0 * 12 / 4) = 3 per expert: 12 rows.
  // CHECK: moe.dispatch %[[X]], %[[IDX]] experts(4) capacity_factor(1.000000e+00) : tensor<6x16xbf16>, tensor<6x2xi32> -> tensor<12x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  %s2, %o2, %c2, %p2 = moe.dispatch %x, %idx experts(4) capacity_factor(1.0)
      : tensor<6x16xbf16>, tensor<6x2xi32>
      -> tensor<12x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  // Capacity ceil(0.5 * 12 / 4) = 2 per expert: 8 rows.
  // CHECK: moe.dispatch %[[X]], %[[IDX]] experts(4) capacity_factor(5.000000e-01) : tensor<6x16xbf16>, tensor<6x2xi32> -> tensor<8x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  %s3, %o3, %c3, %p3 = moe.dispatch %x, %idx experts(4) capacity_factor(0.5)
      : tensor<6x16xbf16>, tensor<6x2xi32>
      -> tensor<8x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  // pad_to(32), dropless: (12 + 4*31) rounded down to 32 = 128 rows.
  // CHECK: moe.dispatch %[[X]], %[[IDX]] experts(4) pad_to(32) : tensor<6x16xbf16>, tensor<6x2xi32> -> tensor<128x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  %s4, %o4, %c4, %p4 = moe.dispatch %x, %idx experts(4) pad_to(32)
      : tensor<6x16xbf16>, tensor<6x2xi32>
      -> tensor<128x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  // Capacity and padding: C = ceil(1.25 * 12 / 4) = 4, 4 experts x 4 rows.
  // CHECK: moe.dispatch %[[X]], %[[IDX]] experts(4) capacity_factor(1.250000e+00) pad_to(4) : tensor<6x16xbf16>, tensor<6x2xi32> -> tensor<16x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  %s5, %o5, %c5, %p5 = moe.dispatch %x, %idx experts(4) capacity_factor(1.25) pad_to(4)
      : tensor<6x16xbf16>, tensor<6x2xi32>
      -> tensor<16x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  // A capacity factor so large (or infinite) that nothing is ever dropped
  // needs only the dropless 12 rows.
  // CHECK: moe.dispatch %[[X]], %[[IDX]] experts(4) capacity_factor(1.000000e+300) : tensor<6x16xbf16>, tensor<6x2xi32> -> tensor<12x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  %s7, %o7, %c7, %p7 = moe.dispatch %x, %idx experts(4) capacity_factor(1.0e300)
      : tensor<6x16xbf16>, tensor<6x2xi32>
      -> tensor<12x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  // CHECK: moe.dispatch %[[X]], %[[IDX]] experts(4) capacity_factor(0x7FF0000000000000) pad_to(2) : tensor<6x16xbf16>, tensor<6x2xi32> -> tensor<16x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  %s8, %o8, %c8, %p8 = moe.dispatch %x, %idx experts(4) capacity_factor(0x7FF0000000000000) pad_to(2)
      : tensor<6x16xbf16>, tensor<6x2xi32>
      -> tensor<16x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  // pad_to(1) is the default and is not printed.
  // CHECK: moe.dispatch %[[X]], %[[IDX]] experts(4) : tensor<6x16xbf16>, tensor<6x2xi32> -> tensor<12x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  %s6, %o6, %c6, %p6 = moe.dispatch %x, %idx experts(4) pad_to(1)
      : tensor<6x16xbf16>, tensor<6x2xi32>
      -> tensor<12x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  return
}

//===----------------------------------------------------------------------===//
// moe.combine
//===----------------------------------------------------------------------===//

// CHECK-LABEL: func.func @combine_forms
func.func @combine_forms(%y: tensor<12x16xf32>, %w: tensor<6x2xf32>,
                         %p: tensor<6x2xi32>, %yd: tensor<?x16xbf16>,
                         %p64: tensor<6x2xi64>) -> (tensor<6x16xbf16>, tensor<6x16xf32>) {
  // CHECK: moe.combine %{{.*}}, %{{.*}}, %{{.*}} : tensor<12x16xf32>, tensor<6x2xf32>, tensor<6x2xi32> -> tensor<6x16xbf16>
  %0 = moe.combine %y, %w, %p
      : tensor<12x16xf32>, tensor<6x2xf32>, tensor<6x2xi32> -> tensor<6x16xbf16>
  // CHECK: moe.combine %{{.*}}, %{{.*}}, %{{.*}} : tensor<?x16xbf16>, tensor<6x2xf32>, tensor<6x2xi64> -> tensor<6x16xf32>
  %1 = moe.combine %yd, %w, %p64
      : tensor<?x16xbf16>, tensor<6x2xf32>, tensor<6x2xi64> -> tensor<6x16xf32>
  return %0, %1 : tensor<6x16xbf16>, tensor<6x16xf32>
}

//===----------------------------------------------------------------------===//
// moe.experts / moe.yield
//===----------------------------------------------------------------------===//

// CHECK-LABEL: func.func @experts_with_weights
// CHECK: moe.experts %{{.*}}, %{{.*}} weights(%{{.*}}, %{{.*}} : tensor<4x16x64xbf16>, tensor<4x32x16xbf16>) : tensor<12x16xbf16>, tensor<5xi32> -> tensor<12x16xf32> {
// CHECK-NEXT: ^bb0(%{{.*}}: tensor<?x16xbf16>, %{{.*}}: tensor<16x64xbf16>, %{{.*}}: tensor<32x16xbf16>):
// CHECK: linalg.matmul
// CHECK: moe.swiglu %{{.*}} : tensor<?x64xf32> -> tensor<?x32xbf16>
// CHECK: linalg.matmul
// CHECK: moe.yield %{{.*}} : tensor<?x16xf32>
// CHECK-NEXT: }
func.func @experts_with_weights(%s: tensor<12x16xbf16>, %o: tensor<5xi32>,
                                %w1: tensor<4x16x64xbf16>,
                                %w2: tensor<4x32x16xbf16>) -> tensor<12x16xf32> {
  %y = moe.experts %s, %o weights(%w1, %w2 : tensor<4x16x64xbf16>, tensor<4x32x16xbf16>)
      : tensor<12x16xbf16>, tensor<5xi32> -> tensor<12x16xf32> {
  ^bb0(%x: tensor<?x16xbf16>, %a: tensor<16x64xbf16>, %b: tensor<32x16xbf16>):
    %c0 = arith.constant 0 : index
    %cst = arith.constant 0.0 : f32
    %n = tensor.dim %x, %c0 : tensor<?x16xbf16>
    %e1 = tensor.empty(%n) : tensor<?x64xf32>
    %z1 = linalg.fill ins(%cst : f32) outs(%e1 : tensor<?x64xf32>) -> tensor<?x64xf32>
    %h = linalg.matmul ins(%x, %a : tensor<?x16xbf16>, tensor<16x64xbf16>)
                       outs(%z1 : tensor<?x64xf32>) -> tensor<?x64xf32>
    %act = moe.swiglu %h : tensor<?x64xf32> -> tensor<?x32xbf16>
    %e2 = tensor.empty(%n) : tensor<?x16xf32>
    %z2 = linalg.fill ins(%cst : f32) outs(%e2 : tensor<?x16xf32>) -> tensor<?x16xf32>
    %out = linalg.matmul ins(%act, %b : tensor<?x32xbf16>, tensor<32x16xbf16>)
                         outs(%z2 : tensor<?x16xf32>) -> tensor<?x16xf32>
    moe.yield %out : tensor<?x16xf32>
  }
  return %y : tensor<12x16xf32>
}

// CHECK-LABEL: func.func @experts_without_weights
// CHECK: moe.experts %{{.*}}, %{{.*}} : tensor<?x16xbf16>, tensor<9xi64> -> tensor<?x16xbf16> attributes {note = "identity"} {
// CHECK-NEXT: ^bb0(%[[ROWS:.*]]: tensor<?x16xbf16>):
// CHECK-NEXT: moe.yield %[[ROWS]] : tensor<?x16xbf16>
// CHECK-NEXT: }
func.func @experts_without_weights(%s: tensor<?x16xbf16>, %o: tensor<9xi64>) -> tensor<?x16xbf16> {
  %y = moe.experts %s, %o : tensor<?x16xbf16>, tensor<9xi64> -> tensor<?x16xbf16>
      attributes {note = "identity"} {
  ^bb0(%x: tensor<?x16xbf16>):
    moe.yield %x : tensor<?x16xbf16>
  }
  return %y : tensor<?x16xbf16>
}

//===----------------------------------------------------------------------===//
// moe.grouped_matmul
//===----------------------------------------------------------------------===//

// CHECK-LABEL: func.func @grouped_matmul_forms
func.func @grouped_matmul_forms(
    %x: tensor<12x16xbf16>, %w: tensor<4x16x64xbf16>, %o: tensor<5xi32>,
    %dh: tensor<12x64xbf16>, %wt: tensor<4x64x16xf16>,
    %xq: !moe.mx<128x64xf8E4M3FN, axis = 1>,
    %wq: !moe.mx<4x64x32xf8E4M3FN, axis = 1>,
    %wqt: !moe.mx<4x32x64xf8E5M2, axis = 2>,
    %xd: tensor<?x64xf32>, %od: tensor<5xi64>) {
  // CHECK: moe.grouped_matmul %{{.*}}, %{{.*}}, %{{.*}} : tensor<12x16xbf16>, tensor<4x16x64xbf16>, tensor<5xi32> -> tensor<12x64xf32>
  %0 = moe.grouped_matmul %x, %w, %o
      : tensor<12x16xbf16>, tensor<4x16x64xbf16>, tensor<5xi32> -> tensor<12x64xf32>
  // CHECK: moe.grouped_matmul %{{.*}}, %{{.*}}, %{{.*}} : tensor<12x16xbf16>, tensor<4x16x64xbf16>, tensor<5xi32> -> tensor<12x64xbf16>
  %1 = moe.grouped_matmul %x, %w, %o
      : tensor<12x16xbf16>, tensor<4x16x64xbf16>, tensor<5xi32> -> tensor<12x64xbf16>
  // Data gradient: the same weights, transposed.
  // CHECK: moe.grouped_matmul %{{.*}}, %{{.*}}, %{{.*}} transpose_rhs : tensor<12x64xbf16>, tensor<4x16x64xbf16>, tensor<5xi32> -> tensor<12x16xf32>
  %2 = moe.grouped_matmul %dh, %w, %o transpose_rhs
      : tensor<12x64xbf16>, tensor<4x16x64xbf16>, tensor<5xi32> -> tensor<12x16xf32>
  // CHECK: moe.grouped_matmul %{{.*}}, %{{.*}}, %{{.*}} transpose_rhs : tensor<12x16xbf16>, tensor<4x64x16xf16>, tensor<5xi32> -> tensor<12x64xf32>
  %3 = moe.grouped_matmul %x, %wt, %o transpose_rhs
      : tensor<12x16xbf16>, tensor<4x64x16xf16>, tensor<5xi32> -> tensor<12x64xf32>
  // MX activations (rowwise) and MX weights (blocks along K).
  // CHECK: moe.grouped_matmul %{{.*}}, %{{.*}}, %{{.*}} : !moe.mx<128x64xf8E4M3FN, axis = 1>, !moe.mx<4x64x32xf8E4M3FN, axis = 1>, tensor<5xi32> -> tensor<128x32xbf16>
  %4 = moe.grouped_matmul %xq, %wq, %o
      : !moe.mx<128x64xf8E4M3FN, axis = 1>, !moe.mx<4x64x32xf8E4M3FN, axis = 1>, tensor<5xi32> -> tensor<128x32xbf16>
  // MX weights stored [E, N, K]: blocks along dimension 2.
  // CHECK: moe.grouped_matmul %{{.*}}, %{{.*}}, %{{.*}} transpose_rhs : !moe.mx<128x64xf8E4M3FN, axis = 1>, !moe.mx<4x32x64xf8E5M2, axis = 2>, tensor<5xi32> -> tensor<128x32xf32>
  %5 = moe.grouped_matmul %xq, %wqt, %o transpose_rhs
      : !moe.mx<128x64xf8E4M3FN, axis = 1>, !moe.mx<4x32x64xf8E5M2, axis = 2>, tensor<5xi32> -> tensor<128x32xf32>
  // Float activations against MX weights, dynamic rows, i64 offsets.
  // CHECK: moe.grouped_matmul %{{.*}}, %{{.*}}, %{{.*}} : tensor<?x64xf32>, !moe.mx<4x64x32xf8E4M3FN, axis = 1>, tensor<5xi64> -> tensor<?x32xf32>
  %6 = moe.grouped_matmul %xd, %wq, %od
      : tensor<?x64xf32>, !moe.mx<4x64x32xf8E4M3FN, axis = 1>, tensor<5xi64> -> tensor<?x32xf32>
  return
}

//===----------------------------------------------------------------------===//
// moe.grouped_matmul_wgrad
//===----------------------------------------------------------------------===//

// CHECK-LABEL: func.func @grouped_matmul_wgrad_forms
func.func @grouped_matmul_wgrad_forms(
    %x: tensor<12x16xbf16>, %dh: tensor<12x64xbf16>, %o: tensor<5xi32>,
    %xq: !moe.mx<128x16xf8E4M3FN, axis = 0>,
    %dhq: !moe.mx<128x64xf8E5M2, axis = 0>,
    %xs: tensor<128x16xf32>) {
  // CHECK: moe.grouped_matmul_wgrad %{{.*}}, %{{.*}}, %{{.*}} : tensor<12x16xbf16>, tensor<12x64xbf16>, tensor<5xi32> -> tensor<4x16x64xf32>
  %0 = moe.grouped_matmul_wgrad %x, %dh, %o
      : tensor<12x16xbf16>, tensor<12x64xbf16>, tensor<5xi32> -> tensor<4x16x64xf32>
  // Columnwise MX operands: blocks run along the contracted rows (axis 0).
  // CHECK: moe.grouped_matmul_wgrad %{{.*}}, %{{.*}}, %{{.*}} : !moe.mx<128x16xf8E4M3FN, axis = 0>, !moe.mx<128x64xf8E5M2, axis = 0>, tensor<5xi32> -> tensor<4x16x64xbf16>
  %1 = moe.grouped_matmul_wgrad %xq, %dhq, %o
      : !moe.mx<128x16xf8E4M3FN, axis = 0>, !moe.mx<128x64xf8E5M2, axis = 0>, tensor<5xi32> -> tensor<4x16x64xbf16>
  // CHECK: moe.grouped_matmul_wgrad %{{.*}}, %{{.*}}, %{{.*}} : tensor<128x16xf32>, !moe.mx<128x64xf8E5M2, axis = 0>, tensor<5xi32> -> tensor<4x16x64xf32>
  %2 = moe.grouped_matmul_wgrad %xs, %dhq, %o
      : tensor<128x16xf32>, !moe.mx<128x64xf8E5M2, axis = 0>, tensor<5xi32> -> tensor<4x16x64xf32>
  return
}

//===----------------------------------------------------------------------===//
// moe.swiglu / moe.swiglu_grad
//===----------------------------------------------------------------------===//

// CHECK-LABEL: func.func @swiglu_forms
func.func @swiglu_forms(%h: tensor<12x64xf32>, %h3: tensor<2x?x64xbf16>,
                        %da: tensor<12x32xf32>, %d1: tensor<8xf16>) {
  // split is the default and is not printed.
  // CHECK: moe.swiglu %{{.*}} : tensor<12x64xf32> -> tensor<12x32xbf16>
  %0 = moe.swiglu %h : tensor<12x64xf32> -> tensor<12x32xbf16>
  // CHECK: moe.swiglu %{{.*}} : tensor<12x64xf32> -> tensor<12x32xf32>
  %1 = moe.swiglu %h layout(split) : tensor<12x64xf32> -> tensor<12x32xf32>
  // CHECK: moe.swiglu %{{.*}} layout(interleaved) : tensor<12x64xf32> -> tensor<12x32xf32>
  %2 = moe.swiglu %h layout(interleaved) : tensor<12x64xf32> -> tensor<12x32xf32>
  // CHECK: moe.swiglu %{{.*}} layout(interleaved) : tensor<2x?x64xbf16> -> tensor<2x?x32xbf16>
  %3 = moe.swiglu %h3 layout(interleaved) : tensor<2x?x64xbf16> -> tensor<2x?x32xbf16>
  // CHECK: moe.swiglu %{{.*}} : tensor<8xf16> -> tensor<4xf16>
  %4 = moe.swiglu %d1 : tensor<8xf16> -> tensor<4xf16>
  // CHECK: moe.swiglu_grad %{{.*}}, %{{.*}} : tensor<12x64xf32>, tensor<12x32xf32> -> tensor<12x64xf32>
  %5 = moe.swiglu_grad %h, %da : tensor<12x64xf32>, tensor<12x32xf32> -> tensor<12x64xf32>
  // CHECK: moe.swiglu_grad %{{.*}}, %{{.*}} layout(interleaved) : tensor<12x64xf32>, tensor<12x32xf32> -> tensor<12x64xbf16>
  %6 = moe.swiglu_grad %h, %da layout(interleaved)
      : tensor<12x64xf32>, tensor<12x32xf32> -> tensor<12x64xbf16>
  return
}

//===----------------------------------------------------------------------===//
// moe.quantize / moe.dequantize / moe.mx_pack / moe.mx_unpack, !moe.mx
//===----------------------------------------------------------------------===//

// CHECK-LABEL: func.func @quantize_forms
func.func @quantize_forms(%x: tensor<128x2048xbf16>, %y: tensor<64x96xf32>,
                          %z: tensor<?x4x64xf16>) {
  // rceil is the default and is not printed.
  // CHECK: moe.quantize %{{.*}} : tensor<128x2048xbf16> -> !moe.mx<128x2048xf8E4M3FN, axis = 1>
  %0 = moe.quantize %x : tensor<128x2048xbf16> -> !moe.mx<128x2048xf8E4M3FN, axis = 1>
  // CHECK: moe.quantize %{{.*}} : tensor<128x2048xbf16> -> !moe.mx<128x2048xf8E4M3FN, axis = 1>
  %1 = moe.quantize %x scale(rceil) : tensor<128x2048xbf16> -> !moe.mx<128x2048xf8E4M3FN, axis = 1>
  // CHECK: moe.quantize %{{.*}} scale(floor) : tensor<128x2048xbf16> -> !moe.mx<128x2048xf8E4M3FN, axis = 0>
  %2 = moe.quantize %x scale(floor) : tensor<128x2048xbf16> -> !moe.mx<128x2048xf8E4M3FN, axis = 0>
  // CHECK: moe.quantize %{{.*}} : tensor<128x2048xbf16> -> !moe.mx<128x2048xf8E5M2, axis = 0>
  %3 = moe.quantize %x : tensor<128x2048xbf16> -> !moe.mx<128x2048xf8E5M2, axis = 0>
  // CHECK: moe.quantize %{{.*}} scale(floor) : tensor<128x2048xbf16> -> !moe.mx<128x2048xf8E5M2, axis = 1>
  %4 = moe.quantize %x scale(floor) : tensor<128x2048xbf16> -> !moe.mx<128x2048xf8E5M2, axis = 1>
  // Blocks other than 32 are printed; block = 32 is not.
  // CHECK: moe.quantize %{{.*}} : tensor<64x96xf32> -> !moe.mx<64x96xf8E4M3FN, axis = 1, block = 16>
  %5 = moe.quantize %y : tensor<64x96xf32> -> !moe.mx<64x96xf8E4M3FN, axis = 1, block = 16>
  // CHECK: moe.quantize %{{.*}} scale(floor) : tensor<64x96xf32> -> !moe.mx<64x96xf8E5M2, axis = 0, block = 64>
  %6 = moe.quantize %y scale(floor) : tensor<64x96xf32> -> !moe.mx<64x96xf8E5M2, axis = 0, block = 64>
  // CHECK: moe.quantize %{{.*}} : tensor<64x96xf32> -> !moe.mx<64x96xf8E4M3FN, axis = 1>
  %7 = moe.quantize %y : tensor<64x96xf32> -> !moe.mx<64x96xf8E4M3FN, axis = 1, block = 32>
  // Dynamic dimensions other than the scaled one are allowed.
  // CHECK: moe.quantize %{{.*}} : tensor<?x4x64xf16> -> !moe.mx<?x4x64xf8E4M3FN, axis = 2>
  %8 = moe.quantize %z : tensor<?x4x64xf16> -> !moe.mx<?x4x64xf8E4M3FN, axis = 2>
  return
}

// CHECK-LABEL: func.func @dequantize_forms
func.func @dequantize_forms(%q: !moe.mx<128x2048xf8E4M3FN, axis = 1>,
                            %r: !moe.mx<?x64xf8E5M2, axis = 1, block = 16>)
    -> (tensor<128x2048xf32>, tensor<128x2048xbf16>, tensor<?x64xf16>) {
  // CHECK: moe.dequantize %{{.*}} : !moe.mx<128x2048xf8E4M3FN, axis = 1> -> tensor<128x2048xf32>
  %0 = moe.dequantize %q : !moe.mx<128x2048xf8E4M3FN, axis = 1> -> tensor<128x2048xf32>
  // CHECK: moe.dequantize %{{.*}} : !moe.mx<128x2048xf8E4M3FN, axis = 1> -> tensor<128x2048xbf16>
  %1 = moe.dequantize %q : !moe.mx<128x2048xf8E4M3FN, axis = 1> -> tensor<128x2048xbf16>
  // CHECK: moe.dequantize %{{.*}} : !moe.mx<?x64xf8E5M2, axis = 1, block = 16> -> tensor<?x64xf16>
  %2 = moe.dequantize %r : !moe.mx<?x64xf8E5M2, axis = 1, block = 16> -> tensor<?x64xf16>
  return %0, %1, %2 : tensor<128x2048xf32>, tensor<128x2048xbf16>, tensor<?x64xf16>
}

// CHECK-LABEL: func.func @mx_pack_unpack
// CHECK-SAME: (%[[D:.*]]: tensor<4x64xf8E4M3FN>, %[[S:.*]]: tensor<4x2xf8E8M0FNU>, %[[Q:.*]]: !moe.mx<64x4xf8E5M2, axis = 0>, %[[D3:.*]]: tensor<2x128x8xf8E5M2>, %[[S3:.*]]: tensor<2x8x8xf8E8M0FNU>)
func.func @mx_pack_unpack(%d: tensor<4x64xf8E4M3FN>, %s: tensor<4x2xf8E8M0FNU>,
                          %q: !moe.mx<64x4xf8E5M2, axis = 0>,
                          %d3: tensor<2x128x8xf8E5M2>, %s3: tensor<2x8x8xf8E8M0FNU>)
    -> (!moe.mx<4x64xf8E4M3FN, axis = 1>, tensor<64x4xf8E5M2>, tensor<2x4xf8E8M0FNU>,
        !moe.mx<2x128x8xf8E5M2, axis = 1, block = 16>) {
  // CHECK: moe.mx_pack %[[D]], %[[S]] : tensor<4x64xf8E4M3FN>, tensor<4x2xf8E8M0FNU> -> !moe.mx<4x64xf8E4M3FN, axis = 1>
  %0 = moe.mx_pack %d, %s : tensor<4x64xf8E4M3FN>, tensor<4x2xf8E8M0FNU>
      -> !moe.mx<4x64xf8E4M3FN, axis = 1>
  // CHECK: moe.mx_unpack %[[Q]] : !moe.mx<64x4xf8E5M2, axis = 0> -> tensor<64x4xf8E5M2>, tensor<2x4xf8E8M0FNU>
  %1, %2 = moe.mx_unpack %q : !moe.mx<64x4xf8E5M2, axis = 0>
      -> tensor<64x4xf8E5M2>, tensor<2x4xf8E8M0FNU>
  // CHECK: moe.mx_pack %[[D3]], %[[S3]] : tensor<2x128x8xf8E5M2>, tensor<2x8x8xf8E8M0FNU> -> !moe.mx<2x128x8xf8E5M2, axis = 1, block = 16>
  %3 = moe.mx_pack %d3, %s3 : tensor<2x128x8xf8E5M2>, tensor<2x8x8xf8E8M0FNU>
      -> !moe.mx<2x128x8xf8E5M2, axis = 1, block = 16>
  return %0, %1, %2, %3 : !moe.mx<4x64xf8E4M3FN, axis = 1>, tensor<64x4xf8E5M2>,
                          tensor<2x4xf8E8M0FNU>, !moe.mx<2x128x8xf8E5M2, axis = 1, block = 16>
}

// !moe.fp8block: quantize, dequantize, pack and unpack, a GEMM operand.
// CHECK-LABEL: func.func @fp8block_forms
func.func @fp8block_forms(%x: tensor<?x260xbf16>, %w: tensor<4x256x96xf32>,
                          %o: tensor<5xi32>)
    -> (tensor<?x260xf32>, tensor<?x96xf32>,
        !moe.fp8block<4x256x96xf8E5M2, block = [1, 128, 128], pow2>) {
  // CHECK: moe.quantize %{{.*}} : tensor<?x260xbf16> -> !moe.fp8block<?x260xf8E4M3FN, block = [1, 128]>
  %q = moe.quantize %x : tensor<?x260xbf16>
      -> !moe.fp8block<?x260xf8E4M3FN, block = [1, 128]>
  // CHECK: moe.mx_unpack %{{.*}} : !moe.fp8block<?x260xf8E4M3FN, block = [1, 128]> -> tensor<?x260xf8E4M3FN>, tensor<?x3xf32>
  %d, %s = moe.mx_unpack %q : !moe.fp8block<?x260xf8E4M3FN, block = [1, 128]>
      -> tensor<?x260xf8E4M3FN>, tensor<?x3xf32>
  // CHECK: moe.mx_pack %{{.*}}, %{{.*}} : tensor<?x260xf8E4M3FN>, tensor<?x3xf32> -> !moe.fp8block<?x260xf8E4M3FN, block = [1, 128]>
  %p = moe.mx_pack %d, %s : tensor<?x260xf8E4M3FN>, tensor<?x3xf32>
      -> !moe.fp8block<?x260xf8E4M3FN, block = [1, 128]>
  // CHECK: moe.dequantize %{{.*}} : !moe.fp8block<?x260xf8E4M3FN, block = [1, 128]> -> tensor<?x260xf32>
  %y = moe.dequantize %p : !moe.fp8block<?x260xf8E4M3FN, block = [1, 128]>
      -> tensor<?x260xf32>
  // CHECK: moe.quantize %{{.*}} : tensor<4x256x96xf32> -> !moe.fp8block<4x256x96xf8E5M2, block = [1, 128, 128], pow2>
  %qw = moe.quantize %w : tensor<4x256x96xf32>
      -> !moe.fp8block<4x256x96xf8E5M2, block = [1, 128, 128], pow2>
  %rows = arith.constant dense<1.0> : tensor<7x256xf32>
  %qr = moe.quantize %rows : tensor<7x256xf32>
      -> !moe.fp8block<7x256xf8E4M3FN, block = [1, 128]>
  // CHECK: moe.grouped_matmul %{{.*}}, %{{.*}}, %{{.*}} : !moe.fp8block<7x256xf8E4M3FN, block = [1, 128]>, !moe.fp8block<4x256x96xf8E5M2, block = [1, 128, 128], pow2>, tensor<5xi32> -> tensor<7x96xf32>
  %g = moe.grouped_matmul %qr, %qw, %o
      : !moe.fp8block<7x256xf8E4M3FN, block = [1, 128]>,
        !moe.fp8block<4x256x96xf8E5M2, block = [1, 128, 128], pow2>, tensor<5xi32>
      -> tensor<7x96xf32>
  %gc = tensor.cast %g : tensor<7x96xf32> to tensor<?x96xf32>
  return %y, %gc, %qw : tensor<?x260xf32>, tensor<?x96xf32>,
                        !moe.fp8block<4x256x96xf8E5M2, block = [1, 128, 128], pow2>
}

// The MX type as a plain function argument and result, rank 1 to 3.
// CHECK-LABEL: func.func @mx_type_forms
// CHECK-SAME: (%{{.*}}: !moe.mx<32xf8E4M3FN, axis = 0>, %{{.*}}: !moe.mx<8x2048x768xf8E4M3FN, axis = 1>, %{{.*}}: !moe.mx<?x?x96xf8E5M2, axis = 2, block = 48>) -> !moe.mx<32xf8E4M3FN, axis = 0>
func.func @mx_type_forms(%a: !moe.mx<32xf8E4M3FN, axis = 0>,
                         %b: !moe.mx<8x2048x768xf8E4M3FN, axis = 1, block = 32>,
                         %c: !moe.mx<?x?x96xf8E5M2, axis = 2, block = 48>)
    -> !moe.mx<32xf8E4M3FN, axis = 0> {
  return %a : !moe.mx<32xf8E4M3FN, axis = 0>
}

//===----------------------------------------------------------------------===//
// moe.grouped_mlp
//===----------------------------------------------------------------------===//

// CHECK-LABEL: func.func @grouped_mlp_forms
func.func @grouped_mlp_forms(
    %x: tensor<12x16xbf16>, %w1: tensor<4x16x64xbf16>, %w2: tensor<4x32x16xbf16>,
    %o: tensor<5xi32>, %xq: !moe.mx<128x64xf8E4M3FN, axis = 1>,
    %w1q: !moe.mx<4x64x256xf8E4M3FN, axis = 1>,
    %w2q: !moe.mx<4x128x64xf8E4M3FN, axis = 1>, %xb: tensor<128x64xbf16>) {
  // CHECK: moe.grouped_mlp %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} : tensor<12x16xbf16>, tensor<4x16x64xbf16>, tensor<4x32x16xbf16>, tensor<5xi32> -> tensor<12x16xbf16>
  %0 = moe.grouped_mlp %x, %w1, %w2, %o
      : tensor<12x16xbf16>, tensor<4x16x64xbf16>, tensor<4x32x16xbf16>, tensor<5xi32>
      -> tensor<12x16xbf16>
  // CHECK: moe.grouped_mlp %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} layout(interleaved) : tensor<12x16xbf16>, tensor<4x16x64xbf16>, tensor<4x32x16xbf16>, tensor<5xi32> -> tensor<12x16xf32>
  %1 = moe.grouped_mlp %x, %w1, %w2, %o layout(interleaved)
      : tensor<12x16xbf16>, tensor<4x16x64xbf16>, tensor<4x32x16xbf16>, tensor<5xi32>
      -> tensor<12x16xf32>
  // MX input and MX weights.
  // CHECK: moe.grouped_mlp %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} : !moe.mx<128x64xf8E4M3FN, axis = 1>, !moe.mx<4x64x256xf8E4M3FN, axis = 1>, !moe.mx<4x128x64xf8E4M3FN, axis = 1>, tensor<5xi32> -> tensor<128x64xbf16>
  %2 = moe.grouped_mlp %xq, %w1q, %w2q, %o
      : !moe.mx<128x64xf8E4M3FN, axis = 1>, !moe.mx<4x64x256xf8E4M3FN, axis = 1>,
        !moe.mx<4x128x64xf8E4M3FN, axis = 1>, tensor<5xi32> -> tensor<128x64xbf16>
  // bf16 input, MX weights, every option spelled out.
  // CHECK: moe.grouped_mlp %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} layout(interleaved) scale(floor) : tensor<128x64xbf16>, !moe.mx<4x64x256xf8E4M3FN, axis = 1>, !moe.mx<4x128x64xf8E4M3FN, axis = 1>, tensor<5xi32> -> tensor<128x64xf32>
  %3 = moe.grouped_mlp %xb, %w1q, %w2q, %o layout(interleaved) scale(floor)
      : tensor<128x64xbf16>, !moe.mx<4x64x256xf8E4M3FN, axis = 1>,
        !moe.mx<4x128x64xf8E4M3FN, axis = 1>, tensor<5xi32> -> tensor<128x64xf32>
  // CHECK: moe.grouped_mlp %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} scale(floor) : tensor<128x64xbf16>, !moe.mx<4x64x256xf8E4M3FN, axis = 1>, tensor<4x128x64xbf16>, tensor<5xi32> -> tensor<128x64xbf16>
  %w2b = arith.constant dense<0.0> : tensor<4x128x64xbf16>
  %4 = moe.grouped_mlp %xb, %w1q, %w2b, %o layout(split) scale(floor)
      : tensor<128x64xbf16>, !moe.mx<4x64x256xf8E4M3FN, axis = 1>,
        tensor<4x128x64xbf16>, tensor<5xi32> -> tensor<128x64xbf16>
  return
}

//===----------------------------------------------------------------------===//
// moe.all_to_all
//===----------------------------------------------------------------------===//

shard.grid @ep(shape = 2)
shard.grid @ep_dp(shape = 2x4)
shard.grid @dyn(shape = ?)

// CHECK-LABEL: func.func @all_to_all_forms
func.func @all_to_all_forms(%x: tensor<64x16xbf16>, %c: tensor<4xi32>,
                            %c8: tensor<8xi64>, %xd: tensor<?x16xf32>) {
  // CHECK: moe.all_to_all %{{.*}}, %{{.*}} on @ep grid_axes = [0] : tensor<64x16xbf16>, tensor<4xi32> -> tensor<128x16xbf16>, tensor<4xi32>
  %r0, %rc0 = moe.all_to_all %x, %c on @ep grid_axes = [0]
      : tensor<64x16xbf16>, tensor<4xi32> -> tensor<128x16xbf16>, tensor<4xi32>
  // No grid_axes: the whole grid.
  // CHECK: moe.all_to_all %{{.*}}, %{{.*}} on @ep : tensor<64x16xbf16>, tensor<4xi32> -> tensor<128x16xbf16>, tensor<4xi32>
  %r1, %rc1 = moe.all_to_all %x, %c on @ep
      : tensor<64x16xbf16>, tensor<4xi32> -> tensor<128x16xbf16>, tensor<4xi32>
  // CHECK: moe.all_to_all %{{.*}}, %{{.*}} on @ep_dp grid_axes = [1] : tensor<64x16xbf16>, tensor<8xi64> -> tensor<?x16xbf16>, tensor<8xi64>
  %r2, %rc2 = moe.all_to_all %x, %c8 on @ep_dp grid_axes = [1]
      : tensor<64x16xbf16>, tensor<8xi64> -> tensor<?x16xbf16>, tensor<8xi64>
  // CHECK: moe.all_to_all %{{.*}}, %{{.*}} on @ep_dp grid_axes = [1, 0] : tensor<64x16xbf16>, tensor<8xi64> -> tensor<256x16xbf16>, tensor<8xi64>
  %r3, %rc3 = moe.all_to_all %x, %c8 on @ep_dp grid_axes = [1, 0]
      : tensor<64x16xbf16>, tensor<8xi64> -> tensor<256x16xbf16>, tensor<8xi64>
  // Dynamic group size: any number of counts.
  // CHECK: moe.all_to_all %{{.*}}, %{{.*}} on @dyn : tensor<?x16xf32>, tensor<4xi32> -> tensor<?x16xf32>, tensor<4xi32>
  %r4, %rc4 = moe.all_to_all %xd, %c on @dyn
      : tensor<?x16xf32>, tensor<4xi32> -> tensor<?x16xf32>, tensor<4xi32>
  // Slot-major sides, padded slots, and the groups of a slot-major result.
  // CHECK: moe.all_to_all %{{.*}}, %{{.*}} on @ep grid_axes = [0] slot_major_result pad_to(8) : tensor<64x16xbf16>, tensor<4xi32> -> tensor<160x16xbf16>, tensor<4xi32>
  %r5, %rc5 = moe.all_to_all %x, %c on @ep grid_axes = [0] slot_major_result pad_to(8)
      : tensor<64x16xbf16>, tensor<4xi32> -> tensor<160x16xbf16>, tensor<4xi32>
  // CHECK: moe.slot_offsets %{{.*}} pad_to(8) : tensor<4xi32> -> tensor<3xi32>
  %o5 = moe.slot_offsets %rc5 pad_to(8) : tensor<4xi32> -> tensor<3xi32>
  // CHECK: moe.all_to_all %{{.*}}, %{{.*}} on @ep slot_major_input slot_major_result : tensor<160x16xbf16>, tensor<4xi32> -> tensor<160x16xbf16>, tensor<4xi32>
  %r6, %rc6 = moe.all_to_all %r5, %rc5 on @ep slot_major_input slot_major_result
      : tensor<160x16xbf16>, tensor<4xi32> -> tensor<160x16xbf16>, tensor<4xi32>
  return
}

//===----------------------------------------------------------------------===//
// A full MoE layer with a shared expert.
//===----------------------------------------------------------------------===//

// Shared experts (DeepSeek-V3, Qwen2-MoE) need no dedicated op: a dense,
// always-on MLP is plain linalg.matmul + moe.swiglu + linalg.matmul, added
// to the routed experts' moe.combine output.

// CHECK-LABEL: func.func @moe_layer_with_shared_expert
// CHECK-SAME: (%[[X:[^:]*]]: tensor<6x16xbf16>
// CHECK: %[[IDX:.*]], %[[W:.*]] = moe.router %{{.*}} top_k(2) softmax norm_topk_prob
// CHECK: %[[SORTED:.*]], %[[OFF:.*]], %{{.*}}, %[[POS:.*]] = moe.dispatch %[[X]], %[[IDX]] experts(4)
// CHECK: %[[Y:.*]] = moe.grouped_mlp %[[SORTED]], %{{.*}}, %{{.*}}, %[[OFF]]
// CHECK: %[[ROUTED:.*]] = moe.combine %[[Y]], %[[W]], %[[POS]] : tensor<12x16xf32>, tensor<6x2xf32>, tensor<6x2xi32> -> tensor<6x16xf32>
// CHECK: %[[H:.*]] = linalg.matmul ins(%[[X]], %{{.*}} : tensor<6x16xbf16>, tensor<16x64xbf16>)
// CHECK: %[[A:.*]] = moe.swiglu %[[H]] : tensor<6x64xf32> -> tensor<6x32xbf16>
// CHECK: %[[SHARED:.*]] = linalg.matmul ins(%[[A]], %{{.*}} : tensor<6x32xbf16>, tensor<32x16xbf16>)
// CHECK: %[[SUM:.*]] = arith.addf %[[ROUTED]], %[[SHARED]] : tensor<6x16xf32>
// CHECK: return %[[SUM]]
func.func @moe_layer_with_shared_expert(
    %x: tensor<6x16xbf16>, %gate: tensor<16x4xbf16>,
    %w1: tensor<4x16x64xbf16>, %w2: tensor<4x32x16xbf16>,
    %sw1: tensor<16x64xbf16>, %sw2: tensor<32x16xbf16>) -> tensor<6x16xf32> {
  %cst = arith.constant 0.0 : f32
  // Router logits.
  %le = tensor.empty() : tensor<6x4xf32>
  %lz = linalg.fill ins(%cst : f32) outs(%le : tensor<6x4xf32>) -> tensor<6x4xf32>
  %logits = linalg.matmul ins(%x, %gate : tensor<6x16xbf16>, tensor<16x4xbf16>)
                          outs(%lz : tensor<6x4xf32>) -> tensor<6x4xf32>
  // Routed experts.
  %idx, %w = moe.router %logits top_k(2) softmax norm_topk_prob
      : tensor<6x4xf32> -> tensor<6x2xi32>, tensor<6x2xf32>
  %sorted, %offsets, %counts, %pos = moe.dispatch %x, %idx experts(4)
      : tensor<6x16xbf16>, tensor<6x2xi32>
      -> tensor<12x16xbf16>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  %y = moe.grouped_mlp %sorted, %w1, %w2, %offsets
      : tensor<12x16xbf16>, tensor<4x16x64xbf16>, tensor<4x32x16xbf16>, tensor<5xi32>
      -> tensor<12x16xf32>
  %routed = moe.combine %y, %w, %pos
      : tensor<12x16xf32>, tensor<6x2xf32>, tensor<6x2xi32> -> tensor<6x16xf32>
  // Shared expert: every token, no routing weight.
  %he = tensor.empty() : tensor<6x64xf32>
  %hz = linalg.fill ins(%cst : f32) outs(%he : tensor<6x64xf32>) -> tensor<6x64xf32>
  %h = linalg.matmul ins(%x, %sw1 : tensor<6x16xbf16>, tensor<16x64xbf16>)
                     outs(%hz : tensor<6x64xf32>) -> tensor<6x64xf32>
  %a = moe.swiglu %h : tensor<6x64xf32> -> tensor<6x32xbf16>
  %se = tensor.empty() : tensor<6x16xf32>
  %sz = linalg.fill ins(%cst : f32) outs(%se : tensor<6x16xf32>) -> tensor<6x16xf32>
  %shared = linalg.matmul ins(%a, %sw2 : tensor<6x32xbf16>, tensor<32x16xbf16>)
                          outs(%sz : tensor<6x16xf32>) -> tensor<6x16xf32>
  %sum = arith.addf %routed, %shared : tensor<6x16xf32>
  return %sum : tensor<6x16xf32>
}
