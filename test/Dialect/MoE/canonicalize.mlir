// RUN: moe-opt %s -canonicalize -split-input-file | FileCheck %s

// mx_unpack(mx_pack(d, s)) is (d, s); mx_pack(mx_unpack(q)) is q.
// CHECK-LABEL: func.func @pack_unpack
// CHECK-SAME: (%[[D:.*]]: tensor<4x64xf8E4M3FN>, %[[S:.*]]: tensor<4x2xf8E8M0FNU>, %[[Q:.*]]: !moe.mx
// CHECK-NOT: moe.mx_pack
// CHECK-NOT: moe.mx_unpack
// CHECK: return %[[D]], %[[S]], %[[Q]]
func.func @pack_unpack(%d: tensor<4x64xf8E4M3FN>, %s: tensor<4x2xf8E8M0FNU>,
                       %q: !moe.mx<4x64xf8E4M3FN, axis = 1>)
    -> (tensor<4x64xf8E4M3FN>, tensor<4x2xf8E8M0FNU>, !moe.mx<4x64xf8E4M3FN, axis = 1>) {
  %p = moe.mx_pack %d, %s : tensor<4x64xf8E4M3FN>, tensor<4x2xf8E8M0FNU>
      -> !moe.mx<4x64xf8E4M3FN, axis = 1>
  %d2, %s2 = moe.mx_unpack %p : !moe.mx<4x64xf8E4M3FN, axis = 1>
      -> tensor<4x64xf8E4M3FN>, tensor<4x2xf8E8M0FNU>
  %d3, %s3 = moe.mx_unpack %q : !moe.mx<4x64xf8E4M3FN, axis = 1>
      -> tensor<4x64xf8E4M3FN>, tensor<4x2xf8E8M0FNU>
  %q2 = moe.mx_pack %d3, %s3 : tensor<4x64xf8E4M3FN>, tensor<4x2xf8E8M0FNU>
      -> !moe.mx<4x64xf8E4M3FN, axis = 1>
  return %d2, %s2, %q2 : tensor<4x64xf8E4M3FN>, tensor<4x2xf8E8M0FNU>, !moe.mx<4x64xf8E4M3FN, axis = 1>
}

// -----

// Packing the data of one MX value with the scales of another is not a fold.
// CHECK-LABEL: func.func @pack_mixed
// CHECK: moe.mx_unpack
// CHECK: moe.mx_unpack
// CHECK: moe.mx_pack
func.func @pack_mixed(%a: !moe.mx<4x64xf8E4M3FN, axis = 1>, %b: !moe.mx<4x64xf8E4M3FN, axis = 1>)
    -> !moe.mx<4x64xf8E4M3FN, axis = 1> {
  %da, %sa = moe.mx_unpack %a : !moe.mx<4x64xf8E4M3FN, axis = 1>
      -> tensor<4x64xf8E4M3FN>, tensor<4x2xf8E8M0FNU>
  %db, %sb = moe.mx_unpack %b : !moe.mx<4x64xf8E4M3FN, axis = 1>
      -> tensor<4x64xf8E4M3FN>, tensor<4x2xf8E8M0FNU>
  %p = moe.mx_pack %da, %sb : tensor<4x64xf8E4M3FN>, tensor<4x2xf8E8M0FNU>
      -> !moe.mx<4x64xf8E4M3FN, axis = 1>
  return %p : !moe.mx<4x64xf8E4M3FN, axis = 1>
}

// -----

// An all-to-all within a group of one rank is the identity.
shard.grid @single(shape = 1x4)
// CHECK-LABEL: func.func @all_to_all_one_rank
// CHECK-SAME: (%[[X:.*]]: tensor<8x16xbf16>, %[[C:.*]]: tensor<2xi32>)
// CHECK-NOT: moe.all_to_all
// CHECK: return %[[X]], %[[C]]
func.func @all_to_all_one_rank(%x: tensor<8x16xbf16>, %c: tensor<2xi32>)
    -> (tensor<8x16xbf16>, tensor<2xi32>) {
  %r, %rc = moe.all_to_all %x, %c on @single grid_axes = [0]
      : tensor<8x16xbf16>, tensor<2xi32> -> tensor<8x16xbf16>, tensor<2xi32>
  return %r, %rc : tensor<8x16xbf16>, tensor<2xi32>
}

