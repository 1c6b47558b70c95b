// RUN: moe-opt %s --moe-expert-parallel=ep-size=2 -o %t.ep2.mlir
// RUN: moe-compile %t.ep2.mlir --target=sm_90a --verify-ptx -o %t.ep2.so | FileCheck %s --check-prefix=PTX
// RUN: llvm-nm -D %t.ep2.so | FileCheck %s --check-prefix=SYMS
// RUN: moe-opt %t.ep2.mlir --moe-gpu-pipeline="chip=sm_90a format=isa" | FileCheck %s
// RUN: moe-opt %s --moe-expert-parallel="ep-size=2 chunks=2" --moe-gpu-pipeline="chip=sm_90a format=isa" | FileCheck %s --check-prefix=CHUNKS
// The whole training pipeline (moe.experts grouped, MXFP8, fused, 2 ranks):
// RUN: moe-opt %S/../../Pipelines/train-pipeline.mlir --moe-train-pipeline="ep-size=2 recipe=mxfp8" -o %t.train.mlir
// RUN: moe-compile %t.train.mlir --target=sm_90a --verify-ptx -o %t.train.so | FileCheck %s --check-prefix=PTX
// RUN: llvm-nm -D %t.train.so | FileCheck %s --check-prefix=TRAIN

// Expert-parallel layers compile for the GPU: every moe.all_to_all (and the
// gradient's shard.all_reduce) becomes a host call of libmoert on device
// buffers, between two streams of kernels. The artifact leaves the
// collectives to libmoert (NCCL between GPUs; scripts/gpu-ep-check.sh runs
// it on 2 GPUs against the single-GPU layer).
// PTX: ptxas accepted {{[1-9][0-9]*}} kernel modules for sm_90a
// SYMS-DAG: T _mlir_ciface_layer
// SYMS-DAG: T _mlir_ciface_router_grad
// SYMS-DAG: U _mlir_ciface_moert_all_reduce_sum_start_f32
// SYMS-DAG: U _mlir_ciface_moert_all_reduce_sum_wait_f32
// SYMS-DAG: U _mlir_ciface_moert_all_to_all_slots_start_f32
// SYMS-DAG: U _mlir_ciface_moert_all_to_all_wait_f32
// TRAIN: U _mlir_ciface_moert_all_to_all_slots_start_f32

// Tokens out to the experts' owners and back: two exchanges, each started
// after the stream of the kernels before it is synchronized and waited for
// before the kernels that read its rows; a new stream follows each call.
// Between the first start and its wait, the kernel computing the local groups
// (moe.slot_offsets: it needs only the counts) runs while the rows travel.
// CHECK-LABEL: llvm.func @layer(
// CHECK: %[[S1:.*]] = llvm.call @mgpuStreamCreate()
// CHECK: gpu.launch_func <%[[S1]] : !llvm.ptr>
// CHECK: llvm.call @mgpuStreamSynchronize(%[[S1]])
// CHECK-NEXT: llvm.call @mgpuStreamDestroy(%[[S1]])
// CHECK-NEXT: %[[H1:.*]] = llvm.call @moert_all_to_all_slots_start_f32(
// CHECK-NEXT: %[[S2:.*]] = llvm.call @mgpuStreamCreate()
// CHECK: gpu.launch_func <%[[S2]] : !llvm.ptr>
// CHECK-NOT: llvm.call @moert_
// CHECK: llvm.call @mgpuStreamSynchronize(%[[S2]])
// CHECK-NEXT: llvm.call @mgpuStreamDestroy(%[[S2]])
// CHECK-NOT: gpu.launch_func
// CHECK: llvm.call @moert_all_to_all_wait_f32(%[[H1]],
// CHECK-NEXT: %[[S3:.*]] = llvm.call @mgpuStreamCreate()
// CHECK: gpu.launch_func <%[[S3]] : !llvm.ptr>
// CHECK: llvm.call @mgpuStreamSynchronize(%[[S3]])
// CHECK-NEXT: llvm.call @mgpuStreamDestroy(%[[S3]])
// CHECK-NEXT: %[[H2:.*]] = llvm.call @moert_all_to_all_slots_start_f32(
// CHECK-NOT: gpu.launch_func
// CHECK: llvm.call @moert_all_to_all_wait_f32(%[[H2]],
// CHECK-NEXT: %[[S4:.*]] = llvm.call @mgpuStreamCreate()
// CHECK: gpu.launch_func <%[[S4]] : !llvm.ptr>
// CHECK-NOT: llvm.call @moert_
// CHECK: llvm.return
// CHECK-LABEL: llvm.func @router_grad(
// CHECK-COUNT-2: llvm.call @moert_all_to_all_slots_start_f32(
// CHECK: %[[HR:.*]] = llvm.call @moert_all_reduce_sum_start_f32(
// CHECK: llvm.call @moert_all_reduce_sum_wait_f32(%[[HR]],
// CHECK: llvm.return

