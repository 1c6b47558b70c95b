// RUN: moe-opt %s -split-input-file --moe-expert-parallel=ep-size=2 | FileCheck %s
// RUN: moe-opt %s -split-input-file --moe-expert-parallel="ep-size=2 remarks=true" -verify-diagnostics -o /dev/null
// RUN: moe-opt %s -split-input-file --moe-expert-parallel="ep-size=2 chunks=2" | FileCheck %s --check-prefix=CHUNKS

// A layer with 8 experts over 2 ranks: the weight arguments become this
// rank's 4 experts; rows go out by global expert and arrive grouped by local
// expert (slot-major, the original pad_to), are computed where they arrived
// (groups from moe.slot_offsets), and go back read from those groups.
// CHECK: shard.grid @ep(shape = 2)
// CHECK-LABEL: func.func @layer
// CHECK-SAME: %[[W1:[a-z0-9]+]]: tensor<4x64x64xf32> {moe.expert_shard = {axis = 0 : i64, experts = 8 : i64, grid = "ep", local_experts = 4 : i64}}
// CHECK-SAME: %[[W2:[a-z0-9]+]]: tensor<4x32x64xf32> {moe.expert_shard = {axis = 0 : i64, experts = 8 : i64, grid = "ep", local_experts = 4 : i64}}
// CHECK: %{{.*}}, %[[W:.*]] = moe.router
// CHECK: %[[S:.*]], %{{.*}}, %[[C:.*]], %[[P:.*]] = moe.dispatch %{{.*}} experts(8) : {{.*}} -> tensor<32x64xf32>, tensor<9xi32>, tensor<8xi32>, tensor<16x2xi32>
// CHECK: %[[R:.*]], %[[RC:.*]] = moe.all_to_all %[[S]], %[[C]] on @ep grid_axes = [0] slot_major_result pad_to(4) : tensor<32x64xf32>, tensor<8xi32> -> tensor<96x64xf32>, tensor<8xi32>
// CHECK: %[[LO:.*]] = moe.slot_offsets %[[RC]] pad_to(4) : tensor<8xi32> -> tensor<5xi32>
// CHECK-NOT: moe.dispatch
// CHECK: %[[H:.*]] = moe.grouped_matmul %[[R]], %[[W1]], %[[LO]]
// CHECK: moe.swiglu %[[H]]
// CHECK: %[[Y:.*]] = moe.grouped_matmul %{{.*}}, %[[W2]], %[[LO]]
// CHECK-NOT: moe.combine
// CHECK: %[[B:.*]], %{{.*}} = moe.all_to_all %[[Y]], %[[RC]] on @ep grid_axes = [0] slot_major_input pad_to(4) : tensor<96x64xf32>, tensor<8xi32> -> tensor<32x64xf32>, tensor<8xi32>
// CHECK: %[[OUT:.*]] = moe.combine %[[B]], %[[W]], %[[P]]
// CHECK: return %[[OUT]]
// chunks=2: two halves of 8 tokens, stage by stage: both halves dispatched
// and sent out, then both computed and sent back, then both combined into
// the layer's output.
// CHUNKS-LABEL: func.func @layer
// CHUNKS-SAME: (%[[X:[a-z0-9]+]]: tensor<16x64xf32>
// CHUNKS: %[[IDX:.*]], %[[W:.*]] = moe.router
// CHUNKS: %[[X0:.*]] = tensor.extract_slice %[[X]][0, 0] [8, 64] [1, 1]
// CHUNKS: %[[I0:.*]] = tensor.extract_slice %[[IDX]][0, 0] [8, 2] [1, 1]
// CHUNKS: %[[W0:.*]] = tensor.extract_slice %[[W]][0, 0] [8, 2] [1, 1]
// CHUNKS: %[[S0:.*]], %{{.*}}, %[[C0:.*]], %[[P0:.*]] = moe.dispatch %[[X0]], %[[I0]] experts(8) : {{.*}} -> tensor<16x64xf32>, tensor<9xi32>, tensor<8xi32>, tensor<8x2xi32>
// CHUNKS: %[[R0:.*]], %[[RC0:.*]] = moe.all_to_all %[[S0]], %[[C0]] on @ep grid_axes = [0] slot_major_result pad_to(4) : tensor<16x64xf32>, tensor<8xi32> -> tensor<64x64xf32>, tensor<8xi32>
// CHUNKS: %[[X1:.*]] = tensor.extract_slice %[[X]][8, 0] [8, 64] [1, 1]
// CHUNKS: %[[S1:.*]], %{{.*}}, %[[C1:.*]], %[[P1:.*]] = moe.dispatch %[[X1]]
// CHUNKS: %[[R1:.*]], %[[RC1:.*]] = moe.all_to_all %[[S1]], %[[C1]]
// CHUNKS: moe.slot_offsets %[[RC0]] pad_to(4)
// CHUNKS: moe.grouped_matmul %[[R0]]
// CHUNKS: %[[B0:.*]], %{{.*}} = moe.all_to_all %{{.*}}, %[[RC0]] on @ep grid_axes = [0] slot_major_input pad_to(4)
// CHUNKS: moe.slot_offsets %[[RC1]] pad_to(4)
// CHUNKS: moe.grouped_matmul %[[R1]]
// CHUNKS: %[[B1:.*]], %{{.*}} = moe.all_to_all %{{.*}}, %[[RC1]]
// CHUNKS: %[[E:.*]] = tensor.empty() : tensor<16x64xf32>
// CHUNKS: %[[Y0:.*]] = moe.combine %[[B0]], %[[W0]], %[[P0]] : tensor<16x64xf32>, tensor<8x2xf32>, tensor<8x2xi32> -> tensor<8x64xf32>
// CHUNKS: %[[O0:.*]] = tensor.insert_slice %[[Y0]] into %[[E]][0, 0] [8, 64] [1, 1]
// CHUNKS: %[[Y1:.*]] = moe.combine %[[B1]]
// CHUNKS: %[[O1:.*]] = tensor.insert_slice %[[Y1]] into %[[O0]][8, 0] [8, 64] [1, 1]
// CHUNKS: return %[[O1]]
func.func @layer(%x: tensor<16x64xf32>, %logits: tensor<16x8xf32>,
                 %w1: tensor<8x64x64xf32>, %w2: tensor<8x32x64xf32>) -> tensor<16x64xf32> {
  %idx, %w = moe.router %logits top_k(2) softmax norm_topk_prob
      : tensor<16x8xf32> -> tensor<16x2xi32>, tensor<16x2xf32>
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(8) pad_to(4)
      : tensor<16x64xf32>, tensor<16x2xi32> -> tensor<56x64xf32>, tensor<9xi32>, tensor<8xi32>, tensor<16x2xi32>
  %h = moe.grouped_matmul %s, %w1, %o : tensor<56x64xf32>, tensor<8x64x64xf32>, tensor<9xi32> -> tensor<56x64xf32>
  %a = moe.swiglu %h : tensor<56x64xf32> -> tensor<56x32xf32>
  %y = moe.grouped_matmul %a, %w2, %o : tensor<56x32xf32>, tensor<8x32x64xf32>, tensor<9xi32> -> tensor<56x64xf32>
  %out = moe.combine %y, %w, %p : tensor<56x64xf32>, tensor<16x2xf32>, tensor<16x2xi32> -> tensor<16x64xf32>
  return %out : tensor<16x64xf32>
}