// -----

// Over 4 ranks it stays.
shard.grid @four(shape = 1x4)
// CHECK-LABEL: func.func @all_to_all_four_ranks
// CHECK: moe.all_to_all
func.func @all_to_all_four_ranks(%x: tensor<8x16xbf16>, %c: tensor<4xi32>)
    -> (tensor<8x16xbf16>, tensor<4xi32>) {
  %r, %rc = moe.all_to_all %x, %c on @four grid_axes = [1]
      : tensor<8x16xbf16>, tensor<4xi32> -> tensor<8x16xbf16>, tensor<4xi32>
  return %r, %rc : tensor<8x16xbf16>, tensor<4xi32>
}

// -----

// A transposed weight feeding grouped_matmul is read in place: the
// transpose folds into transpose_rhs (twice = no transpose).
// CHECK-LABEL: func.func @fold_rhs_transpose
// CHECK-SAME: (%[[X:.*]]: tensor<12x16xbf16>, %[[W:.*]]: tensor<4x64x16xbf16>, %[[O:.*]]: tensor<5xi32>, %[[W2:.*]]: tensor<4x16x64xbf16>)
// CHECK-NOT: linalg.transpose
// CHECK: moe.grouped_matmul %[[X]], %[[W]], %[[O]] transpose_rhs :
// CHECK: moe.grouped_matmul %[[X]], %[[W2]], %[[O]] :
func.func @fold_rhs_transpose(%x: tensor<12x16xbf16>, %w: tensor<4x64x16xbf16>,
                              %off: tensor<5xi32>, %w2: tensor<4x16x64xbf16>)
    -> (tensor<12x64xf32>, tensor<12x64xf32>) {
  %e = tensor.empty() : tensor<4x16x64xbf16>
  %wt = linalg.transpose ins(%w : tensor<4x64x16xbf16>) outs(%e : tensor<4x16x64xbf16>)
      permutation = [0, 2, 1]
  %y = moe.grouped_matmul %x, %wt, %off
      : tensor<12x16xbf16>, tensor<4x16x64xbf16>, tensor<5xi32> -> tensor<12x64xf32>
  %e2 = tensor.empty() : tensor<4x64x16xbf16>
  %w2t = linalg.transpose ins(%w2 : tensor<4x16x64xbf16>) outs(%e2 : tensor<4x64x16xbf16>)
      permutation = [0, 2, 1]
  %y2 = moe.grouped_matmul %x, %w2t, %off transpose_rhs
      : tensor<12x16xbf16>, tensor<4x64x16xbf16>, tensor<5xi32> -> tensor<12x64xf32>
  return %y, %y2 : tensor<12x64xf32>, tensor<12x64xf32>
}

// -----

// Another permutation is not a K/N swap: kept.
// CHECK-LABEL: func.func @keep_other_transpose
// CHECK: linalg.transpose
// CHECK: moe.grouped_matmul
func.func @keep_other_transpose(%x: tensor<12x16xbf16>, %w: tensor<16x4x64xbf16>,
                                %off: tensor<5xi32>) -> tensor<12x64xf32> {
  %e = tensor.empty() : tensor<4x16x64xbf16>
  %wt = linalg.transpose ins(%w : tensor<16x4x64xbf16>) outs(%e : tensor<4x16x64xbf16>)
      permutation = [1, 0, 2]
  %y = moe.grouped_matmul %x, %wt, %off
      : tensor<12x16xbf16>, tensor<4x16x64xbf16>, tensor<5xi32> -> tensor<12x64xf32>
  return %y : tensor<12x64xf32>
}

// -----

