// RUN: moe-opt %s -moe-chunk-loss=rows=4 -split-input-file -verify-diagnostics | FileCheck %s
// RUN: not moe-opt %s -moe-chunk-loss=rows=0 2>&1 | FileCheck %s --check-prefix=ZERO
// ZERO: moe-chunk-loss: rows must be at least 1, got 0
// RUN: not moe-opt %s -moe-chunk-loss=rows=-2 2>&1 | FileCheck %s --check-prefix=NEG
// NEG: moe-chunk-loss: rows must be at least 1, got -2
// RUN: not moe-opt %s -split-input-file -moe-chunk-loss=rows=1 2>&1 | FileCheck %s --check-prefix=MANY
// MANY: error: moe-chunk-loss: rows=1 makes 70 chunks of the 70 tokens; at most 64


// A train step's LM head over 10 tokens in chunks of 4, 4 and 2: each
// chunk's logits, loss, logits' gradient and its two GEMMs; the data
// gradient's rows inserted, the weight gradients added in chunk order.
// CHECK-LABEL: func.func @head
// CHECK-SAME: (%[[H:.*]]: tensor<10x4xf32>, %[[W:.*]]: tensor<1x4x6xf32>, %[[L:.*]]: tensor<10xi32>)
// CHECK-NOT: tensor<10x6xf32>
// CHECK: %[[ONE:.*]] = arith.constant dense<1.000000e+00> : tensor<f32>
// The counted rows (labels in [0, 6)) of the whole batch, then per chunk
// its own, its share count_c / count, the chunk's mean loss times the
// share, and the share times the loss's gradient as the chunk's seed.
// CHECK: %[[COUNT:.*]] = linalg.generic {{.*}} ins(%[[L]] : tensor<10xi32>)
// CHECK: arith.cmpi slt, %{{.*}}, %c6_i32
// CHECK: %[[H0:.*]] = tensor.extract_slice %[[H]][0, 0] [4, 4] [1, 1]
// CHECK: %[[L0:.*]] = tensor.extract_slice %[[L]][0] [4] [1]
// CHECK: %[[O0:.*]] = arith.constant dense<[0, 4]> : tensor<2xi32>
// CHECK: %[[X0:.*]] = moe.grouped_matmul %[[H0]], %[[W]], %[[O0]] {moe.dense} : {{.*}} -> tensor<4x6xf32>
// CHECK: %[[C0:.*]] = linalg.generic {{.*}} ins(%[[L0]] : tensor<4xi32>)
// CHECK: linalg.generic {{.*}} ins(%[[C0]], %[[COUNT]] : tensor<f32>, tensor<f32>)
// CHECK: arith.divf
// CHECK: %[[S0:.*]] = tensor.collapse_shape
// CHECK: %[[CE0:.*]] = moe.cross_entropy %[[X0]], %[[L0]]
// CHECK: linalg.generic {{.*}} ins(%[[CE0]], %[[S0]] : tensor<f32>, tensor<f32>)
// CHECK: arith.mulf
// CHECK: linalg.generic {{.*}} ins(%[[ONE]], %[[S0]] : tensor<f32>, tensor<f32>)
// CHECK: arith.mulf
// CHECK: %[[GC0:.*]] = tensor.collapse_shape
// CHECK: %[[G0:.*]] = moe.cross_entropy_grad %[[X0]], %[[L0]], %[[GC0]]
// CHECK: %[[DH0:.*]] = moe.grouped_matmul %[[G0]], %[[W]], %[[O0]] transpose_rhs {moe.dense}
// CHECK: %[[I0:.*]] = tensor.insert_slice %[[DH0]] into %{{.*}}[0, 0] [4, 4]
// CHECK: %[[DW0:.*]] = moe.grouped_matmul_wgrad %[[H0]], %[[G0]], %[[O0]] {moe.dense}
// CHECK: tensor.extract_slice %[[H]][4, 0] [4, 4] [1, 1]
// CHECK: %[[DW1:.*]] = moe.grouped_matmul_wgrad
// CHECK: %[[S1:.*]] = arith.addf %[[DW0]], %[[DW1]] : tensor<1x4x6xf32>
// CHECK: %[[H2:.*]] = tensor.extract_slice %[[H]][8, 0] [2, 4] [1, 1]
// CHECK: arith.constant dense<[0, 2]> : tensor<2xi32>
// CHECK: moe.grouped_matmul %[[H2]], %[[W]], %{{.*}} {moe.dense} : {{.*}} -> tensor<2x6xf32>
// CHECK: %[[I2:.*]] = tensor.insert_slice %{{.*}} into %{{.*}}[8, 0] [2, 4]
// CHECK: %[[DW2:.*]] = moe.grouped_matmul_wgrad
// CHECK: %[[S2:.*]] = arith.addf %[[S1]], %[[DW2]]
// CHECK: return %{{.*}}, %[[I2]], %[[S2]]
func.func @head(%h: tensor<10x4xf32>, %w: tensor<1x4x6xf32>, %labels: tensor<10xi32>)
    -> (tensor<f32>, tensor<10x4xf32>, tensor<1x4x6xf32>) {
  %offsets = arith.constant dense<[0, 10]> : tensor<2xi32>
  %one = arith.constant dense<1.0> : tensor<f32>
  %logits = moe.grouped_matmul %h, %w, %offsets {moe.dense} : tensor<10x4xf32>, tensor<1x4x6xf32>, tensor<2xi32> -> tensor<10x6xf32>
  %loss = moe.cross_entropy %logits, %labels : tensor<10x6xf32>, tensor<10xi32> -> tensor<f32>
  %dl = moe.cross_entropy_grad %logits, %labels, %one : tensor<10x6xf32>, tensor<10xi32>, tensor<f32> -> tensor<10x6xf32>
  %dh = moe.grouped_matmul %dl, %w, %offsets transpose_rhs {moe.dense} : tensor<10x6xf32>, tensor<1x4x6xf32>, tensor<2xi32> -> tensor<10x4xf32>
  %dw = moe.grouped_matmul_wgrad %h, %dl, %offsets {moe.dense} : tensor<10x4xf32>, tensor<10x6xf32>, tensor<2xi32> -> tensor<1x4x6xf32>
  return %loss, %dh, %dw : tensor<f32>, tensor<10x4xf32>, tensor<1x4x6xf32>
}

