// RUN: moe-opt %s -split-input-file -convert-moe-to-runtime | FileCheck %s
// RUN: moe-opt %s -split-input-file -convert-moe-to-runtime -cse | FileCheck %s --check-prefix=CSE
// CSE-LABEL: func.func @overlap
// CSE: bufferization.to_buffer %{{.*}} read_only : tensor<8x16xf32> to memref<8x16xf32>
// CSE: call @moert_all_to_all_start_f32
// CSE: bufferization.to_buffer %{{.*}} read_only : tensor<8x16xf32> to memref<8x16xf32, strided<[?, ?], offset: ?>>
// CSE: call @moert_all_to_all_wait_f32

// By default an exchange is a start and a wait: the start right after its
// operands are defined (ahead of the unrelated %u), its received counts
// usable right after it, the wait right before the first op reading the
// received rows (after the unrelated %v and the counts' user %n). The wait
// reads the input again (to_buffer, typed with any strided layout so that
// CSE cannot fold it into the start's read; RUN 2 checks that) and gets the
// start's handle and the result buffer.
// CHECK-LABEL: func.func @overlap
// CHECK-SAME: (%[[X:.*]]: tensor<8x16xf32>, %[[C:.*]]: tensor<4xi32>, %[[Z:.*]]: tensor<32xf32>)
// CHECK: %[[XB:.*]] = bufferization.to_buffer %[[X]] read_only
// CHECK: %[[XD:.*]] = memref.cast %[[XB]]
// CHECK: %[[R:.*]] = memref.alloc() : memref<16x16xf32>
// CHECK: %[[RD:.*]] = memref.cast %[[R]]
// CHECK: %[[H:.*]] = call @moert_all_to_all_start_f32(%[[XD]], %{{.*}}, %[[RD]], %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) : (memref<?x?xf32>, memref<?xi32>, memref<?x?xf32>, memref<?xi32>, i64, i64, i64) -> i64
// CHECK: %[[RC:.*]] = bufferization.to_tensor %{{.*}} restrict writable : memref<4xi32> to tensor<4xi32>
// CHECK: %[[U:.*]] = arith.addf %[[Z]], %[[Z]]
// CHECK: %[[N:.*]] = arith.addi %[[RC]], %[[RC]]
// CHECK: %[[V:.*]] = arith.mulf %[[U]], %[[U]]
// CHECK: %[[XB2:.*]] = bufferization.to_buffer %[[X]] read_only : tensor<8x16xf32> to memref<8x16xf32, strided<[?, ?], offset: ?>>
// CHECK: %[[XD2:.*]] = memref.cast %[[XB2]]
// CHECK: call @moert_all_to_all_wait_f32(%[[H]], %[[XD2]], %[[RD]]) : (i64, memref<?x?xf32, strided<[?, ?], offset: ?>>, memref<?x?xf32>) -> ()
// CHECK: %[[RT:.*]] = bufferization.to_tensor %[[R]] restrict writable : memref<16x16xf32> to tensor<16x16xf32>
// CHECK: %[[W:.*]] = arith.addf %[[RT]], %[[RT]]
// CHECK: return %[[W]], %[[N]], %[[V]]
// The exchange reads the first sum(counts) rows of its input (counts:
// argument 1), the wait none (it checks the input's address): what the
// live-rows analysis of -convert-moe-to-linalg reads.
// CHECK: func.func private @moert_all_to_all_start_f32(memref<?x?xf32> {moe.rows_counted_by = 1 : i64}, memref<?xi32>, memref<?x?xf32>, memref<?xi32>, i64, i64, i64) -> i64 attributes {llvm.emit_c_interface}
// CHECK: func.func private @moert_all_to_all_wait_f32(i64, memref<?x?xf32, strided<[?, ?], offset: ?>> {moe.rows_unread}, memref<?x?xf32>) attributes {llvm.emit_c_interface}
shard.grid @ep(shape = 2)
func.func @overlap(%x: tensor<8x16xf32>, %c: tensor<4xi32>, %z: tensor<32xf32>)
    -> (tensor<16x16xf32>, tensor<4xi32>, tensor<32xf32>) {
  %u = arith.addf %z, %z : tensor<32xf32>
  %r, %rc = moe.all_to_all %x, %c on @ep
      : tensor<8x16xf32>, tensor<4xi32> -> tensor<16x16xf32>, tensor<4xi32>
  %n = arith.addi %rc, %rc : tensor<4xi32>
  %v = arith.mulf %u, %u : tensor<32xf32>
  %w = arith.addf %r, %r : tensor<16x16xf32>
  return %w, %n, %v : tensor<16x16xf32>, tensor<4xi32>, tensor<32xf32>
}