// Weights the expert body never reads are dropped with their arguments.
// CHECK-LABEL: func.func @drop_unused_weights
// CHECK: moe.experts %{{.*}}, %{{.*}} weights(%[[B:.*]] : tensor<4x16x16xf32>)
// CHECK-NEXT: ^bb0(%{{.*}}: tensor<?x16xf32>, %{{.*}}: tensor<16x16xf32>):
func.func @drop_unused_weights(%x: tensor<12x16xf32>, %off: tensor<5xi32>,
                               %a: tensor<4x8x8xf32>, %b: tensor<4x16x16xf32>)
    -> tensor<12x16xf32> {
  %y = moe.experts %x, %off weights(%a, %b : tensor<4x8x8xf32>, tensor<4x16x16xf32>)
      : tensor<12x16xf32>, tensor<5xi32> -> tensor<12x16xf32> {
  ^bb0(%rows: tensor<?x16xf32>, %wa: tensor<8x8xf32>, %wb: tensor<16x16xf32>):
    %c0 = arith.constant 0 : index
    %n = tensor.dim %rows, %c0 : tensor<?x16xf32>
    %zero = arith.constant 0.0 : f32
    %e = tensor.empty(%n) : tensor<?x16xf32>
    %z = linalg.fill ins(%zero : f32) outs(%e : tensor<?x16xf32>) -> tensor<?x16xf32>
    %o = linalg.matmul ins(%rows, %wb : tensor<?x16xf32>, tensor<16x16xf32>)
                       outs(%z : tensor<?x16xf32>) -> tensor<?x16xf32>
    moe.yield %o : tensor<?x16xf32>
  }
  return %y : tensor<12x16xf32>
}

// -----

// Every moe op is free of side effects: unused results are erased (and the
// experts region with them).
shard.grid @g1(shape = 1)
// CHECK-LABEL: func.func @dead_ops
// CHECK-NOT: moe.
// CHECK: return
func.func @dead_ops(%logits: tensor<6x4xf32>, %x: tensor<6x32xf32>, %w1: tensor<4x32x64xf32>,
                    %w2: tensor<4x32x32xf32>, %dy: tensor<8x32xf32>) {
  %i, %w = moe.router %logits top_k(2) softmax : tensor<6x4xf32> -> tensor<6x2xi32>, tensor<6x2xf32>
  %s, %o, %c, %p = moe.dispatch %x, %i experts(4)
      : tensor<6x32xf32>, tensor<6x2xi32> -> tensor<12x32xf32>, tensor<5xi32>, tensor<4xi32>, tensor<6x2xi32>
  %cmb = moe.combine %s, %w, %p : tensor<12x32xf32>, tensor<6x2xf32>, tensor<6x2xi32> -> tensor<6x32xf32>
  %h = moe.grouped_matmul %s, %w1, %o : tensor<12x32xf32>, tensor<4x32x64xf32>, tensor<5xi32> -> tensor<12x64xf32>
  %dw = moe.grouped_matmul_wgrad %s, %h, %o : tensor<12x32xf32>, tensor<12x64xf32>, tensor<5xi32> -> tensor<4x32x64xf32>
  %a = moe.swiglu %h : tensor<12x64xf32> -> tensor<12x32xf32>
  %da = moe.swiglu_grad %h, %a : tensor<12x64xf32>, tensor<12x32xf32> -> tensor<12x64xf32>
  %q = moe.quantize %x : tensor<6x32xf32> -> !moe.mx<6x32xf8E4M3FN, axis = 1>
  %dq = moe.dequantize %q : !moe.mx<6x32xf8E4M3FN, axis = 1> -> tensor<6x32xf32>
  %d, %sc = moe.mx_unpack %q : !moe.mx<6x32xf8E4M3FN, axis = 1> -> tensor<6x32xf8E4M3FN>, tensor<6x1xf8E8M0FNU>
  %pk = moe.mx_pack %d, %sc : tensor<6x32xf8E4M3FN>, tensor<6x1xf8E8M0FNU> -> !moe.mx<6x32xf8E4M3FN, axis = 1>
  %y = moe.grouped_mlp %s, %w1, %w2, %o : tensor<12x32xf32>, tensor<4x32x64xf32>, tensor<4x32x32xf32>, tensor<5xi32> -> tensor<12x32xf32>
  %ex = moe.experts %s, %o : tensor<12x32xf32>, tensor<5xi32> -> tensor<12x32xf32> {
  ^bb0(%rows: tensor<?x32xf32>):
    moe.yield %rows : tensor<?x32xf32>
  }
  %r, %rc = moe.all_to_all %dy, %c on @g1 : tensor<8x32xf32>, tensor<4xi32> -> tensor<16x32xf32>, tensor<4xi32>
  return
}
