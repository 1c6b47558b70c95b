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

// -----

// Zero-size dimensions have no lowering (a dispatch of rows of hidden size
// 0 once became IR that did not verify): a located error naming the type.
func.func @zero_hidden(%x: tensor<4x0xf32>, %idx: tensor<4x2xi32>) -> tensor<8x0xf32> {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(4) : tensor<4x0xf32>, tensor<4x2xi32> -> tensor<8x0xf32>, tensor<5xi32>, tensor<4xi32>, tensor<4x2xi32>
  // CHECK: bad-input-lowering.mlir:[[@LINE-1]]:{{[0-9]+}}: error: 'moe.dispatch' op has a zero-size dimension in 'tensor<4x0xf32>': the lowering needs every dimension of moe ops' operands and results to be at least 1
  return %s : tensor<8x0xf32>
}

// -----

// No tokens at all.
func.func @zero_tokens(%logits: tensor<0x8xf32>) -> (tensor<0x2xi32>, tensor<0x2xf32>) {
  %i, %w = moe.router %logits top_k(2) softmax : tensor<0x8xf32> -> tensor<0x2xi32>, tensor<0x2xf32>
  // CHECK: bad-input-lowering.mlir:[[@LINE-1]]:{{[0-9]+}}: error: 'moe.router' op has a zero-size dimension in 'tensor<0x8xf32>'
  return %i, %w : tensor<0x2xi32>, tensor<0x2xf32>
}
