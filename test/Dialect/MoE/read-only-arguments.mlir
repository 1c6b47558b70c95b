// RUN: moe-opt %s -moe-read-only-arguments | FileCheck %s

// Tensor arguments of defined functions become read-only for bufferization;
// declarations and non-tensor arguments are left alone.
// CHECK-LABEL: func.func @step
// CHECK-SAME: (%{{.*}}: tensor<4xf32> {bufferization.writable = false}, %{{.*}}: index)
func.func @step(%x: tensor<4xf32>, %i: index) -> tensor<4xf32> {
  return %x : tensor<4xf32>
}
// CHECK: func.func private @external(tensor<4xf32>)
// CHECK-NOT: writable
func.func private @external(tensor<4xf32>)
