// The reference lowering only handles all_to_all over a group of one rank:
// over several ranks -convert-moe-to-linalg must fail with a located error
// and a non-zero exit, not crash and not emit wrong code.
// RUN: not moe-opt %s -split-input-file --convert-moe-to-linalg 2>&1 | FileCheck %s --implicit-check-not="Stack dump" --implicit-check-not="PLEASE submit"

shard.grid @ep(shape = 2)

func.func @two_ranks(%x: tensor<64x16xbf16>, %c: tensor<4xi32>) -> tensor<128x16xbf16> {
  %r, %rc = moe.all_to_all %x, %c on @ep : tensor<64x16xbf16>, tensor<4xi32> -> tensor<128x16xbf16>, tensor<4xi32>
  // CHECK: bad-input-lowering.mlir:[[@LINE-1]]:{{[0-9]+}}: error: 'moe.all_to_all' op exchanges rows between several ranks; -convert-moe-to-linalg only lowers groups of one rank
  return %r : tensor<128x16xbf16>
}

// -----

// An axis of size 4 out of a 1x4 grid is still several ranks.
shard.grid @dp_ep(shape = 1x4)

func.func @four_ranks_on_axis(%x: tensor<64x16xbf16>, %c: tensor<4xi32>) -> tensor<128x16xbf16> {
  %r, %rc = moe.all_to_all %x, %c on @dp_ep grid_axes = [1] : tensor<64x16xbf16>, tensor<4xi32> -> tensor<128x16xbf16>, tensor<4xi32>
  // CHECK: bad-input-lowering.mlir:[[@LINE-1]]:{{[0-9]+}}: error: 'moe.all_to_all' op exchanges rows between several ranks
  return %r : tensor<128x16xbf16>
}

// -----

// A grid of unknown size may have several ranks.
shard.grid @dyn(shape = ?)

func.func @dynamic_grid(%x: tensor<64x16xbf16>, %c: tensor<4xi32>) -> tensor<64x16xbf16> {
  %r, %rc = moe.all_to_all %x, %c on @dyn : tensor<64x16xbf16>, tensor<4xi32> -> tensor<64x16xbf16>, tensor<4xi32>
  // CHECK: bad-input-lowering.mlir:[[@LINE-1]]:{{[0-9]+}}: error: 'moe.all_to_all' op
  return %r : tensor<64x16xbf16>
}
