// RUN: not moe-opt %s --moe-expert-parallel=ep-size=3 2>&1 | FileCheck %s
// RUN: not moe-opt %s --moe-expert-parallel=ep-size=0 2>&1 | FileCheck %s --check-prefix=ZERO
// RUN: not moe-opt %s --moe-expert-parallel="ep-size=2 chunks=3" 2>&1 | FileCheck %s --check-prefix=CHUNKS
// RUN: not moe-opt %s --moe-expert-parallel="ep-size=2 chunks=0" 2>&1 | FileCheck %s --check-prefix=NOCHUNKS
// RUN: not moe-opt %s -split-input-file --moe-expert-parallel="ep-size=2 chunks=2" -o /dev/null 2>&1 | FileCheck %s --check-prefix=CAPACITY

// CHECK: expert-parallel-invalid.mlir:[[@LINE+6]]:{{[0-9]+}}: error: moe-expert-parallel: the 8 experts do not divide evenly over ep-size=3
// ZERO: error: moe-expert-parallel: ep-size must be at least 1, got 0
// CHUNKS: expert-parallel-invalid.mlir:[[@LINE+4]]:{{[0-9]+}}: error: moe-expert-parallel: the 8 tokens do not split into chunks=3 equal parts
// NOCHUNKS: error: moe-expert-parallel: chunks must be at least 1, got 0
func.func @layer(%x: tensor<8x32xf32>, %idx: tensor<8x1xi32>, %w: tensor<8x32x32xf32>)
    -> tensor<8x32xf32> {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(8)
      : tensor<8x32xf32>, tensor<8x1xi32> -> tensor<8x32xf32>, tensor<9xi32>, tensor<8xi32>, tensor<8x1xi32>
  %y = moe.grouped_matmul %s, %w, %o : tensor<8x32xf32>, tensor<8x32x32xf32>, tensor<9xi32> -> tensor<8x32xf32>
  %ones = arith.constant dense<1.0> : tensor<8x1xf32>
  %out = moe.combine %y, %ones, %p : tensor<8x32xf32>, tensor<8x1xf32>, tensor<8x1xi32> -> tensor<8x32xf32>
  return %out : tensor<8x32xf32>
}

// -----

// CAPACITY: expert-parallel-invalid.mlir:[[@LINE+3]]:{{[0-9]+}}: error: moe-expert-parallel: chunks=2 with a capacity factor: capacity would apply to each chunk of tokens instead of the layer (use chunks=1)
func.func @capacity(%x: tensor<8x32xf32>, %idx: tensor<8x1xi32>, %w: tensor<8x32x32xf32>)
    -> tensor<8x32xf32> {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(8) capacity_factor(2.0)
      : tensor<8x32xf32>, tensor<8x1xi32> -> tensor<16x32xf32>, tensor<9xi32>, tensor<8xi32>, tensor<8x1xi32>
  %y = moe.grouped_matmul %s, %w, %o : tensor<16x32xf32>, tensor<8x32x32xf32>, tensor<9xi32> -> tensor<16x32xf32>
  %ones = arith.constant dense<1.0> : tensor<8x1xf32>
  %out = moe.combine %y, %ones, %p : tensor<16x32xf32>, tensor<8x1xf32>, tensor<8x1xi32> -> tensor<8x32xf32>
  return %out : tensor<8x32xf32>
}
