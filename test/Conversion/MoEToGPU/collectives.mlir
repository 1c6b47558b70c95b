// RUN: moe-opt %s -split-input-file --moe-gpu-pipeline="chip=sm_90a format=isa" --mlir-print-ir-after=gpu-async-region -o /dev/null 2>&1 | FileCheck %s
// RUN: moe-opt %s -split-input-file --moe-gpu-pipeline="chip=sm_90a format=isa" | FileCheck %s --check-prefix=LLVM

// Collectives over several ranks in the GPU pipeline: -convert-moe-to-runtime
// runs first, as on the CPU, and the calls stay on the host. Their buffers
// are device memory (gpu.alloc, or the function's arguments, which hold
// device pointers), and the program's stream is synchronized right before
// each call (gpu.wait on its last token): libmoert exchanges finished data;
// the rows travel on its stream until the wait, and the work after the start
// goes on a new stream of the program's.
// CHECK-LABEL: func.func @exchange
// CHECK-SAME: (%[[X:.*]]: memref<8x16xf32>, %[[C:.*]]: memref<4xi32>)
// CHECK-DAG: %[[XD:.*]] = memref.cast %[[X]] : memref<8x16xf32> to memref<?x?xf32>
// CHECK-DAG: %[[CD:.*]] = memref.cast %[[C]] : memref<4xi32> to memref<?xi32>
// CHECK: %[[R:.*]], %{{.*}} = gpu.alloc async [%{{.*}}] () : memref<16x16xf32>
// CHECK: %[[RC:.*]], %[[T:.*]] = gpu.alloc async [%{{.*}}] () : memref<4xi32>
// CHECK-DAG: %[[RD:.*]] = memref.cast %[[R]] : memref<16x16xf32> to memref<?x?xf32>
// CHECK-DAG: %[[RCD:.*]] = memref.cast %[[RC]] : memref<4xi32> to memref<?xi32>
// CHECK: gpu.wait [%[[T]]]
// CHECK-NEXT: %[[H:.*]] = call @moert_all_to_all_start_f32(%[[XD]], %[[CD]], %[[RD]], %[[RCD]], %c2_i64, %c1_i64, %c2_i64)
// CHECK-NOT: gpu.launch_func
// CHECK: call @moert_all_to_all_wait_f32(%[[H]], %{{.*}}, %[[RD]])
// CHECK: return %[[R]], %[[RC]]
// The host code: the stream synchronized and destroyed, the call, through
// the C interface libmoert implements.
// LLVM-LABEL: llvm.func @exchange
// LLVM: %[[S:.*]] = llvm.call @mgpuStreamCreate()
// LLVM: llvm.call @mgpuStreamSynchronize(%[[S]])
// LLVM-NEXT: llvm.call @mgpuStreamDestroy(%[[S]])
// LLVM-NOT: llvm.call
// LLVM: llvm.call @moert_all_to_all_start_f32(
// LLVM: llvm.call @moert_all_to_all_wait_f32(
// LLVM: llvm.call @_mlir_ciface_moert_all_to_all_start_f32(
// LLVM: llvm.func @_mlir_ciface_moert_all_to_all_start_f32(!llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, i64, i64, i64) -> i64
shard.grid @ep(shape = 2)
func.func @exchange(%x: tensor<8x16xf32>, %c: tensor<4xi32>) -> (tensor<16x16xf32>, tensor<4xi32>) {
  %r, %rc = moe.all_to_all %x, %c on @ep grid_axes = [0]
      : tensor<8x16xf32>, tensor<4xi32> -> tensor<16x16xf32>, tensor<4xi32>
  return %r, %rc : tensor<16x16xf32>, tensor<4xi32>
}

// -----

// A data-parallel gradient sum: flattened views of device buffers, started
// once the stream has written the input and waited for where the sums are
// read (here, the return: the rank is asked of the runtime in between).
// CHECK-LABEL: func.func @sum
// CHECK-SAME: (%[[G:.*]]: memref<32x8xf32>)
// CHECK-DAG: %[[GF:.*]] = memref.reinterpret_cast %[[G]] to offset: [0], sizes: [256], strides: [1] : memref<32x8xf32> to memref<256xf32>
// CHECK-DAG: %[[GD:.*]] = memref.cast %[[GF]] : memref<256xf32> to memref<?xf32>
// CHECK: %[[OUT:.*]], %[[T:.*]] = gpu.alloc async [%{{.*}}] () : memref<256xf32>
// CHECK: %[[OD:.*]] = memref.cast %[[OUT]] : memref<256xf32> to memref<?xf32>
// CHECK: gpu.wait [%[[T]]]
// CHECK-NEXT: %[[H:.*]] = call @moert_all_reduce_sum_start_f32(%[[GD]], %[[OD]], %c2_i64, %c1_i64, %c2_i64)
// CHECK: call @moert_comm_rank() : () -> i32
// CHECK: call @moert_all_reduce_sum_wait_f32(%[[H]], %{{.*}}, %[[OD]])
// CHECK: memref.expand_shape %[[OUT]] {{\[}}[0, 1]] output_shape [32, 8] : memref<256xf32> into memref<32x8xf32>
// LLVM-LABEL: llvm.func @sum
// LLVM: llvm.call @mgpuStreamSynchronize
// LLVM-NEXT: llvm.call @mgpuStreamDestroy
// LLVM-NOT: llvm.call
// LLVM: llvm.call @moert_all_reduce_sum_start_f32(
// LLVM: llvm.call @moert_comm_rank()
// LLVM: llvm.call @moert_all_reduce_sum_wait_f32(
shard.grid @ep(shape = 2)
func.func @sum(%g: tensor<32x8xf32>) -> (tensor<32x8xf32>, index) {
  %s = shard.all_reduce %g on @ep grid_axes = [0] : tensor<32x8xf32> -> tensor<32x8xf32>
  %r = shard.process_linear_index on @ep : index
  return %s, %r : tensor<32x8xf32>, index
}
