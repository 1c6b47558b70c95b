// RUN: not moe-opt %s --moe-expert-parallel=ep-size=3 2>&1 | FileCheck %s
// RUN: not moe-opt %s --moe-expert-parallel=ep-size=0 2>&1 | FileCheck %s --check-prefix=ZERO

// CHECK: expert-parallel-invalid.mlir:[[@LINE+4]]:{{[0-9]+}}: error: moe-expert-parallel: the 8 experts do not divide evenly over ep-size=3
// ZERO: error: moe-expert-parallel: ep-size must be at least 1, got 0
func.func @layer(%x: tensor<8x32xf32>, %idx: tensor<8x1xi32>, %w: tensor<8x32x32xf32>)
    -> tensor<8x32xf32> {
  %s, %o, %c, %p = moe.dispatch %x, %idx experts(8)
      : tensor<8x32xf32>, tensor<8x1xi32> -> tensor<8x32xf32>, tensor<9xi32>, tensor<8xi32>, tensor<8x1xi32>
  %y = moe.grouped_matmul %s, %w, %o : tensor<8x32xf32>, tensor<8x32x32xf32>, tensor<9xi32> -> tensor<8x32xf32>
  %ones = arith.constant dense<1.0> : tensor<8x1xf32>
  %out = moe.combine %y, %ones, %p : tensor<8x32xf32>, tensor<8x1xf32>, tensor<8x1xi32> -> tensor<8x32xf32>
  return %out : tensor<8x32xf32>
}
