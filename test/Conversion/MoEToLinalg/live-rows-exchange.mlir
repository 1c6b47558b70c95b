// RUN: moe-opt %s --convert-moe-to-runtime --convert-moe-to-linalg=parallel=true | FileCheck %s

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
