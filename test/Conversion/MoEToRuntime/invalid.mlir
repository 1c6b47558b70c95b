// RUN: moe-opt %s -split-input-file -convert-moe-to-runtime -verify-diagnostics

// A group of ranks evenly apart: one axis, or adjacent axes in order.
shard.grid @grid3d(shape = 2x2x2)
func.func @apart_axes(%g: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'shard.all_reduce' op runs over axes [0, 2] of @grid3d; -convert-moe-to-runtime lowers collectives over one axis or adjacent axes, in order (a group of ranks evenly apart)}}
  %s = shard.all_reduce %g on @grid3d grid_axes = [0, 2] : tensor<4xf32> -> tensor<4xf32>
  return %s : tensor<4xf32>
}

// -----

shard.grid @dyn(shape = ?)
func.func @dynamic_grid(%g: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'shard.all_reduce' op runs over @dyn, whose size is dynamic}}
  %s = shard.all_reduce %g on @dyn grid_axes = [0] : tensor<4xf32> -> tensor<4xf32>
  return %s : tensor<4xf32>
}

// -----

shard.grid @ep(shape = 2)
func.func @max(%g: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'shard.all_reduce' op reduces with 'max'; the communication runtime sums}}
  %s = shard.all_reduce %g on @ep grid_axes = [0] reduction = max : tensor<4xf32> -> tensor<4xf32>
  return %s : tensor<4xf32>
}

// -----

shard.grid @ep(shape = 2)
func.func @dynamic_rows(%x: tensor<?x16xf32>, %c: tensor<4xi32>) -> tensor<?x16xf32> {
  // expected-error @+1 {{'moe.all_to_all' op has a dynamic result row count}}
  %r, %rc = moe.all_to_all %x, %c on @ep
      : tensor<?x16xf32>, tensor<4xi32> -> tensor<?x16xf32>, tensor<4xi32>
  return %r : tensor<?x16xf32>
}

// -----

shard.grid @ep(shape = 2)
// expected-error @+1 {{@moert_all_to_all_start_f32 is declared as '(memref<?x?xf32>) -> ()', but the communication runtime's entry point is '(memref<?x?xf32>, memref<?xi32>, memref<?x?xf32>, memref<?xi32>, i64, i64, i64) -> i64'}}
func.func private @moert_all_to_all_start_f32(memref<?x?xf32>)
func.func @clash(%x: tensor<8x16xf32>, %c: tensor<4xi32>) -> tensor<16x16xf32> {
  %r, %rc = moe.all_to_all %x, %c on @ep
      : tensor<8x16xf32>, tensor<4xi32> -> tensor<16x16xf32>, tensor<4xi32>
  return %r : tensor<16x16xf32>
}