// -----

// Rows used only inside a loop: the wait goes before the loop. Rows nobody
// reads: the wait goes before the return (the exchange still completes).
// Both start at the top, in program order.
// CHECK-LABEL: func.func @nested
// CHECK: %[[H:.*]] = call @moert_all_to_all_start_f32(
// CHECK: %[[H2:.*]] = call @moert_all_to_all_start_f32(
// CHECK: call @moert_all_to_all_wait_f32(%[[H]],
// CHECK-NEXT: bufferization.to_tensor
// CHECK-NEXT: scf.for
// CHECK: call @moert_all_to_all_wait_f32(%[[H2]],
// CHECK-NEXT: bufferization.to_tensor
// CHECK-NEXT: return
shard.grid @ep(shape = 2)
func.func @nested(%x: tensor<8x16xf32>, %c: tensor<4xi32>, %acc: tensor<16x16xf32>) -> tensor<16x16xf32> {
  %r, %rc = moe.all_to_all %x, %c on @ep
      : tensor<8x16xf32>, tensor<4xi32> -> tensor<16x16xf32>, tensor<4xi32>
  %unused, %urc = moe.all_to_all %x, %c on @ep
      : tensor<8x16xf32>, tensor<4xi32> -> tensor<16x16xf32>, tensor<4xi32>
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c3 = arith.constant 3 : index
  %s = scf.for %i = %c0 to %c3 step %c1 iter_args(%a = %acc) -> tensor<16x16xf32> {
    %n = arith.addf %a, %r : tensor<16x16xf32>
    scf.yield %n : tensor<16x16xf32>
  }
  return %s : tensor<16x16xf32>
}

// -----

// MX rows: the data and the scales are two exchanges with the same counts
// (8-bit rows moved as bytes), both started where the rows are made, and
// put back together where the received rows are first read, after the
// unrelated %v: the rows still travel meanwhile.
// CHECK-LABEL: func.func @mx_rows
// CHECK-SAME: (%[[X:.*]]: !moe.mx<8x64xf8E4M3FN, axis = 1>, %[[C:.*]]: tensor<4xi32>
// CHECK: %[[D:.*]], %[[S:.*]] = moe.mx_unpack %[[X]] : !moe.mx<8x64xf8E4M3FN, axis = 1> -> tensor<8x64xf8E4M3FN>, tensor<8x2xf8E8M0FNU>
// CHECK: %[[HD:.*]] = call @moert_all_to_all_start_f8e4m3fn(
// CHECK: %[[HS:.*]] = call @moert_all_to_all_start_f8e8m0fnu(
// CHECK: arith.mulf
// CHECK: call @moert_all_to_all_wait_f8e4m3fn(%[[HD]],
// CHECK: %[[RD:.*]] = bufferization.to_tensor {{.*}} : memref<16x64xf8E4M3FN> to tensor<16x64xf8E4M3FN>
// CHECK: call @moert_all_to_all_wait_f8e8m0fnu(%[[HS]],
// CHECK: %[[RS:.*]] = bufferization.to_tensor {{.*}} : memref<16x2xf8E8M0FNU> to tensor<16x2xf8E8M0FNU>
// CHECK: %[[R:.*]] = moe.mx_pack %[[RD]], %[[RS]] : tensor<16x64xf8E4M3FN>, tensor<16x2xf8E8M0FNU> -> !moe.mx<16x64xf8E4M3FN, axis = 1>
// CHECK: moe.dequantize %[[R]]
// CHECK: func.func private @moert_all_to_all_start_f8e4m3fn(memref<?x?xf8E4M3FN> {moe.rows_counted_by = 1 : i64}, memref<?xi32>, memref<?x?xf8E4M3FN>, memref<?xi32>, i64, i64, i64) -> i64
// CHECK: func.func private @moert_all_to_all_start_f8e8m0fnu(memref<?x?xf8E8M0FNU> {moe.rows_counted_by = 1 : i64}, memref<?xi32>, memref<?x?xf8E8M0FNU>, memref<?xi32>, i64, i64, i64) -> i64
shard.grid @ep(shape = 2)
func.func @mx_rows(%x: !moe.mx<8x64xf8E4M3FN, axis = 1>, %c: tensor<4xi32>, %z: tensor<32xf32>)
    -> (tensor<16x64xf32>, tensor<4xi32>, tensor<32xf32>) {
  %r, %rc = moe.all_to_all %x, %c on @ep
      : !moe.mx<8x64xf8E4M3FN, axis = 1>, tensor<4xi32> -> !moe.mx<16x64xf8E4M3FN, axis = 1>, tensor<4xi32>
  %v = arith.mulf %z, %z : tensor<32xf32>
  %w = moe.dequantize %r : !moe.mx<16x64xf8E4M3FN, axis = 1> -> tensor<16x64xf32>
  return %w, %rc, %v : tensor<16x64xf32>, tensor<4xi32>, tensor<32xf32>
}

