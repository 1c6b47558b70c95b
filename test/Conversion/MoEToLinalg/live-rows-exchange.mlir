// RUN: moe-opt %s -split-input-file --convert-moe-to-runtime --convert-moe-to-linalg=parallel=true | FileCheck %s

// Rows an exchange sends back are its first sum(counts): the combine that
// produces them computes only those tokens (the return path of an
// expert-parallel layer, rows in received order).
shard.grid @ep(shape = 2)
func.func @return_rows(%y: tensor<16x32xf32>, %w: tensor<16x1xf32>, %p: tensor<16x1xi32>,
                       %c: tensor<4xi32>) -> tensor<16x32xf32> {
  %r = moe.combine %y, %w, %p : tensor<16x32xf32>, tensor<16x1xf32>, tensor<16x1xi32> -> tensor<16x32xf32>
  %back, %rc = moe.all_to_all %r, %c on @ep grid_axes = [0]
      : tensor<16x32xf32>, tensor<4xi32> -> tensor<16x32xf32>, tensor<4xi32>
  return %back : tensor<16x32xf32>
}
// CHECK-LABEL: func.func @return_rows(
// CHECK: %[[SUM:.*]] = linalg.generic {{.*}}iterator_types = ["reduction"]} ins(%arg3 : tensor<4xi32>) outs(%{{.*}} : tensor<i32>)
// CHECK: %[[S:.*]] = tensor.extract %[[SUM]][] : tensor<i32>
// CHECK: %[[N:.*]] = arith.minsi %{{.*}}, %c16{{.*}} : index
// CHECK: %[[ROWS:.*]] = bufferization.alloc_tensor() : tensor<16x32xf32>
// CHECK: %[[LIVE:.*]] = tensor.extract_slice %[[ROWS]][0, 0] [%[[N]], 32] [1, 1]
// CHECK: %[[G:.*]] = linalg.generic {{.*}} outs(%[[LIVE]] : tensor<?x32xf32>)
// CHECK: %[[R:.*]] = tensor.insert_slice %[[G]] into %[[ROWS]][0, 0] [%[[N]], 32] [1, 1]
// CHECK: bufferization.to_buffer %[[R]]
// CHECK: call @moert_all_to_all_start_f32(
// The analysis' argument attributes are gone once it ran.
// CHECK: func.func private @moert_all_to_all_start_f32(memref<?x?xf32>, memref<?xi32>

// -----

// An expert-parallel layer's experts on the rows where they arrived
// (slot-major by local expert, groups from moe.slot_offsets without
// padding): the SwiGLU between its GEMMs computes only the rows of the
// groups, sum(recv_counts) of them, the bound the exchange back shares.
shard.grid @ep2(shape = 2)
func.func @slot_groups(%x: tensor<8x32xf32>, %c: tensor<4xi32>, %w1: tensor<2x32x64xf32>,
                       %w2: tensor<2x32x32xf32>) -> tensor<8x32xf32> {
  %r, %rc = moe.all_to_all %x, %c on @ep2 slot_major_result
      : tensor<8x32xf32>, tensor<4xi32> -> tensor<16x32xf32>, tensor<4xi32>
  %o = moe.slot_offsets %rc : tensor<4xi32> -> tensor<3xi32>
  %h = moe.grouped_matmul %r, %w1, %o : tensor<16x32xf32>, tensor<2x32x64xf32>, tensor<3xi32> -> tensor<16x64xf32>
  %a = moe.swiglu %h : tensor<16x64xf32> -> tensor<16x32xf32>
  %y = moe.grouped_matmul %a, %w2, %o : tensor<16x32xf32>, tensor<2x32x32xf32>, tensor<3xi32> -> tensor<16x32xf32>
  %back, %bc = moe.all_to_all %y, %rc on @ep2 slot_major_input
      : tensor<16x32xf32>, tensor<4xi32> -> tensor<8x32xf32>, tensor<4xi32>
  return %back : tensor<8x32xf32>
}
// CHECK-LABEL: func.func @slot_groups(
// CHECK: call @moert_all_to_all_slots_start_f32(
// CHECK: %[[RC:.*]] = bufferization.to_tensor %{{.*}} : memref<4xi32> to tensor<4xi32>
// CHECK: %[[SUM:.*]] = linalg.generic {{.*}}iterator_types = ["reduction"]} ins(%[[RC]] : tensor<4xi32>) outs(%{{.*}} : tensor<i32>)
// CHECK: %[[S:.*]] = tensor.extract %[[SUM]][] : tensor<i32>
// CHECK: %[[N:.*]] = arith.minsi %{{.*}}, %c16{{.*}} : index
// CHECK: %[[ROWS:.*]] = bufferization.alloc_tensor() : tensor<16x32xf32>
// CHECK: tensor.extract_slice %[[ROWS]][0, 0] [%[[N]], 32] [1, 1]
// CHECK: call @moert_all_to_all_slots_start_f32(

// -----

// The same with groups padded to 4 rows: the exchange back reads the rows
// of the padded groups, offsets[S] of moe.slot_offsets (its last entry), the
// bound the SwiGLU shares.
shard.grid @ep3(shape = 2)
func.func @padded_slot_groups(%x: tensor<8x32xf32>, %c: tensor<4xi32>, %w1: tensor<2x32x64xf32>,
                              %w2: tensor<2x32x32xf32>) -> tensor<8x32xf32> {
  %r, %rc = moe.all_to_all %x, %c on @ep3 slot_major_result pad_to(4)
      : tensor<8x32xf32>, tensor<4xi32> -> tensor<24x32xf32>, tensor<4xi32>
  %o = moe.slot_offsets %rc pad_to(4) : tensor<4xi32> -> tensor<3xi32>
  %h = moe.grouped_matmul %r, %w1, %o : tensor<24x32xf32>, tensor<2x32x64xf32>, tensor<3xi32> -> tensor<24x64xf32>
  %a = moe.swiglu %h : tensor<24x64xf32> -> tensor<24x32xf32>
  %y = moe.grouped_matmul %a, %w2, %o : tensor<24x32xf32>, tensor<2x32x32xf32>, tensor<3xi32> -> tensor<24x32xf32>
  %back, %bc = moe.all_to_all %y, %rc on @ep3 slot_major_input pad_to(4)
      : tensor<24x32xf32>, tensor<4xi32> -> tensor<8x32xf32>, tensor<4xi32>
  return %back : tensor<8x32xf32>
}
// CHECK-LABEL: func.func @padded_slot_groups(
// CHECK: %[[OFF:.*]] = linalg.generic {{.*}} outs(%{{.*}} : tensor<3xi32>)
// CHECK: %[[LAST:.*]] = tensor.extract %[[OFF]][%c2{{.*}}] : tensor<3xi32>
// CHECK: %[[N:.*]] = arith.minsi %{{.*}}, %c24{{.*}} : index
// CHECK: %[[ROWS:.*]] = bufferization.alloc_tensor() : tensor<24x32xf32>
// CHECK: tensor.extract_slice %[[ROWS]][0, 0] [%[[N]], 32] [1, 1]
// CHECK: call @moert_all_to_all_slots_start_f32(
