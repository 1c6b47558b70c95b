// RUN: moe-opt %s -split-input-file -convert-moe-to-runtime=overlap=false | FileCheck %s
// RUN: moe-opt %s -split-input-file -moe-cpu-pipeline | FileCheck %s --check-prefix=LLVM

// An exchange between 2 ranks, as one blocking call (overlap=false; see
// overlap.mlir for the default): the operands' buffers and two new buffers
// go to the runtime with the grid's size; the new buffers become the results.
// The grid, now unused, is erased.
// CHECK-NOT: shard.grid
// CHECK-LABEL: func.func @exchange
// CHECK-SAME: (%[[X:.*]]: tensor<8x16xf32>, %[[C:.*]]: tensor<4xi32>)
// CHECK-DAG: %[[G:.*]] = arith.constant 2 : i64
// CHECK-DAG: %[[S:.*]] = arith.constant 1 : i64
// CHECK-DAG: %[[XB:.*]] = bufferization.to_buffer %[[X]] read_only : tensor<8x16xf32> to memref<8x16xf32>
// CHECK-DAG: %[[XD:.*]] = memref.cast %[[XB]] : memref<8x16xf32> to memref<?x?xf32>
// CHECK-DAG: %[[CB:.*]] = bufferization.to_buffer %[[C]] read_only : tensor<4xi32> to memref<4xi32>
// CHECK-DAG: %[[CD:.*]] = memref.cast %[[CB]] : memref<4xi32> to memref<?xi32>
// CHECK-DAG: %[[R:.*]] = memref.alloc() : memref<16x16xf32>
// CHECK-DAG: %[[RC:.*]] = memref.alloc() : memref<4xi32>
// CHECK-DAG: %[[RD:.*]] = memref.cast %[[R]] : memref<16x16xf32> to memref<?x?xf32>
// CHECK-DAG: %[[RCD:.*]] = memref.cast %[[RC]] : memref<4xi32> to memref<?xi32>
// CHECK: call @moert_all_to_all_f32(%[[XD]], %[[CD]], %[[RD]], %[[RCD]], %[[G]], %[[S]], %{{.*}}) : (memref<?x?xf32>, memref<?xi32>, memref<?x?xf32>, memref<?xi32>, i64, i64, i64) -> ()
// CHECK-DAG: %[[RT:.*]] = bufferization.to_tensor %[[R]] restrict writable : memref<16x16xf32> to tensor<16x16xf32>
// CHECK-DAG: %[[RCT:.*]] = bufferization.to_tensor %[[RC]] restrict writable : memref<4xi32> to tensor<4xi32>
// CHECK: return %[[RT]], %[[RCT]]
// CHECK: func.func private @moert_all_to_all_f32(memref<?x?xf32> {moe.rows_counted_by = 1 : i64}, memref<?xi32>, memref<?x?xf32>, memref<?xi32>, i64, i64, i64) attributes {llvm.emit_c_interface}
// The CPU pipeline (overlap on: a start and a wait) bufferizes it and calls
// the runtime's C interface.
// LLVM-LABEL: llvm.func @exchange
// LLVM: %[[H:.*]] = llvm.call @moert_all_to_all_start_f32(
// LLVM: llvm.call @moert_all_to_all_wait_f32(%[[H]],
// LLVM: llvm.func private @moert_all_to_all_start_f32(
// LLVM: llvm.call @_mlir_ciface_moert_all_to_all_start_f32(
// LLVM: llvm.func @_mlir_ciface_moert_all_to_all_start_f32(!llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, i64, i64, i64) -> i64
// LLVM: llvm.func @_mlir_ciface_moert_all_to_all_wait_f32(i64, !llvm.ptr, !llvm.ptr)
shard.grid @ep(shape = 2)
func.func @exchange(%x: tensor<8x16xf32>, %c: tensor<4xi32>) -> (tensor<16x16xf32>, tensor<4xi32>) {
  %r, %rc = moe.all_to_all %x, %c on @ep grid_axes = [0]
      : tensor<8x16xf32>, tensor<4xi32> -> tensor<16x16xf32>, tensor<4xi32>
  return %r, %rc : tensor<16x16xf32>, tensor<4xi32>
}

