// RUN: moe-opt %s -split-input-file -convert-moe-to-runtime -verify-diagnostics

// The runtime has one communicator of all ranks: 1-d grids only.
shard.grid @grid2d(shape = 2x2)
func.func @two_axes(%x: tensor<8x16xf32>, %c: tensor<4xi32>) -> tensor<16x16xf32> {
  // expected-error @+1 {{'moe.all_to_all' op runs over the 2-d grid @grid2d; -convert-moe-to-runtime lowers collectives over 1-d grids only}}
  %r, %rc = moe.all_to_all %x, %c on @grid2d grid_axes = [0]
      : tensor<8x16xf32>, tensor<4xi32> -> tensor<16x16xf32>, tensor<4xi32>
  return %r : tensor<16x16xf32>
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
// expected-error @+1 {{@moert_all_to_all_start_f32 is declared as '(memref<?x?xf32>) -> ()', but the communication runtime's entry point is '(memref<?x?xf32>, memref<?xi32>, memref<?x?xf32>, memref<?xi32>, i64) -> i64'}}
func.func private @moert_all_to_all_start_f32(memref<?x?xf32>)
func.func @clash(%x: tensor<8x16xf32>, %c: tensor<4xi32>) -> tensor<16x16xf32> {
  %r, %rc = moe.all_to_all %x, %c on @ep
      : tensor<8x16xf32>, tensor<4xi32> -> tensor<16x16xf32>, tensor<4xi32>
  return %r : tensor<16x16xf32>
}