// With chunks=2: both chunks' rows go out before the first chunk's experts
// run; the second chunk's rows travel during them, and the first chunk's
// results return while the second chunk computes.
// CHUNKS-LABEL: llvm.func @layer(
// CHUNKS: %[[A:.*]] = llvm.call @moert_all_to_all_slots_start_f32(
// CHUNKS: %[[B:.*]] = llvm.call @moert_all_to_all_slots_start_f32(
// CHUNKS: llvm.call @moert_all_to_all_wait_f32(%[[A]],
// CHUNKS: gpu.launch_func
// CHUNKS: %[[C:.*]] = llvm.call @moert_all_to_all_slots_start_f32(
// CHUNKS: llvm.call @moert_all_to_all_wait_f32(%[[B]],
// CHUNKS: gpu.launch_func
// CHUNKS: %[[D:.*]] = llvm.call @moert_all_to_all_slots_start_f32(
// CHUNKS: llvm.call @moert_all_to_all_wait_f32(%[[C]],
// CHUNKS: gpu.launch_func
// CHUNKS: llvm.call @moert_all_to_all_wait_f32(%[[D]],
// CHUNKS: gpu.launch_func
// CHUNKS: llvm.return
func.func @layer(%x: tensor<24x32xf32>, %logits: tensor<24x8xf32>,
    %w1: tensor<8x32x64xf32>, %w2: tensor<8x32x32xf32>) -> tensor<24x32xf32> {
  %idx, %w = moe.router %logits top_k(2) softmax norm_topk_prob
      : tensor<24x8xf32> -> tensor<24x2xi32>, tensor<24x2xf32>
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(8)
      : tensor<24x32xf32>, tensor<24x2xi32> -> tensor<48x32xf32>, tensor<9xi32>, tensor<8xi32>, tensor<24x2xi32>
  %h = moe.grouped_matmul %s, %w1, %o : tensor<48x32xf32>, tensor<8x32x64xf32>, tensor<9xi32> -> tensor<48x64xf32>
  %a = moe.swiglu %h : tensor<48x64xf32> -> tensor<48x32xf32>
  %y = moe.grouped_matmul %a, %w2, %o : tensor<48x32xf32>, tensor<8x32x32xf32>, tensor<9xi32> -> tensor<48x32xf32>
  %out = moe.combine %y, %w, %p : tensor<48x32xf32>, tensor<24x2xf32>, tensor<24x2xi32> -> tensor<24x32xf32>
  return %out : tensor<24x32xf32>
}

func.func @router_grad(%x: tensor<16x32xf32>, %wr: tensor<32x8xf32>,
    %w1: tensor<8x32x64xf32>, %w2: tensor<8x32x32xf32>)
    -> (tensor<16x32xf32>, tensor<32x8xf32> {moe.gradient_of = 1 : i64}) {
  %zero = arith.constant 0.0 : f32
  %e0 = tensor.empty() : tensor<16x8xf32>
  %z0 = linalg.fill ins(%zero : f32) outs(%e0 : tensor<16x8xf32>) -> tensor<16x8xf32>
  %logits = linalg.matmul ins(%x, %wr : tensor<16x32xf32>, tensor<32x8xf32>) outs(%z0 : tensor<16x8xf32>) -> tensor<16x8xf32>
  %idx, %w = moe.router %logits top_k(2) softmax norm_topk_prob
      : tensor<16x8xf32> -> tensor<16x2xi32>, tensor<16x2xf32>
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(8)
      : tensor<16x32xf32>, tensor<16x2xi32> -> tensor<32x32xf32>, tensor<9xi32>, tensor<8xi32>, tensor<16x2xi32>
  %y = moe.grouped_mlp %s, %w1, %w2, %o : tensor<32x32xf32>, tensor<8x32x64xf32>, tensor<8x32x32xf32>, tensor<9xi32> -> tensor<32x32xf32>
  %out = moe.combine %y, %w, %p : tensor<32x32xf32>, tensor<16x2xf32>, tensor<16x2xi32> -> tensor<16x32xf32>
  %et = tensor.empty() : tensor<32x16xf32>
  %xt = linalg.transpose ins(%x : tensor<16x32xf32>) outs(%et : tensor<32x16xf32>) permutation = [1, 0]
  %eg = tensor.empty() : tensor<32x8xf32>
  %zg = linalg.fill ins(%zero : f32) outs(%eg : tensor<32x8xf32>) -> tensor<32x8xf32>
  %g = linalg.matmul ins(%xt, %logits : tensor<32x16xf32>, tensor<16x8xf32>) outs(%zg : tensor<32x8xf32>) -> tensor<32x8xf32>
  return %out, %g : tensor<16x32xf32>, tensor<32x8xf32>
}
