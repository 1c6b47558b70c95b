// RUN: moe-opt %s --moe-train-pipeline="ep-size=2 recipe=mxfp8" | FileCheck %s
// RUN: moe-opt %s --moe-train-pipeline="ep-size=1 recipe=none" | FileCheck %s --check-prefix=PLAIN
// RUN: not moe-opt %s --moe-train-pipeline="recipe=fp4" 2>&1 | FileCheck %s --check-prefix=BAD

// The whole training pipeline on a layer as a frontend writes it (a
// moe.experts region with per-expert matmuls): grouped, MXFP8-quantized,
// fused into one grouped MLP, and sharded over 2 ranks.
// CHECK: shard.grid @ep(shape = 2)
// CHECK-LABEL: func.func @moe_layer
// CHECK-SAME: tensor<4x64x64xf32> {moe.expert_shard
// CHECK-SAME: tensor<4x32x64xf32> {moe.expert_shard
// CHECK-NOT: moe.experts
// CHECK-DAG: %[[W1:.*]] = moe.quantize %{{.*}} : tensor<4x64x64xf32> -> !moe.mx<4x64x64xf8E4M3FN, axis = 1>
// CHECK-DAG: %[[W2:.*]] = moe.quantize %{{.*}} : tensor<4x32x64xf32> -> !moe.mx<4x32x64xf8E4M3FN, axis = 1>
// The tokens are quantized before they are dispatched and sent (8-bit rows
// with their scales travel), and the grouped MLP reads the received rows
// where they arrived, grouped by local expert.
// CHECK: %[[QX:.*]] = moe.quantize %{{.*}} : tensor<64x64xf32> -> !moe.mx<64x64xf8E4M3FN, axis = 1>
// CHECK: %[[S:[^,]*]], %{{[^,]*}}, %[[C:[^,]*]], %{{.*}} = moe.dispatch %[[QX]], {{.*}} -> !moe.mx<128x64xf8E4M3FN, axis = 1>,
// CHECK: %[[X:[^,]*]], %[[RC:[^ ]*]] = moe.all_to_all %[[S]], %[[C]] on @ep {{.*}} slot_major_result pad_to(32) : !moe.mx<128x64xf8E4M3FN, axis = 1>, tensor<8xi32> -> !moe.mx<352x64xf8E4M3FN, axis = 1>
// CHECK: %[[O:.*]] = moe.slot_offsets %[[RC]] pad_to(32)
// CHECK-NOT: moe.quantize
// CHECK: moe.grouped_mlp %[[X]], %[[W1]], %[[W2]], %[[O]] : !moe.mx<352x64xf8E4M3FN, axis = 1>, !moe.mx<4x64x64xf8E4M3FN, axis = 1>, !moe.mx<4x32x64xf8E4M3FN, axis = 1>, tensor<5xi32> -> tensor<352x64xf32>
// CHECK: moe.all_to_all {{.*}} slot_major_input pad_to(32) : tensor<352x64xf32>
// CHECK: moe.combine

// Without a recipe the experts are only grouped and fused (f32 throughout).
// PLAIN-LABEL: func.func @moe_layer
// PLAIN-NOT: moe.quantize
// PLAIN: moe.grouped_mlp %{{.*}} : tensor<352x64xf32>, tensor<8x64x64xf32>, tensor<8x32x64xf32>, tensor<9xi32> -> tensor<352x64xf32>

// BAD: unknown recipe 'fp4'
func.func @moe_layer(%x: tensor<64x64xf32>, %logits: tensor<64x8xf32>,
                     %w1: tensor<8x64x64xf32>, %w2: tensor<8x32x64xf32>) -> tensor<64x64xf32> {
  %idx, %w = moe.router %logits top_k(2) softmax norm_topk_prob
      : tensor<64x8xf32> -> tensor<64x2xi32>, tensor<64x2xf32>
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(8) pad_to(32)
      : tensor<64x64xf32>, tensor<64x2xi32> -> tensor<352x64xf32>, tensor<9xi32>, tensor<8xi32>, tensor<64x2xi32>
  %y = moe.experts %s, %o weights(%w1, %w2 : tensor<8x64x64xf32>, tensor<8x32x64xf32>)
      : tensor<352x64xf32>, tensor<9xi32> -> tensor<352x64xf32> {
  ^bb0(%rows: tensor<?x64xf32>, %a: tensor<64x64xf32>, %b: tensor<32x64xf32>):
    %c0 = arith.constant 0 : index
    %n = tensor.dim %rows, %c0 : tensor<?x64xf32>
    %zero = arith.constant 0.0 : f32
    %e1 = tensor.empty(%n) : tensor<?x64xf32>
    %z1 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<?x64xf32>) -> tensor<?x64xf32>
    %h = linalg.matmul ins(%rows, %a : tensor<?x64xf32>, tensor<64x64xf32>) outs(%z1 : tensor<?x64xf32>) -> tensor<?x64xf32>
    %act = moe.swiglu %h : tensor<?x64xf32> -> tensor<?x32xf32>
    %e2 = tensor.empty(%n) : tensor<?x64xf32>
    %z2 = linalg.fill ins(%zero : f32) outs(%e2 : tensor<?x64xf32>) -> tensor<?x64xf32>
    %out = linalg.matmul ins(%act, %b : tensor<?x32xf32>, tensor<32x64xf32>) outs(%z2 : tensor<?x64xf32>) -> tensor<?x64xf32>
    moe.yield %out : tensor<?x64xf32>
  }
  %r = moe.combine %y, %w, %p : tensor<352x64xf32>, tensor<64x2xf32>, tensor<64x2xi32> -> tensor<64x64xf32>
  return %r : tensor<64x64xf32>
}