// -----

// Slot-major sides: the `slots` entry point with the layout (bit 0: input,
// bit 1: result) and the padding. An input read from padded slots declares
// the padding on the call (its rows lie between padding, not in the first
// sum(counts); the declaration serves every layout).
// CHECK-LABEL: func.func @slots
// CHECK: call @moert_all_to_all_slots_f32(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %c2_i64, %c1_i64, %c2_i64{{[_0-9]*}}, %c2_i64{{[_0-9]*}}, %c4_i64) : (memref<?x?xf32>, memref<?xi32>, memref<?x?xf32>, memref<?xi32>, i64, i64, i64, i64, i64) -> ()
// CHECK: call @moert_all_to_all_slots_bf16(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) {moe.rows_in_slots_padded_to = 4 : i64} : (memref<?x?xbf16>, memref<?xi32>, memref<?x?xbf16>, memref<?xi32>, i64, i64, i64, i64, i64) -> ()
// CHECK: func.func private @moert_all_to_all_slots_f32(memref<?x?xf32> {moe.rows_counted_by = 1 : i64}, memref<?xi32>, memref<?x?xf32>, memref<?xi32>, i64, i64, i64, i64, i64) attributes {llvm.emit_c_interface}
// CHECK: func.func private @moert_all_to_all_slots_bf16(memref<?x?xbf16> {moe.rows_counted_by = 1 : i64}, memref<?xi32>, memref<?x?xbf16>, memref<?xi32>, i64, i64, i64, i64, i64) attributes {llvm.emit_c_interface}
shard.grid @ep(shape = 2)
func.func @slots(%x: tensor<8x16xf32>, %y: tensor<40x16xbf16>, %c: tensor<4xi32>)
    -> (tensor<40x16xf32>, tensor<8x16xbf16>) {
  %r, %rc = moe.all_to_all %x, %c on @ep slot_major_result pad_to(4)
      : tensor<8x16xf32>, tensor<4xi32> -> tensor<40x16xf32>, tensor<4xi32>
  %b, %bc = moe.all_to_all %y, %c on @ep slot_major_input pad_to(4)
      : tensor<40x16xbf16>, tensor<4xi32> -> tensor<8x16xbf16>, tensor<4xi32>
  return %r, %b : tensor<40x16xf32>, tensor<8x16xbf16>
}

// -----

// bf16 rows and i64 counts (sent as i32); one declaration for both calls.
// CHECK-LABEL: func.func @bf16_i64
// CHECK: %[[C32:.*]] = arith.trunci %{{.*}} : tensor<4xi64> to tensor<4xi32>
// CHECK: bufferization.to_buffer %[[C32]] read_only
// CHECK: call @moert_all_to_all_bf16(
// CHECK: %[[RC:.*]] = bufferization.to_tensor %{{.*}} restrict writable : memref<4xi32> to tensor<4xi32>
// CHECK: arith.extsi %[[RC]] : tensor<4xi32> to tensor<4xi64>
// CHECK: call @moert_all_to_all_bf16(
// CHECK: call @moert_all_to_all_bf16({{.*}}, %c4_i64, %c1_i64{{[_0-9]*}}, %c4_i64{{[_0-9]*}})
// CHECK-COUNT-1: func.func private @moert_all_to_all_bf16
// LLVM-LABEL: llvm.func @bf16_i64
// LLVM-COUNT-2: llvm.call @moert_all_to_all_start_bf16(
shard.grid @ep(shape = 2)
shard.grid @four(shape = 4)
func.func @bf16_i64(%x: tensor<8x16xbf16>, %c: tensor<4xi64>) -> (tensor<8x16xbf16>, tensor<4xi64>) {
  %r, %rc = moe.all_to_all %x, %c on @ep
      : tensor<8x16xbf16>, tensor<4xi64> -> tensor<16x16xbf16>, tensor<4xi64>
  %b, %bc = moe.all_to_all %r, %rc on @ep
      : tensor<16x16xbf16>, tensor<4xi64> -> tensor<8x16xbf16>, tensor<4xi64>
  %d, %dc = moe.all_to_all %b, %bc on @four
      : tensor<8x16xbf16>, tensor<4xi64> -> tensor<8x16xbf16>, tensor<4xi64>
  return %d, %dc : tensor<8x16xbf16>, tensor<4xi64>
}