// -----

// Four tokens or fewer: one chunk, nothing changes.
// CHECK-LABEL: func.func @one_chunk
// CHECK: moe.grouped_matmul %arg0, %arg1, %{{.*}} {moe.dense} : {{.*}} -> tensor<4x6xf32>
// CHECK-NOT: tensor.extract_slice
func.func @one_chunk(%h: tensor<4x4xf32>, %w: tensor<1x4x6xf32>, %labels: tensor<4xi32>)
    -> (tensor<f32>, tensor<1x4x6xf32>) {
  %offsets = arith.constant dense<[0, 4]> : tensor<2xi32>
  %one = arith.constant dense<1.0> : tensor<f32>
  %logits = moe.grouped_matmul %h, %w, %offsets {moe.dense} : tensor<4x4xf32>, tensor<1x4x6xf32>, tensor<2xi32> -> tensor<4x6xf32>
  %loss = moe.cross_entropy %logits, %labels : tensor<4x6xf32>, tensor<4xi32> -> tensor<f32>
  %dl = moe.cross_entropy_grad %logits, %labels, %one : tensor<4x6xf32>, tensor<4xi32>, tensor<f32> -> tensor<4x6xf32>
  %dw = moe.grouped_matmul_wgrad %h, %dl, %offsets {moe.dense} : tensor<4x4xf32>, tensor<4x6xf32>, tensor<2xi32> -> tensor<1x4x6xf32>
  return %loss, %dw : tensor<f32>, tensor<1x4x6xf32>
}

// -----

// The loss scaled before its gradient (as -moe-expert-parallel does over
// several ranks): the chunks are computed where the gradient was, and the
// scaling moves after them.
// CHECK-LABEL: func.func @scaled_loss
// CHECK-SAME: %[[SHARE:[^:]*]]: tensor<f32>
// CHECK-NOT: arith.mulf
// CHECK: moe.grouped_matmul {{.*}} -> tensor<4x6xf32>
// CHECK: moe.cross_entropy_grad {{.*}} -> tensor<2x6xf32>
// CHECK: %[[SCALED:.*]] = arith.mulf %{{.*}}, %[[SHARE]] : tensor<f32>
// CHECK: return %[[SCALED]]
func.func @scaled_loss(%h: tensor<10x4xf32>, %w: tensor<1x4x6xf32>, %labels: tensor<10xi32>,
                       %share: tensor<f32>) -> (tensor<f32>, tensor<1x4x6xf32>) {
  %offsets = arith.constant dense<[0, 10]> : tensor<2xi32>
  %logits = moe.grouped_matmul %h, %w, %offsets {moe.dense} : tensor<10x4xf32>, tensor<1x4x6xf32>, tensor<2xi32> -> tensor<10x6xf32>
  %loss = moe.cross_entropy %logits, %labels : tensor<10x6xf32>, tensor<10xi32> -> tensor<f32>
  %scaled = arith.mulf %loss, %share : tensor<f32>
  %dl = moe.cross_entropy_grad %logits, %labels, %share : tensor<10x6xf32>, tensor<10xi32>, tensor<f32> -> tensor<10x6xf32>
  %dw = moe.grouped_matmul_wgrad %h, %dl, %offsets {moe.dense} : tensor<10x4xf32>, tensor<10x6xf32>, tensor<2xi32> -> tensor<1x4x6xf32>
  return %scaled, %dw : tensor<f32>, tensor<1x4x6xf32>
}