// -----

// A weight that is not an argument (here: computed) is sliced at this
// rank's offset; quantized-in-graph weights are sharded before quantizing.
// CHECK-LABEL: func.func @computed_weight
// CHECK: %[[RANK:.*]] = shard.process_multi_index on @ep axes = [0]
// CHECK: %[[OFF:.*]] = arith.muli %[[RANK]], %c4
// CHECK: tensor.extract_slice %{{.*}}[%[[OFF]], 0, 0] [4, 32, 32] [1, 1, 1] : tensor<8x32x32xf32> to tensor<4x32x32xf32>
// CHECK: moe.quantize %{{.*}} : tensor<4x32x32xf32> -> !moe.mx<4x32x32xf8E4M3FN, axis = 1>
func.func @computed_weight(%x: tensor<8x32xf32>, %idx: tensor<8x1xi32>, %w: tensor<8x32x32xf32>)
    -> tensor<8x32xf32> {
  %w2 = arith.mulf %w, %w : tensor<8x32x32xf32>
  %wq = moe.quantize %w2 : tensor<8x32x32xf32> -> !moe.mx<8x32x32xf8E4M3FN, axis = 1>
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(8)
      : tensor<8x32xf32>, tensor<8x1xi32> -> tensor<8x32xf32>, tensor<9xi32>, tensor<8xi32>, tensor<8x1xi32>
  %y = moe.grouped_matmul %s, %wq, %o : tensor<8x32xf32>, !moe.mx<8x32x32xf8E4M3FN, axis = 1>, tensor<9xi32> -> tensor<8x32xf32>
  %ones = arith.constant dense<1.0> : tensor<8x1xf32>
  %out = moe.combine %y, %ones, %p : tensor<8x32xf32>, tensor<8x1xf32>, tensor<8x1xi32> -> tensor<8x32xf32>
  return %out : tensor<8x32xf32>
}