// -----

// Sums over the grid: the flattened tensor; the input is converted to the
// result's element type first. The rank is the runtime's.
// CHECK-LABEL: func.func @reduce
// CHECK: %[[F:.*]] = tensor.collapse_shape %{{.*}} {{\[\[}}0, 1]] : tensor<4x8xf32> into tensor<32xf32>
// CHECK: %[[B:.*]] = bufferization.to_buffer %[[F]] read_only : tensor<32xf32> to memref<32xf32>
// CHECK: %[[BD:.*]] = memref.cast %[[B]] : memref<32xf32> to memref<?xf32>
// CHECK: %[[O:.*]] = memref.alloc() : memref<32xf32>
// CHECK: %[[OD:.*]] = memref.cast %[[O]] : memref<32xf32> to memref<?xf32>
// CHECK: call @moert_all_reduce_sum_f32(%[[BD]], %[[OD]], %{{.*}}, %{{.*}}, %{{.*}}) : (memref<?xf32>, memref<?xf32>, i64, i64, i64) -> ()
// CHECK: %[[T:.*]] = bufferization.to_tensor %[[O]] restrict writable : memref<32xf32> to tensor<32xf32>
// CHECK: tensor.expand_shape %[[T]] {{\[\[}}0, 1]] output_shape [4, 8] : tensor<32xf32> into tensor<4x8xf32>
// CHECK: %[[W:.*]] = arith.extf %{{.*}} : tensor<3xf16> to tensor<3xf32>
// CHECK: bufferization.to_buffer %[[W]] read_only
// CHECK: call @moert_all_reduce_sum_f32(
// CHECK: tensor.expand_shape %{{.*}} [] output_shape [1] : tensor<f64> into tensor<1xf64>
// CHECK: call @moert_all_reduce_sum_f64(
// CHECK: %[[R:.*]] = call @moert_comm_rank() : () -> i32
// CHECK: arith.index_cast %[[R]] : i32 to index
// CHECK: func.func private @moert_all_reduce_sum_f32(memref<?xf32>, memref<?xf32>, i64, i64, i64) attributes {llvm.emit_c_interface}
// CHECK: func.func private @moert_comm_rank() -> i32
// CHECK-NOT: llvm.emit_c_interface
// LLVM-LABEL: llvm.func @reduce
// LLVM: llvm.call @moert_comm_rank() : () -> i32
// LLVM: llvm.func @moert_comm_rank() -> i32
shard.grid @ep(shape = 2)
func.func @reduce(%g: tensor<4x8xf32>, %h: tensor<3xf16>, %s: tensor<f64>)
    -> (tensor<4x8xf32>, tensor<3xf32>, tensor<f64>, index) {
  %0 = shard.all_reduce %g on @ep grid_axes = [0] : tensor<4x8xf32> -> tensor<4x8xf32>
  %1 = shard.all_reduce %h on @ep grid_axes = [0] : tensor<3xf16> -> tensor<3xf32>
  %2 = shard.all_reduce %s on @ep grid_axes = [0] : tensor<f64> -> tensor<f64>
  %3 = shard.process_linear_index on @ep : index
  return %0, %1, %2, %3 : tensor<4x8xf32>, tensor<3xf32>, tensor<f64>, index
}

