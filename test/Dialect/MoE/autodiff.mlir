// RUN: moe-opt %s -moe-autodiff | FileCheck %s
// RUN: moe-opt %s -moe-autodiff -moe-cpu-pipeline -o /dev/null
// RUN: moe-opt %s -moe-train-pipeline="autodiff=true ep-size=2 recipe=none grad-bucket-mib=0" | FileCheck %s --check-prefix=EP

// Across 2 ranks: the forward's two exchanges, the backward's two reverse
// ones (counted by what was received), and the data-parallel gradients
// (table, norm, router, head) summed; the expert shards' are not.
// EP-LABEL: func.func @loss_grad(
// EP-SAME: tensor<2x32x32xf32> {moe.expert_shard
// EP: %[[R:.*]], %[[RC:.*]] = moe.all_to_all %{{.*}}, %[[C:.*]] on @ep
// EP: %{{.*}}, %[[BC:.*]] = moe.all_to_all %{{.*}}, %[[RC]] on @ep
// EP: moe.all_to_all %{{.*}}, %[[BC]] on @ep
// EP: moe.all_to_all %{{.*}}, %[[RC]] on @ep
// EP-COUNT-4: shard.all_reduce
// EP-NOT: shard.all_reduce
// EP: return

// The train step of a small language-model block: embedding, RMSNorm, the
// MoE layer, the LM head and the loss. The forward is kept; each op the loss
// depends on gets its vector-Jacobian product, in reverse order; gradients
// are returned in argument order with moe.gradient_of.

// CHECK-LABEL: func.func @loss(
// CHECK-LABEL: func.func @loss_grad(
// CHECK-SAME: -> (tensor<f32> {moe.loss}, tensor<16x32xf32> {moe.gradient_of = 0 : i64}, tensor<32xf32> {moe.gradient_of = 1 : i64}, tensor<32x4xf32> {moe.gradient_of = 2 : i64}, tensor<4x32x32xf32> {moe.gradient_of = 3 : i64}, tensor<4x16x32xf32> {moe.gradient_of = 4 : i64}, tensor<32x16xf32> {moe.gradient_of = 5 : i64})
// The forward, then the backward from the loss down to the embedding.
// CHECK: moe.cross_entropy
// CHECK: %[[ONE:.*]] = arith.constant dense<1.000000e+00> : tensor<f32>
// CHECK: moe.cross_entropy_grad %{{.*}}, %{{.*}}, %[[ONE]]
// CHECK: linalg.transpose
// CHECK: moe.combine_grad
// CHECK: moe.dispatch
// CHECK: moe.grouped_mlp_backward
// CHECK: moe.combine
// CHECK: moe.router_grad {{.*}} top_k(2) softmax norm_topk_prob
// CHECK: moe.rms_norm_grad
// CHECK: moe.embedding_grad
// CHECK: return
func.func @loss(%table: tensor<16x32xf32>, %norm: tensor<32xf32>, %rw: tensor<32x4xf32>,
                %w1: tensor<4x32x32xf32>, %w2: tensor<4x16x32xf32>, %head: tensor<32x16xf32>,
                %ids: tensor<8xi32>, %labels: tensor<8xi32>) -> tensor<f32> {
  %c0 = arith.constant 0.0 : f32
  %x = moe.embedding %table, %ids : tensor<16x32xf32>, tensor<8xi32> -> tensor<8x32xf32>
  %h = moe.rms_norm %x, %norm eps(1.0e-6) : tensor<8x32xf32>, tensor<32xf32> -> tensor<8x32xf32>
  %e = tensor.empty() : tensor<8x4xf32>
  %z = linalg.fill ins(%c0 : f32) outs(%e : tensor<8x4xf32>) -> tensor<8x4xf32>
  %logits = linalg.matmul ins(%h, %rw : tensor<8x32xf32>, tensor<32x4xf32>) outs(%z : tensor<8x4xf32>) -> tensor<8x4xf32>
  %idx, %w = moe.router %logits top_k(2) softmax norm_topk_prob : tensor<8x4xf32> -> tensor<8x2xi32>, tensor<8x2xf32>
  %s, %o, %c, %p = moe.dispatch %h, %idx experts(4) : tensor<8x32xf32>, tensor<8x2xi32> -> tensor<16x32xf32>, tensor<5xi32>, tensor<4xi32>, tensor<8x2xi32>
  %ye = moe.grouped_mlp %s, %w1, %w2, %o : tensor<16x32xf32>, tensor<4x32x32xf32>, tensor<4x16x32xf32>, tensor<5xi32> -> tensor<16x32xf32>
  %y = moe.combine %ye, %w, %p : tensor<16x32xf32>, tensor<8x2xf32>, tensor<8x2xi32> -> tensor<8x32xf32>
  %r = arith.addf %x, %y : tensor<8x32xf32>
  %e2 = tensor.empty() : tensor<8x16xf32>
  %z2 = linalg.fill ins(%c0 : f32) outs(%e2 : tensor<8x16xf32>) -> tensor<8x16xf32>
  %lm = linalg.matmul ins(%r, %head : tensor<8x32xf32>, tensor<32x16xf32>) outs(%z2 : tensor<8x16xf32>) -> tensor<8x16xf32>
  %loss = moe.cross_entropy %lm, %labels : tensor<8x16xf32>, tensor<8xi32> -> tensor<f32>
  return %loss : tensor<f32>
}