// -----

// Gradients of data-parallel parameters are summed over the ranks; those of
// expert shards stay with their owners.
// CHECK-LABEL: func.func @train_step
// CHECK: %[[G:.*]] = shard.all_reduce %{{.*}} on @ep grid_axes = [0] : tensor<32x8xf32> -> tensor<32x8xf32>
// CHECK-NOT: shard.all_reduce
// CHECK: return %{{.*}}, %[[G]], %{{.*}}
func.func @train_step(%x: tensor<8x32xf32>, %router: tensor<32x8xf32>, %w: tensor<8x32x32xf32>,
                      %idx: tensor<8x1xi32>, %dr: tensor<32x8xf32>, %dw: tensor<8x32x32xf32>)
    -> (tensor<8x32xf32>, tensor<32x8xf32> {moe.gradient_of = 1 : i64},
        tensor<8x32x32xf32> {moe.gradient_of = 2 : i64}) {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(8)
      : tensor<8x32xf32>, tensor<8x1xi32> -> tensor<8x32xf32>, tensor<9xi32>, tensor<8xi32>, tensor<8x1xi32>
  %y = moe.grouped_matmul %s, %w, %o : tensor<8x32xf32>, tensor<8x32x32xf32>, tensor<9xi32> -> tensor<8x32xf32>
  %ones = arith.constant dense<1.0> : tensor<8x1xf32>
  %out = moe.combine %y, %ones, %p : tensor<8x32xf32>, tensor<8x1xf32>, tensor<8x1xi32> -> tensor<8x32xf32>
  return %out, %dr, %dw : tensor<8x32xf32>, tensor<32x8xf32>, tensor<8x32x32xf32>
}

// -----

// What it leaves alone, with a remark saying why.
// CHECK-LABEL: func.func @unknown_op_in_experts
// CHECK-NOT: moe.all_to_all
func.func @unknown_op_in_experts(%x: tensor<8x32xf32>, %idx: tensor<8x1xi32>, %w: tensor<8x32x32xf32>)
    -> tensor<8x32xf32> {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(8)
      : tensor<8x32xf32>, tensor<8x1xi32> -> tensor<8x32xf32>, tensor<9xi32>, tensor<8xi32>, tensor<8x1xi32>
  %y = moe.grouped_matmul %s, %w, %o : tensor<8x32xf32>, tensor<8x32x32xf32>, tensor<9xi32> -> tensor<8x32xf32>
  %z = arith.addf %y, %y : tensor<8x32xf32>
  %ones = arith.constant dense<1.0> : tensor<8x1xf32>
  // expected-remark @+1 {{not sharded: 'arith.addf' in the expert computation has no sharded form}}
  %out = moe.combine %z, %ones, %p : tensor<8x32xf32>, tensor<8x1xf32>, tensor<8x1xi32> -> tensor<8x32xf32>
  return %out : tensor<8x32xf32>
}

