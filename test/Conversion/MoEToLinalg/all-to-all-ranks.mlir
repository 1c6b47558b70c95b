// RUN: not moe-opt %s -convert-moe-to-linalg 2>&1 | FileCheck %s

// Exchanging rows between two ranks needs the communication runtime; the
// reference lowering says so instead of miscompiling.
shard.grid @ep(shape = 2)
func.func @exchange(%x: tensor<8x16xbf16>, %c: tensor<2xi32>) -> (tensor<8x16xbf16>, tensor<2xi32>) {
  // CHECK: all-to-all-ranks.mlir:[[@LINE+1]]:{{[0-9]+}}: error: 'moe.all_to_all' op exchanges rows between several ranks
  %r, %rc = moe.all_to_all %x, %c on @ep
      : tensor<8x16xbf16>, tensor<2xi32> -> tensor<8x16xbf16>, tensor<2xi32>
  return %r, %rc : tensor<8x16xbf16>, tensor<2xi32>
}