// -----

// Sums too: each starts as soon as its input is computed and the
// collectives before it in program order have started (%sb's input is ready
// first, but its sum starts after %sa's, which comes first), and is waited
// for before its first reader. The wait reads the flattened input again, as
// an exchange's does.
// CHECK-LABEL: func.func @sums
// CHECK: arith.mulf %{{.*}}, %{{.*}} : tensor<4x8xf32>
// CHECK: %[[GA:.*]] = arith.addf %{{.*}}, %{{.*}} : tensor<4x8xf32>
// CHECK: tensor.collapse_shape %[[GA]]
// CHECK: %[[HA:.*]] = call @moert_all_reduce_sum_start_f32(
// CHECK: %[[FB:.*]] = tensor.collapse_shape
// CHECK: %[[HB:.*]] = call @moert_all_reduce_sum_start_f32(%{{.*}}, %[[OB:.*]], %{{.*}}, %{{.*}}, %{{.*}}) : (memref<?xf32>, memref<?xf32>, i64, i64, i64) -> i64
// CHECK: arith.subf
// CHECK: %[[AGAIN:.*]] = bufferization.to_buffer %[[FB]] read_only : tensor<32xf32> to memref<32xf32, strided<[?], offset: ?>>
// CHECK: %[[AD:.*]] = memref.cast %[[AGAIN]] : memref<32xf32, strided<[?], offset: ?>> to memref<?xf32, strided<[?], offset: ?>>
// CHECK: call @moert_all_reduce_sum_wait_f32(%[[HB]], %[[AD]], %[[OB]]) : (i64, memref<?xf32, strided<[?], offset: ?>>, memref<?xf32>) -> ()
// CHECK: tensor.expand_shape
// CHECK: arith.mulf
// CHECK: call @moert_all_reduce_sum_wait_f32(%[[HA]],
// CHECK: return
// CHECK: func.func private @moert_all_reduce_sum_wait_f32(i64, memref<?xf32, strided<[?], offset: ?>>, memref<?xf32>) attributes {llvm.emit_c_interface}
shard.grid @ep(shape = 2)
func.func @sums(%x: tensor<4x8xf32>, %y: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  %gb = arith.mulf %y, %y : tensor<4x8xf32>
  %ga = arith.addf %x, %x : tensor<4x8xf32>
  %u = arith.subf %x, %y : tensor<4x8xf32>
  %sa = shard.all_reduce %ga on @ep grid_axes = [0] : tensor<4x8xf32> -> tensor<4x8xf32>
  %sb = shard.all_reduce %gb on @ep grid_axes = [0] : tensor<4x8xf32> -> tensor<4x8xf32>
  %w = arith.mulf %sb, %u : tensor<4x8xf32>
  return %sa, %w : tensor<4x8xf32>, tensor<4x8xf32>
}