// -----

// A layer function (moe-model --layer-functions): its expert weight becomes
// this rank's shard, and so does the caller's argument that only such calls
// read; a weight the caller computes is sliced at the rank's offset before
// the call. Gradients returned by the private function are not summed (the
// public step sums them once).
// CHECK-LABEL: func.func private @layer_fn(
// CHECK-SAME: tensor<4x32x32xf32> {moe.expert_shard = {axis = 0 : i64, experts = 8 : i64, grid = "ep", local_experts = 4 : i64}}
// CHECK-NOT: shard.all_reduce
// CHECK: return
// CHECK-LABEL: func.func @caller(
// CHECK-SAME: %[[W:[^:]*]]: tensor<4x32x32xf32> {moe.expert_shard = {axis = 0 : i64, experts = 8 : i64, grid = "ep", local_experts = 4 : i64}}
// CHECK-SAME: %[[V:[^:]*]]: tensor<8x32x32xf32>)
// CHECK: call @layer_fn(%{{.*}}, %{{.*}}, %[[W]])
// CHECK: %[[R:.*]] = shard.process_multi_index on @ep axes = [0] : index
// CHECK: %[[OFF:.*]] = arith.muli %[[R]], %c4
// CHECK: %[[S:.*]] = tensor.extract_slice %{{.*}}[%[[OFF]], 0, 0] [4, 32, 32] [1, 1, 1] : tensor<8x32x32xf32> to tensor<4x32x32xf32>
// CHECK: call @layer_fn(%{{.*}}, %{{.*}}, %[[S]])
func.func private @layer_fn(%x: tensor<8x32xf32>, %idx: tensor<8x1xi32>, %w: tensor<8x32x32xf32>)
    -> (tensor<8x32xf32>, tensor<8x32xf32> {moe.gradient_of = 0 : i64}) {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(8)
      : tensor<8x32xf32>, tensor<8x1xi32> -> tensor<8x32xf32>, tensor<9xi32>, tensor<8xi32>, tensor<8x1xi32>
  %y = moe.grouped_matmul %s, %w, %o : tensor<8x32xf32>, tensor<8x32x32xf32>, tensor<9xi32> -> tensor<8x32xf32>
  %ones = arith.constant dense<1.0> : tensor<8x1xf32>
  %out = moe.combine %y, %ones, %p : tensor<8x32xf32>, tensor<8x1xf32>, tensor<8x1xi32> -> tensor<8x32xf32>
  return %out, %x : tensor<8x32xf32>, tensor<8x32xf32>
}
func.func @caller(%x: tensor<8x32xf32>, %idx: tensor<8x1xi32>, %w: tensor<8x32x32xf32>, %v: tensor<8x32x32xf32>)
    -> tensor<8x32xf32> {
  %a, %ga = func.call @layer_fn(%x, %idx, %w) : (tensor<8x32xf32>, tensor<8x1xi32>, tensor<8x32x32xf32>) -> (tensor<8x32xf32>, tensor<8x32xf32>)
  %v2 = arith.mulf %v, %v : tensor<8x32x32xf32>
  %b, %gb = func.call @layer_fn(%a, %idx, %v2) : (tensor<8x32xf32>, tensor<8x1xi32>, tensor<8x32x32xf32>) -> (tensor<8x32xf32>, tensor<8x32xf32>)
  return %b : tensor<8x32xf32>
}