// -----

// A gradient computed from the loss: left alone.
// CHECK-LABEL: func.func @grad_of_loss
// CHECK: moe.grouped_matmul %arg0, %arg1, %{{.*}} {moe.dense} : {{.*}} -> tensor<10x6xf32>
func.func @grad_of_loss(%h: tensor<10x4xf32>, %w: tensor<1x4x6xf32>, %labels: tensor<10xi32>)
    -> tensor<1x4x6xf32> {
  %offsets = arith.constant dense<[0, 10]> : tensor<2xi32>
  %logits = moe.grouped_matmul %h, %w, %offsets {moe.dense} : tensor<10x4xf32>, tensor<1x4x6xf32>, tensor<2xi32> -> tensor<10x6xf32>
  %loss = moe.cross_entropy %logits, %labels : tensor<10x6xf32>, tensor<10xi32> -> tensor<f32>
  %g = arith.mulf %loss, %loss : tensor<f32>
  // expected-remark @below {{moe-chunk-loss: not chunked: the loss's gradient depends on the loss}}
  %dl = moe.cross_entropy_grad %logits, %labels, %g : tensor<10x6xf32>, tensor<10xi32>, tensor<f32> -> tensor<10x6xf32>
  %dw = moe.grouped_matmul_wgrad %h, %dl, %offsets {moe.dense} : tensor<10x4xf32>, tensor<10x6xf32>, tensor<2xi32> -> tensor<1x4x6xf32>
  return %dw : tensor<1x4x6xf32>
}

// -----

// The logits' gradient read by something else: left alone.
// CHECK-LABEL: func.func @other_user
// CHECK: moe.grouped_matmul %arg0, %arg1, %{{.*}} {moe.dense} : {{.*}} -> tensor<10x6xf32>
func.func @other_user(%h: tensor<10x4xf32>, %w: tensor<1x4x6xf32>, %labels: tensor<10xi32>)
    -> (tensor<f32>, tensor<10x6xf32>) {
  %offsets = arith.constant dense<[0, 10]> : tensor<2xi32>
  %one = arith.constant dense<1.0> : tensor<f32>
  %logits = moe.grouped_matmul %h, %w, %offsets {moe.dense} : tensor<10x4xf32>, tensor<1x4x6xf32>, tensor<2xi32> -> tensor<10x6xf32>
  %loss = moe.cross_entropy %logits, %labels : tensor<10x6xf32>, tensor<10xi32> -> tensor<f32>
  // expected-remark @below {{moe-chunk-loss: not chunked: the logits' gradient has a user other than the LM head's two gradient GEMMs}}
  %dl = moe.cross_entropy_grad %logits, %labels, %one : tensor<10x6xf32>, tensor<10xi32>, tensor<f32> -> tensor<10x6xf32>
  return %loss, %dl : tensor<f32>, tensor<10x6xf32>
}

// -----

// 70 tokens in chunks of 1: more than 64 chunks are refused (the MANY run).
func.func @many(%h: tensor<70x4xf32>, %w: tensor<1x4x6xf32>, %labels: tensor<70xi32>)
    -> (tensor<f32>, tensor<1x4x6xf32>) {
  %offsets = arith.constant dense<[0, 70]> : tensor<2xi32>
  %one = arith.constant dense<1.0> : tensor<f32>
  %logits = moe.grouped_matmul %h, %w, %offsets {moe.dense} : tensor<70x4xf32>, tensor<1x4x6xf32>, tensor<2xi32> -> tensor<70x6xf32>
  %loss = moe.cross_entropy %logits, %labels : tensor<70x6xf32>, tensor<70xi32> -> tensor<f32>
  %dl = moe.cross_entropy_grad %logits, %labels, %one : tensor<70x6xf32>, tensor<70xi32>, tensor<f32> -> tensor<70x6xf32>
  %dw = moe.grouped_matmul_wgrad %h, %dl, %offsets {moe.dense} : tensor<70x4xf32>, tensor<70x6xf32>, tensor<2xi32> -> tensor<1x4x6xf32>
  return %loss, %dw : tensor<f32>, tensor<1x4x6xf32>
}