// -----

// A 2 x 3 grid (data x expert parallel, rank = 3 d + e): an exchange over
// axis 1 runs among 3 ranks 1 apart, a sum over axis 0 among 2 ranks 3
// apart, a sum over both among all 6; the coordinate on axis 1 is rank mod 3,
// on axis 0 rank / 3 (mod 2).
// CHECK-LABEL: func.func @grid_2d
// CHECK: call @moert_all_to_all_f32(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %c3_i64, %c1_i64, %c6_i64)
// CHECK: call @moert_all_reduce_sum_f32(%{{.*}}, %{{.*}}, %c2_i64, %c3_i64{{.*}}, %c6_i64{{.*}})
// CHECK: call @moert_all_reduce_sum_f32(%{{.*}}, %{{.*}}, %c6_i64{{.*}}, %c1_i64{{.*}}, %c6_i64{{.*}})
// CHECK: %[[R32:.*]] = call @moert_comm_rank() : () -> i32
// CHECK: %[[R:.*]] = arith.index_cast %[[R32]] : i32 to index
// CHECK: %[[D0:.*]] = arith.divui %[[R]], %c3
// CHECK: %[[A0:.*]] = arith.remui %[[D0]], %c2
// CHECK: %[[D1:.*]] = arith.divui %[[R]], %c1
// CHECK: %[[A1:.*]] = arith.remui %[[D1]], %c3
// CHECK: return %{{.*}}, %{{.*}}, %{{.*}}, %[[A1]], %[[A0]]
shard.grid @dpep(shape = 2x3)
func.func @grid_2d(%x: tensor<8x16xf32>, %c: tensor<6xi32>, %g: tensor<4xf32>)
    -> (tensor<24x16xf32>, tensor<4xf32>, tensor<4xf32>, index, index) {
  %r, %rc = moe.all_to_all %x, %c on @dpep grid_axes = [1]
      : tensor<8x16xf32>, tensor<6xi32> -> tensor<24x16xf32>, tensor<6xi32>
  %s0 = shard.all_reduce %g on @dpep grid_axes = [0] : tensor<4xf32> -> tensor<4xf32>
  %s01 = shard.all_reduce %g on @dpep grid_axes = [0, 1] : tensor<4xf32> -> tensor<4xf32>
  %i:2 = shard.process_multi_index on @dpep : index, index
  return %r, %s0, %s01, %i#1, %i#0 : tensor<24x16xf32>, tensor<4xf32>, tensor<4xf32>, index, index
}

// -----

// One rank: the exchange is left to -convert-moe-to-linalg (a copy, which
// erases the grid), the sum is the input, the rank 0.
// CHECK: shard.grid @one(shape = 1)
// CHECK-LABEL: func.func @one_rank
// CHECK-NOT: call
// CHECK: moe.all_to_all %{{.*}} on @one
// CHECK: %[[Z:.*]] = arith.constant 0 : index
// CHECK: return %{{.*}}, %{{.*}}, %[[Z]]
// LLVM-LABEL: llvm.func @one_rank
// LLVM-NOT: moert
shard.grid @one(shape = 1)
func.func @one_rank(%x: tensor<8x16xf32>, %c: tensor<2xi32>, %g: tensor<4xf32>)
    -> (tensor<8x16xf32>, tensor<4xf32>, index) {
  %r, %rc = moe.all_to_all %x, %c on @one
      : tensor<8x16xf32>, tensor<2xi32> -> tensor<8x16xf32>, tensor<2xi32>
  %s = shard.all_reduce %g on @one grid_axes = [0] : tensor<4xf32> -> tensor<4xf32>
  %i = shard.process_linear_index on @one : index
  return %r, %s, %i : tensor<8x16xf32>, tensor<4xf32>, index
}
